"""ReLU² (``kernels.activations.relu2_forward``/``relu2_backward``), derived in SymPy: y = max(0, x)²
as a piecewise function, its derivative 2·max(0, x) by ``sp.diff`` on each piece, continuous at 0
(ReLU's is not), and the kernel equal to both at points on either side of 0. Finite differences,
PyTorch float64 and the fast twin are checked with the other activations (test_functional.py,
test_properties.py, test_torch_parity.py, test_fast_activations.py)."""
import numpy as np
import pytest
import sympy as sp

import tformer.nn.functional as F
from tformer.core.gradcheck import check_kernel
from tformer.kernels.activations import relu2_backward, relu2_forward


def test_relu2_derivative_in_sympy_and_the_kernel_at_its_points():
    x = sp.Symbol("x", real=True)
    y = sp.Piecewise((x**2, x > 0), (0, True))
    dy = sp.piecewise_fold(sp.diff(y, x))
    assert sp.simplify(dy - sp.Piecewise((2 * x, x > 0), (0, True))) == 0
    e = sp.Symbol("e", positive=True)                 # x = ±e, e -> 0+: each side of 0
    assert sp.limit(dy.subs(x, e), e, 0) == 0 and dy.subs(x, -e) == 0   # continuous at 0
    relu_d = sp.diff(sp.Piecewise((x, x > 0), (0, True)), x)
    assert relu_d.subs(x, e) == 1 and relu_d.subs(x, -e) == 0          # ReLU's jumps
    points = [sp.Rational(-3, 2), sp.Rational(-1, 7), 0, sp.Rational(1, 9), sp.Rational(5, 2)]
    xs = np.array([float(p) for p in points])
    out, cache = relu2_forward(xs)
    g = np.array([0.3, -1.2, 0.7, 2.0, -0.4])
    dx = relu2_backward(g, cache)
    for i, p in enumerate(points):
        assert out[i] == float(y.subs(x, p))
        assert abs(dx[i] - g[i] * float(dy.subs(x, p))) <= 1e-16 * abs(dx[i])


def test_relu2_keeps_the_dtype():
    for dtype in (np.float32, np.float64):
        x = np.linspace(-2, 2, 9).astype(dtype)
        y, r = relu2_forward(x)
        assert y.dtype == dtype and relu2_backward(np.ones_like(x), r).dtype == dtype


@pytest.mark.parametrize("kernels", ["reference", "checked"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relu2_central_differences_float64(kernels, seed):
    """Central differences (h = 1e-6) of L = ⟨g, y⟩, g a random upstream gradient,
    against the kernel's dx: ≤ 1e-8 relative (measured 4e-10 to 9e-10 on these seeds:
    y = x² is a quadratic, so the stencil is exact but for rounding). The points keep
    1e-3 from the kink at 0, which the stencil must not straddle."""
    fwd, bwd = {"reference": (relu2_forward, relu2_backward),
                "checked": (F.relu2_forward, F.relu2_backward)}[kernels]
    x = 2 * np.random.default_rng([seed, 54]).standard_normal((4, 6, 7))
    x[np.abs(x) < 1e-3] = 0.5
    assert (x > 0).any() and (x < 0).any()
    assert check_kernel(fwd, bwd, [x], seed=seed) <= 1e-8
