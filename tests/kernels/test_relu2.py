"""ReLU² (``kernels.activations.relu2_forward``/``relu2_backward``), derived in SymPy: y = max(0, x)²
as a piecewise function, its derivative 2·max(0, x) by ``sp.diff`` on each piece, continuous at 0
(ReLU's is not), and the kernel equal to both at points on either side of 0. Finite differences,
PyTorch float64 and the fast twin are checked with the other activations (test_functional.py,
test_properties.py, test_torch_parity.py, test_fast_activations.py)."""
import numpy as np
import sympy as sp

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
