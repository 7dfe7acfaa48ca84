"""The modern block's kernels against PyTorch in float64: values and gradients (skipped without torch).

RMSNorm against ``torch.nn.functional.rms_norm``, SwiGLU against ``silu(a) * b``, grouped-query
attention against ``scaled_dot_product_attention(..., enable_gqa=True)``, and RoPE against the
complex-number form of the RoFormer/LLaMA reference code (pairs as complex numbers times e^{iφ}),
each with a random upstream gradient. The claim is 1e-9 relative; the assertions are tighter.
"""
import numpy as np
import pytest

import tformer.functional as F
from tformer.gradcheck import rel_error

torch = pytest.importorskip("torch")
tF = torch.nn.functional
TOL = 1e-12                  # max |ours − torch| / max |torch|, per array


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def t(a):
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


def run_torch(fn, arrays, g):
    ts = [t(a) for a in arrays]
    y = fn(*ts)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), [x.grad.numpy() for x in ts]


def assert_parity(ours, theirs):
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert rel_error(a, b) < TOL, rel_error(a, b)


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rmsnorm(eps):
    x, gamma, g = 2 + randn(2, 3, 16, seed=1), randn(16, seed=2), randn(2, 3, 16, seed=3)
    y, cache = F.rmsnorm_forward(x, gamma, eps)
    ty, tgrads = run_torch(lambda x, w: tF.rms_norm(x, (16,), w, eps), [x, gamma], g)
    assert_parity([y, *F.rmsnorm_backward(g, cache)], [ty, *tgrads])


def test_swiglu():
    a, b, g = 3 * randn(2, 5, 7, seed=4), randn(2, 5, 7, seed=5), randn(2, 5, 7, seed=6)
    y, cache = F.swiglu_forward(a, b)
    ty, tgrads = run_torch(lambda a, b: tF.silu(a) * b, [a, b], g)
    assert_parity([y, *F.swiglu_backward(g, cache)], [ty, *tgrads])


def torch_rope(x, positions, base):
    """LLaMA's ``apply_rotary_emb``: channel pairs (2i, 2i+1) as complex numbers, times e^{i p θ_i}."""
    D = x.shape[-1]
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    freqs = torch.polar(torch.ones(len(positions), D // 2, dtype=torch.float64),
                        torch.outer(torch.as_tensor(positions, dtype=torch.float64), theta))
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], D // 2, 2))
    return torch.view_as_real(z * freqs).flatten(-2)


@pytest.mark.parametrize("positions,base", [(None, 10000.0), (9, 10000.0), (np.array([4, 0, 31, 2, 7]), 500.0)])
def test_rope(positions, base):
    x, g = randn(2, 3, 5, 8, seed=7), randn(2, 3, 5, 8, seed=8)
    y, cache = F.rope_forward(x, positions, base)
    pos = np.arange(5) if positions is None else (np.arange(9, 14) if np.isscalar(positions) else positions)
    ty, (tdx,) = run_torch(lambda x: torch_rope(x, pos, base), [x], g)
    assert_parity([y, F.rope_backward(g, cache)], [ty, tdx])


@pytest.mark.parametrize("H_kv", [1, 2, 6])
@pytest.mark.parametrize("mask_kind", [None, "causal", "padding"])
def test_grouped_query_attention(H_kv, mask_kind):
    q, k, v = randn(2, 6, 5, 4, seed=9), randn(2, H_kv, 5, 4, seed=10), randn(2, H_kv, 5, 3, seed=11)
    g = randn(2, 6, 5, 3, seed=12)
    mask = F.padding_mask(np.array([[7, 2, 3, 0, 0], [1, 1, 1, 1, 0]])) if mask_kind == "padding" else None
    causal = mask_kind == "causal"
    y, cache = F.attention_forward(q, k, v, mask, is_causal=causal)
    tmask = None if mask is None else torch.tensor(mask)
    ty, tgrads = run_torch(lambda q, k, v: tF.scaled_dot_product_attention(
        q, k, v, attn_mask=tmask, is_causal=causal, enable_gqa=True), [q, k, v], g)
    assert_parity([y, *F.attention_backward(g, cache)], [ty, *tgrads])
