"""The optimizers' update equations (``_update``, ``_moments``: the listings of the optimizer chapter)
equal their in-place versions (``_update_inplace``, ``_moments_inplace``: scratch buffers, no temporaries,
what ``step()`` runs on contiguous parameters) bit for bit, in float32 and float64."""
import numpy as np
import pytest

from tformer.training.optim import SGD, Adam, AdamW

CONFIGS = [
    (SGD, {"lr": 0.1}), (SGD, {"lr": 0.1, "momentum": 0.9}), (SGD, {"lr": 0.1, "weight_decay": 0.01}),
    (SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    (Adam, {"lr": 1e-2}),
    (AdamW, {"lr": 1e-2, "weight_decay": 0.1}), (AdamW, {"lr": 1e-2, "weight_decay": 0.0}),
    (AdamW, {"lr": 1e-2, "weight_decay": 0.1, "eps_inside_sqrt": True}),
    (AdamW, {"lr": 1e-2, "weight_decay": 0.0, "eps_inside_sqrt": True}),
]


class _One:
    def __init__(self, dtype, shape=(6, 5)):
        rng = np.random.default_rng(0)
        self.p, self.g = (rng.standard_normal(shape).astype(dtype) for _ in range(2))

    def named_parameters(self):
        yield "p", self.p, self.g


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls, kw", CONFIGS)
def test_the_update_equation_equals_the_inplace_update_bit_for_bit(dtype, cls, kw):
    a, b = _One(dtype), _One(dtype)
    opt_a, opt_b = cls(a, **kw), cls(b, **kw)
    rng = np.random.default_rng(1)
    for _ in range(3):
        g = rng.standard_normal(a.g.shape).astype(dtype)
        a.g[...] = b.g[...] = g
        opt_a.t += 1
        opt_b.t += 1
        opt_a._update(a.p, a.g, opt_a.state["p"])
        opt_b._update_inplace(b.p, b.g, opt_b.state["p"])
        assert a.p.dtype == dtype and np.array_equal(a.p, b.p)
        for k in opt_a.state["p"]:
            assert np.array_equal(opt_a.state["p"][k], opt_b.state["p"][k])
        assert np.array_equal(a.g, g)                      # the gradient is never modified


@pytest.mark.parametrize("cls, kw", CONFIGS)
def test_step_on_a_parameter_that_does_not_flatten_takes_the_equation_and_agrees(cls, kw):
    flat, strided = _One(np.float64), _One(np.float64, shape=(5, 6))
    strided.p, strided.g = strided.p.T, strided.g.T      # (6, 5), not C-contiguous
    strided.p[...], strided.g[...] = flat.p, flat.g
    opt_flat, opt_strided = cls(flat, **kw), cls(strided, **kw)
    for _ in range(3):
        opt_flat.step()
        opt_strided.step()
    assert np.array_equal(flat.p, strided.p)
