"""benchmarks/: FLOP counts, the PyTorch twin of TinyGPT, the profiler, the driver's bookkeeping, and
the fast paths of the shared kernels that the benchmark work introduced. No timing assertions."""
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tformer import functional as F
from tformer.attention import MultiHeadAttention
from tformer.gradcheck import check_module, rel_error
from tformer.kernels.softmax import _softmax_inplace
from tformer.models.tinygpt import TinyGPT
from tformer.optim import Adam, AdamW

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name):
    """benchmarks/<name>.py by path: benchmarks/ is not a package and stays off sys.path."""
    key = f"tformer_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


TINY = dict(d_model=4, n_heads=2, n_layers=1, vocab_size=5, d_ff=8)


# --- flops.py ----------------------------------------------------------------------------------

def test_flops_of_a_tiny_config_equal_a_hand_count():
    flops = _load("flops")
    B, T, C, F_, V = 2, 3, 4, 8, 5
    # by hand: N_tok = 6; weights in products 4C² + 2CF + CV = 64 + 64 + 20 = 148; 6·6·148 = 5328;
    # attention 12·L·B·T²·C = 12·1·2·9·4 = 864.
    assert B * T * 6 * (4 * C * C + 2 * C * F_ + C * V) == 5328
    assert flops.train_step_flops(TINY, B, T) == 5328 + 864
    assert flops.breakdown(TINY, B, T) == {"dense": 5328, "attention": 864, "total": 6192}


def test_flops_formula_equals_the_sum_over_every_matrix_product():
    flops = _load("flops")
    for cfg, B, T in ((TINY, 2, 3), (dict(d_model=64, n_heads=4, n_layers=2, vocab_size=256, d_ff=None), 32, 64),
                      (dict(d_model=512, n_heads=8, n_layers=4, vocab_size=256, d_ff=2048), 8, 256)):
        total = sum(count * flops.gemm_flops(M, K, N) for _, count, M, K, N in flops.matmul_shapes(cfg, B, T))
        assert total == flops.train_step_flops(cfg, B, T)
        assert len(flops.matmul_shapes(cfg, B, T)) == 4 * 3 + 6 + 3     # 4 linears × 3, attention 6, head 3


# --- torch_gpt.py: the PyTorch twin computes what TinyGPT computes --------------------------------

def _tiny_gpt(dtype=np.float64, n_heads=2):
    model = TinyGPT(d_model=8, n_heads=n_heads, n_layers=2, max_len=6, vocab_size=11, seed=3, dtype=dtype)
    rng = np.random.default_rng(1)
    return model, rng.integers(0, 11, (3, 6)), rng.integers(0, 11, (3, 6))


@pytest.mark.torch_parity
@pytest.mark.parametrize("n_heads", [1, 2])
def test_torch_twin_matches_tinygpt_loss_and_every_gradient_float64(n_heads):
    torch = pytest.importorskip("torch")
    tg = _load("torch_gpt")
    model, x, y = _tiny_gpt(n_heads=n_heads)
    tm = tg.from_tinygpt(model)
    logits = model.forward(x)
    loss, dlogits = F.cross_entropy(logits, y)
    model.zero_grad()
    model.backward(dlogits)
    t_logits = tm(torch.from_numpy(x))
    t_loss = torch.nn.functional.cross_entropy(t_logits.reshape(-1, 11), torch.from_numpy(y).reshape(-1))
    t_loss.backward()
    assert rel_error(logits, t_logits.detach().numpy()) < 1e-12
    assert abs(loss - t_loss.item()) < 1e-12
    theirs = tg.grads_as_tformer(tm, 2)
    for name, _, grad in model.named_parameters():
        assert rel_error(grad, theirs[name]) < 1e-10, name


@pytest.mark.torch_parity
def test_torch_twin_after_one_adamw_step_has_the_same_loss_float64():
    torch = pytest.importorskip("torch")
    tg = _load("torch_gpt")
    model, x, y = _tiny_gpt()
    tm = tg.from_tinygpt(model)
    hp = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    opt, t_opt = AdamW(model, **hp), torch.optim.AdamW(tm.parameters(), **hp)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).reshape(-1)
    losses = []
    for _ in range(3):
        model.zero_grad()
        loss, d = F.cross_entropy(model.forward(x), y)
        model.backward(d)
        opt.step()
        t_opt.zero_grad()
        t_loss = torch.nn.functional.cross_entropy(tm(xt).reshape(-1, 11), yt)
        t_loss.backward()
        t_opt.step()
        losses.append((loss, t_loss.item()))
    # (the key bias has an exactly-zero true gradient: Adam turns its rounding noise into ±lr steps
    # of either sign, which change no loss, so losses are compared rather than parameters)
    for a, b in losses:
        assert abs(a - b) < 1e-10 * abs(a)


