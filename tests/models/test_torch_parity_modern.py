"""The modern block's kernels against PyTorch in float64: values and gradients (skipped without torch).

RMSNorm against ``torch.nn.functional.rms_norm``, SwiGLU against ``silu(a) * b``, grouped-query
attention against ``scaled_dot_product_attention(..., enable_gqa=True)``, and RoPE against the
complex-number form of the RoFormer/LLaMA reference code (pairs as complex numbers times e^{iφ}),
each with a random upstream gradient. The claim is 1e-9 relative; the assertions are tighter.
"""
import numpy as np
import pytest

import tformer.nn.functional as F
from tformer.core.gradcheck import rel_error

pytestmark = pytest.mark.torch_parity      # every test here; without torch the module is skipped, and the run fails
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


# --- the whole modern TinyGPT ------------------------------------------------------------------------

def torch_modern_twin(model):
    """TinyGPT with RMSNorm, RoPE, SwiGLU, GQA and tied embeddings, written in PyTorch with the
    weights copied from ``model`` (the tied array once, as ``wte.W``)."""
    from tformer.models.tinygpt import TinyGPT
    assert isinstance(model, TinyGPT)
    cfg = model.config
    C, H, H_kv, Fh = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["d_ff"]
    D = C // H
    P = {name: t(p) for name, p, _ in model._unique_parameters()}

    def norm(x, pre):
        return tF.rms_norm(x, (C,), P[pre + ".gamma"], eps=1e-5)

    def lin(x, pre):
        return x @ P[pre + ".W"] + P[pre + ".b"]

    def forward(tok):
        tok = torch.as_tensor(tok)
        B, T = tok.shape
        x = P["wte.W"][tok]                                                  # (B, T, C), no table
        pos = np.arange(T)
        for i in range(cfg["n_layers"]):
            pre = f"blocks.{i}."
            qkv = lin(norm(x, pre + "ln1"), pre + "attn.qkv")               # (B, T, C + 2 H_kv D)
            q, k, v = qkv.split([C, H_kv * D, H_kv * D], dim=-1)
            q = torch_rope(q.reshape(B, T, H, D).transpose(1, 2), pos, 10000.0)
            k = torch_rope(k.reshape(B, T, H_kv, D).transpose(1, 2), pos, 10000.0)
            v = v.reshape(B, T, H_kv, D).transpose(1, 2)
            y = tF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + lin(y.transpose(1, 2).reshape(B, T, C), pre + "attn.o")
            a, b = lin(norm(x, pre + "ln2"), pre + "ffn.fc1").split([Fh, Fh], dim=-1)
            x = x + lin(tF.silu(a) * b, pre + "ffn.fc2")
        return norm(x, "ln_f") @ P["wte.W"].T + P["lm_head.b"]             # tied head
    return P, forward


def test_modern_tinygpt_logits_and_every_gradient():
    from tformer.models.tinygpt import TinyGPT
    model = TinyGPT(d_model=16, n_heads=4, n_layers=2, max_len=16, d_ff=21, dtype=np.float64, seed=3,
                    norm="rmsnorm", positions="rope", mlp="swiglu", n_kv_heads=2, tie_embeddings=True)
    rng = np.random.default_rng(4)
    for name, p, _ in model._unique_parameters():                          # gains, biases: random too
        p[...] = (1.0 if name.endswith("gamma") else 0.0) + 0.3 * rng.standard_normal(p.shape)
    P, forward = torch_modern_twin(model)
    x, y = rng.integers(0, 256, (3, 9)), rng.integers(0, 256, (3, 9))
    logits = model.forward(x)
    loss, dlogits = F.cross_entropy(logits, y)
    model.zero_grad()
    model.backward(dlogits)
    t_logits = forward(x)
    t_loss = tF.cross_entropy(t_logits.reshape(-1, 256), torch.as_tensor(y).reshape(-1))
    t_loss.backward()
    assert rel_error(logits, t_logits.detach().numpy()) < TOL
    assert abs(loss - t_loss.item()) < 1e-12 * abs(loss)
    assert set(P) == {n for n, _, _ in model._unique_parameters()}
    for name, _, grad in model._unique_parameters():
        assert rel_error(grad, P[name].grad.numpy()) < TOL, name
