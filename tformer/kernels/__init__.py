"""The kernels, one equation per file; ``tformer.nn.functional`` gathers them into one namespace."""
