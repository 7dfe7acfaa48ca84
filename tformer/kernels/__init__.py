"""The kernels, one equation per file; ``tformer.functional`` gathers them into one namespace."""