@pytest.mark.torch_parity
def test_from_tinygpt_rejects_dropout():
    pytest.importorskip("torch")
    tg = _load("torch_gpt")
    with pytest.raises(ValueError, match="dropout"):
        tg.from_tinygpt(TinyGPT(d_model=8, n_heads=2, n_layers=1, max_len=4, dropout=0.1))


# --- profile.py ----------------------------------------------------------------------------------

def test_profile_covers_the_step_and_restores_every_patched_function():
    prof = _load("op_profile")
    from tformer import attention, layers, optim
    before = (F.linear_forward, attention.MultiHeadAttention.backward, layers.Linear.forward,
              optim.Optimizer.step)
    model, x, y = _tiny_gpt(dtype=np.float32)
    rows, total = prof.profile_step(model, AdamW(model), x, y, steps=2, clock="cpu")
    names = {r[0] for r in rows}
    assert {"linear_forward", "linear_backward", "attention_forward", "attention_backward",
            "softmax_inplace", "softmax_backward_inplace",   # inside the attention kernel
            "layernorm_backward", "cross_entropy", "AdamW.step"} <= names
    assert total > 0 and all(r[2] > 0 for r in rows)
    assert abs(sum(r[3] for r in rows) - 1.0) < 1e-9            # self times + untimed rest = the step
    assert after_is(before)
    cats = prof.group(rows)
    assert "linear" in cats and "attention matmuls" in cats


def after_is(before):
    from tformer import attention, layers, optim
    return before == (F.linear_forward, attention.MultiHeadAttention.backward, layers.Linear.forward,
                      optim.Optimizer.step)


# --- run.py bookkeeping -----------------------------------------------------------------------------

def test_run_summarise_and_verdict_report_misses_with_their_size():
    run = _load("run")
    side = dict(times=[0.2, 0.1, 0.3], cpu_times=[0.1] * 3, peak_mb=10.0, loss=5.5, loadavg_1min=[0, 0],
                profile=dict(categories={"linear": 3.0, "gelu": 1.0}))
    s = run.summarise(side, flops=2e9, peak=100.0)
    assert s["median_s"] == 0.2 and s["min_s"] == 0.1
    assert math.isclose(s["gflops"], 10.0) and math.isclose(s["frac_peak"], 0.1)
    fast = dict(s, median_s=0.1)
    results = dict(headline_malloc="default", sizes={
        "small": {"default": dict(tformer=s, torch=fast, ratio=0.5)},
        "large": {"default": dict(tformer=s, torch=s, ratio=1.0)}})
    lines = run.verdict(results)
    assert "small" in lines[0] and "MISSED by 0.500" in lines[0] and "linear 75%" in lines[0]
    assert "met" in lines[1]
    assert "10.0% of the GEMM peak" in lines[2] and "MISSED by 30.0 points" in lines[2]


def test_run_batch_is_next_token_shifted_and_sizes_are_the_issue_s():
    run = _load("run")
    x, y = run._batch(2, 5)
    assert x.shape == y.shape == (2, 5) and np.array_equal(x[:, 1:], y[:, :-1])
    assert run.SIZES["large"] == dict(d_model=512, n_heads=8, n_layers=4, T=256, B=8)
    assert run.SIZES["medium"] == dict(d_model=256, n_heads=8, n_layers=4, T=128, B=16)
    assert run.SIZES["small"] == dict(d_model=64, n_heads=4, n_layers=2, T=64, B=32)


