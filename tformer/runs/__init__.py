"""Command-line runs, one module per system: each defines ``add_arguments(parser)`` and ``main(args)``."""
