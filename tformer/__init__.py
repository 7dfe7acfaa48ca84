"""tformer: the Transformer, derived and built by hand.

The package is a stack of folders, bottom to top, each importing only from itself and the folders
below: core, kernels, fast, nn, models, training, decoding, data, tuning, runs, bench,
experiments, and ``__main__`` (``python -m tformer``). The order is written once, in
``tests/import_layers.py`` (``tests/house/test_imports.py`` enforces it); README.md shows the map, each
folder described by its own ``__init__.py``.
"""
