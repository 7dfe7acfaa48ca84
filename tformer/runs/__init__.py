"""Command-line runs, one module per source system: each defines ``add_arguments(parser)`` and ``main(args)``."""
