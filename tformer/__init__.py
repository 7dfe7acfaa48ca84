"""tformer: the Transformer, derived and built by hand."""