def test_run_rejects_an_unknown_size():
    out = subprocess.run([sys.executable, str(BENCH / "run.py"), "--sizes", "huge"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "--sizes" in out.stderr


# --- the fast paths in the shared kernels ------------------------------------------------------------

def test_tinygpt_gradcheck_float64_through_the_fast_paths():
    for n_heads in (1, 2):
        model, x, y = _tiny_gpt(n_heads=n_heads)
        errs = check_module(model, x, loss=lambda z: F.cross_entropy(z, y), max_entries=30)
        assert max(errs.values()) < 1e-6


@pytest.mark.parametrize("fused", [True, False])
def test_attention_module_gradients_fused_and_unfused(fused):
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention(12, 3, fused_qkv=fused, causal=True, rng=rng, dtype=np.float64)
    errs = check_module(mha, rng.standard_normal((2, 5, 12)))
    assert max(errs.values()) < 1e-7


def test_attention_kernel_matches_the_textbook_formula_with_masks():
    rng = np.random.default_rng(1)
    q, k, v, dy = (rng.standard_normal((2, 3, 5, 4)) for _ in range(4))
    mask = F.causal_mask(5) & np.array([True, True, True, False, True])    # one key masked for all
    y, cache = F.attention_forward(q, k, v, mask, scale=0.3)
    S = np.where(mask, 0.3 * q @ k.swapaxes(-1, -2), -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    assert np.abs(cache[3] - P).max() < 1e-15 and np.abs(y - P @ v).max() < 1e-14
    dP = dy @ v.swapaxes(-1, -2)
    dS = P * (dP - (dP * P).sum(-1, keepdims=True))
    dq, dk, dv = F.attention_backward(dy, cache)
    assert np.abs(dq - 0.3 * dS @ k).max() < 1e-14 and np.abs(dk - 0.3 * dS.swapaxes(-1, -2) @ q).max() < 1e-14
    assert np.abs(dv - P.swapaxes(-1, -2) @ dy).max() < 1e-14


def test_softmax_inplace_equals_softmax_forward_and_keeps_masked_rows_zero():
    x = np.random.default_rng(2).standard_normal((3, 4, 6)).astype(np.float32)
    x[0, 1] = -np.inf                                            # a fully masked row
    x[1, 2, :3] = -np.inf
    ref, _ = F.softmax_forward(x)
    out = _softmax_inplace(x.copy())
    assert np.allclose(out, ref, rtol=1e-6, atol=1e-7)
    assert np.all(out[0, 1] == 0) and np.all(out[1, 2, :3] == 0)
    assert np.allclose(out.sum(-1)[np.arange(3) != 0], 1, atol=1e-6)
    with pytest.raises(ValueError, match="NaN"):
        _softmax_inplace(np.array([[0.0, np.nan]]))


def test_gelu_tanh_form_matches_the_formula_in_float64_and_float32_and_never_warns():
    x = np.linspace(-12, 12, 2001)
    t = np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
    ref = 0.5 * x * (1 + t)
    dref = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x * x)
    for dtype, tol in ((np.float64, 1e-13), (np.float32, 3e-6)):
        y, cache = F.gelu_forward(x.astype(dtype))
        d = F.gelu_backward(np.ones_like(y), cache)
        assert y.dtype == d.dtype == dtype
        assert np.abs(y - ref).max() < tol * 12 and np.abs(d - dref).max() < tol * 12
    with np.errstate(all="raise"):                               # overflow of e^{−2u} is deliberate
        y, _ = F.gelu_forward(np.array([-1e4, -50.0, 50.0, 1e4], np.float32))
    assert np.array_equal(y, np.array([0.0, 0.0, 50.0, 1e4], np.float32))


def test_cross_entropy_one_pass_gradient_matches_the_two_step_formula_with_ignore_index():
    rng = np.random.default_rng(4)
    z = rng.standard_normal((3, 5, 7))
    t = rng.integers(0, 7, (3, 5))
    t[0, :2] = -1
    loss, d = F.cross_entropy(z, t, ignore_index=-1)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    valid = t != -1
    n = valid.sum()
    ref = p.copy()
    ref[valid, t[valid]] -= 1
    ref *= valid[..., None] / n
    assert abs(loss - (-np.log(p[valid, t[valid]])).sum() / n) < 1e-12
    assert np.abs(d - ref).max() < 1e-15


def test_layernorm_row_means_by_blas_handle_3d_and_noncontiguous_input():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 10))[:, ::2]                  # (2, 3, 10), not contiguous
    g, b = rng.standard_normal(10), rng.standard_normal(10)
    y, cache = F.layernorm_forward(x, g, b)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    assert np.abs(y - ((x - mu) / np.sqrt(var + 1e-5) * g + b)).max() < 1e-13
    assert cache[2].shape == cache[3].shape == (2, 3, 1)


def test_adam_scratch_buffers_never_leak_between_parameters_of_different_sizes():
    class Two:
        def __init__(self):
            rng = np.random.default_rng(0)
            self.p = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
            self.g = {k: rng.standard_normal(v.shape) for k, v in self.p.items()}

        def named_parameters(self):
            for k in self.p:
                yield k, self.p[k], self.g[k]

    for cls, kw in ((Adam, {}), (AdamW, {"weight_decay": 0.1})):
        m = Two()
        start = {k: v.copy() for k, v in m.p.items()}
        cls(m, lr=0.1, **kw).step()
        for k in m.p:                                            # step 1: m_hat = g, v_hat = g²
            g = m.g[k]
            upd = g / (np.abs(g) + 1e-8) + kw.get("weight_decay", 0.0) * start[k]
            assert np.allclose(m.p[k], start[k] - 0.1 * upd, rtol=1e-12, atol=1e-12), (cls, k)
