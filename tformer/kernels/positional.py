"""Fixed sinusoidal positional encoding (the complete Transformer and the post-LN encoder)."""
import numpy as np


def sinusoidal_positions(T, C, dtype=np.float32):
    """PE[pos, 2i] = sin(pos / 10000^{2i/C}),  PE[pos, 2i+1] = cos(pos / 10000^{2i/C}).

    Shapes: -> ``(T, C)``. Computed in float64, then cast. It is a constant: the model adds it to
    its input and nothing is learned, so its backward is the identity on the input and there is no
    parameter gradient.
    """
    if T < 1 or C < 2 or C % 2:
        raise ValueError(f"C: expected an even model width ≥ 2 and T ≥ 1, got T={T}, C={C}")
    pos = np.arange(T, dtype=np.float64)[:, None]                # (T, 1)
    two_i = np.arange(0, C, 2, dtype=np.float64)[None, :]        # (1, C/2)
    angle = pos / np.power(10000.0, two_i / C)                   # (T, C/2)
    pe = np.empty((T, C), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe.astype(dtype)
