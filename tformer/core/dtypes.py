"""The floating-point formats tformer computes in, and the one product helper that low precision needs.

float32 (the default) and float64 (gradient checks) are NumPy's own. float16 (IEEE half: 5 exponent
bits, 10 fraction bits) is NumPy's too, and bfloat16 (8 exponent bits, 7 fraction bits: float32's
range at a quarter of its precision) comes from the ``ml_dtypes`` package. These two are *storage*
formats here, as on the hardware that trains in them: values are kept in them, and each arithmetic
step that sums many terms happens in float32.

NumPy has no float16 or bfloat16 BLAS: ``np.matmul`` on float16 falls back to a plain C loop
(measured: about 10× slower than float32 BLAS at 256×128×512), and on bfloat16 it returns float32.
``matmul`` below does what a tensor core does (low-precision inputs, float32 accumulator,
rounded result): it upcasts the two operands to float32, runs one float32 BLAS product, and rounds
the result back to the operands' format. It is the only thing the product kernels learn about low
precision. Reductions that would lose too much in 11 (or 8) significant bits run their float32
version on upcast inputs (softmax, LayerNorm, the losses, the embedding's scatter-add).
"""
import ml_dtypes
import numpy as np

float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
LOW = (float16, bfloat16)                      # computed through float32
FLOATS = (np.dtype(np.float32), np.dtype(np.float64), *LOW)


def is_low(dtype):
    """True for float16 and bfloat16."""
    return np.dtype(dtype) in LOW


def compute_dtype(dtype):
    """The format arithmetic on ``dtype`` data runs in: float32 for float16/bfloat16, else ``dtype``."""
    return np.dtype(np.float32) if is_low(dtype) else np.dtype(dtype)


def finfo(dtype):
    """``np.finfo`` that also knows bfloat16 (``ml_dtypes.finfo``): max, smallest_normal, eps, ..."""
    return ml_dtypes.finfo(dtype) if np.dtype(dtype) == bfloat16 else np.finfo(dtype)


def matmul(a, b, out=None):
    """C = A B, with a float32 accumulator when A and B are float16/bfloat16.

    float32 and float64: exactly ``np.matmul(a, b, out=out)``. float16/bfloat16: ``a`` and ``b`` are
    upcast to float32 (exactly: every low-precision value is a float32 value), multiplied by float32
    BLAS, and the result is rounded once to ``a``'s format, or written into ``out`` (an output of
    float32 keeps the accumulator's value). Shapes as ``np.matmul``.
    """
    if a.dtype not in LOW:
        return np.matmul(a, b, out=out)
    c = np.matmul(a.astype(np.float32), b.astype(np.float32))
    if out is None:
        return c.astype(a.dtype)
    np.copyto(out, c, casting="same_kind")
    return out
