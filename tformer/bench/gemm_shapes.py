"""The GEMM library, decided with numbers: the products of TinyGPT's linear layers timed in NumPy's
BLAS (OpenBLAS, which NumPy's wheels bundle) and in PyTorch's (Intel's MKL in its x86 wheels),
one thread each, at the shapes one training step multiplies.

Per linear layer a step makes three products of the same cost (``tformer.fast.linear``):

    Y = X W   (N × C_in)(C_in × C_out),   dX = dY Wᵀ,   dW = Xᵀ dY      N = B·T

each timed as the kernels run it (the transposes are views, never copies). The sum over a step's
layers, at each library's rate, is what the linear layers would cost with that library and
nothing else changed: the most that changing the library can give.
"""
from tformer.core.timing import best_seconds
from tformer.bench.flops import gemm_flops
from tformer.bench.workload import SIZES, VOCAB


def linear_shapes(size):
    """``[(name, count, C_in, C_out)]``: the linear layers of a step at benchmark size ``size``
    (``count`` layers of each), and ``N = B·T``, the rows of every product."""
    s = SIZES[size]
    C, L = s["d_model"], s["n_layers"]
    layers = [("W_qkv", L, C, 3 * C), ("W_o", L, C, C), ("W_1", L, C, 4 * C), ("W_2", L, 4 * C, C),
              ("W_lm", 1, C, VOCAB)]
    return layers, s["B"] * s["T"]


def worker(library, size, reps=5):
    """Best-of-``reps`` seconds of each product of each layer at ``size``, in ``library``
    (``"numpy"`` or ``"torch"``), one thread; ``{"layers": {name: {fwd, dX, dW}}, "step_s",
    "gflops", "blas"}``. ``step_s`` sums every product of the step (each layer ``count`` times)."""
    import numpy as np
    layers, N = linear_shapes(size)
    rng = np.random.default_rng(0)
    if library == "torch":
        import torch
        torch.set_num_threads(1)
        blas = "PyTorch " + torch.__version__ + ": " + ("MKL" if torch.backends.mkl.is_available()
                                                       else "its bundled BLAS")

        def products(x, W, dy):
            x, W, dy = (torch.from_numpy(a) for a in (x, W, dy))
            y, dx, dW = torch.empty(dy.shape), torch.empty(x.shape), torch.empty(W.shape)
            return dict(fwd=lambda: torch.mm(x, W, out=y), dX=lambda: torch.mm(dy, W.t(), out=dx),
                        dW=lambda: torch.mm(x.t(), dy, out=dW))
    elif library == "numpy":
        from threadpoolctl import threadpool_info, threadpool_limits
        threadpool_limits(1, user_api="blas")
        info = [i for i in threadpool_info() if i["user_api"] == "blas"]
        blas = "NumPy " + np.__version__ + ": " + (f"{info[0]['internal_api']} {info[0]['version']}"
                                                   if info else "unknown BLAS")

        def products(x, W, dy):
            y, dx, dW = np.empty(dy.shape, x.dtype), np.empty_like(x), np.empty_like(W)
            return dict(fwd=lambda: np.matmul(x, W, out=y), dX=lambda: np.matmul(dy, W.T, out=dx),
                        dW=lambda: np.matmul(x.T, dy, out=dW))
    else:
        raise ValueError(f"library: expected 'numpy' or 'torch', got {library!r}")
    out, step_s, step_flops = {}, 0.0, 0
    for name, count, c_in, c_out in layers:
        x = rng.standard_normal((N, c_in), dtype=np.float32)
        W = rng.standard_normal((c_in, c_out), dtype=np.float32)
        dy = rng.standard_normal((N, c_out), dtype=np.float32)
        out[name] = {k: best_seconds(fn, reps) for k, fn in products(x, W, dy).items()}
        step_s += count * sum(out[name].values())
        step_flops += count * 3 * gemm_flops(N, c_in, c_out)
    return dict(layers=out, step_s=step_s, gflops=step_flops / step_s / 1e9, blas=blas)
