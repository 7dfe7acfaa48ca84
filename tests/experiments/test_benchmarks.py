"""tformer.bench: FLOP counts, the PyTorch twin of TinyGPT, the profiler, the driver's bookkeeping, and
the fast paths of the shared kernels that the benchmark work introduced. No timing assertions."""
import importlib
import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.nn.attention import MultiHeadAttention
from tformer.core.gradcheck import check_module, rel_error
from tformer.fast.softmax import _softmax_inplace
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import Adam, AdamW


def _load(name):
    """``tformer.bench.<name>``, an ordinary import (torch_gpt imports torch)."""
    return importlib.import_module(f"tformer.bench.{name}")


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

def test_profile_groups_the_untimed_rest_apart_from_the_layers_glue():
    prof = _load("op_profile")
    rows = [("Linear.forward (glue)", 2.0, 1, 0.2), ("(untimed: step body)", 1.0, 1, 0.1),
            ("linear_forward", 7.0, 1, 0.7)]
    assert prof.group(rows) == {"linear": 7.0, "glue": 2.0, "untimed": 1.0}


def test_profile_covers_the_step_and_restores_every_patched_function():
    prof = _load("op_profile")
    from tformer.nn import attention, layers
    from tformer.training import optim
    before = (F.linear_forward, attention.MultiHeadAttention.backward, layers.Linear.forward,
              optim.Optimizer.step)
    model, x, y = _tiny_gpt(dtype=np.float32)
    rows, total = prof.profile_step(model, AdamW(model), x, y, steps=2, clock="cpu")
    names = {r[0] for r in rows}
    assert {"linear_forward", "linear_backward", "attention_forward", "attention_backward",
            "softmax_shifted_inplace", "softmax_backward_inplace",   # inside attention
            "layernorm_backward", "cross_entropy", "AdamW.step"} <= names
    assert total > 0 and all(r[2] > 0 for r in rows)
    assert abs(sum(r[3] for r in rows) - 1.0) < 1e-9            # self times + untimed rest = the step
    assert after_is(before)
    cats = prof.group(rows)
    assert "linear" in cats and "attention matmuls" in cats


def after_is(before):
    from tformer.nn import attention, layers
    from tformer.training import optim
    return before == (F.linear_forward, attention.MultiHeadAttention.backward, layers.Linear.forward,
                      optim.Optimizer.step)


# --- run.py bookkeeping -----------------------------------------------------------------------------

def _train_side(times, peak_mb=10.0):
    return dict(times=times, cpu_times=[0.1] * len(times), peak_mb=peak_mb, loss=5.5, loadavg_1min=[0, 0])


def test_run_summary_and_verdict_state_every_round_and_every_target():
    run = _load("run")
    s = run.summarise_train(_train_side([0.2, 0.1, 0.3]), flops=2e9, peak=100.0)
    assert s["median_s"] == 0.2 and s["min_s"] == 0.1 and s["peak_mb"] == 10.0
    assert math.isclose(s["gflops"], 10.0) and math.isclose(s["frac_peak"], 0.1)
    fast = dict(s, median_s=0.1, peak_mb=30.0)
    gen = dict(tformer=dict(tokens_per_s=100.0), torch=dict(tokens_per_s=80.0),
               tformer_nocache=dict(tokens_per_s=10.0))
    results = dict(training={
        "small": dict(rounds=[dict(tformer=s, torch=fast, ratio=0.5), dict(tformer=s, torch=s, ratio=1.0),
                              dict(tformer=s, torch=s, ratio=1.2)]),
        "large": dict(rounds=[dict(tformer=s, torch=s, ratio=1.0)])},
        generation={"1": dict(rounds=[dict(gen, cache_speedup=10.0, ratio=1.25),
                                      dict(gen, cache_speedup=4.0, ratio=0.9)])})
    results["summary"] = run.summary(results)
    small = results["summary"]["training"]["small"]
    assert small["ratios"] == [0.5, 1.0, 1.2] and small["ratio"] == 1.0
    assert small["torch"]["peak_mb"] == 10.0 and small["tformer"]["peak_mb"] == 10.0   # medians
    g = results["summary"]["generation"]["1"]
    assert g["cache_speedups"] == [10.0, 4.0] and g["cache_speedup"] == 7.0 and g["ratio"] == 1.075
    lines = run.verdict(results)
    assert lines[0] == "training, small: torch/tformer = 0.500, 1.000, 1.200 (NOT ≥ 1.0 in every round)"
    assert lines[1] == "training, large: torch/tformer = 1.000 (≥ 1.0 in every round)"
    assert lines[2] == "training, large: tformer at 10% of the GEMM peak (NOT ≥ 75%)"
    assert lines[3] == "generation, batch 1: KV cache 10.0, 4.0× faster than recomputing (NOT ≥ 5×)"
    assert lines[4] == "generation, batch 1: torch/tformer = 1.250, 0.900 (NOT ≥ 1 in every round)"


def test_run_batch_is_next_token_shifted_and_sizes_are_the_issue_s():
    tr = _load("training")
    x, y = tr.batch(2, 5)
    assert x.shape == y.shape == (2, 5) and np.array_equal(x[:, 1:], y[:, :-1])
    assert tr.SIZES["large"] == dict(d_model=512, n_heads=8, n_layers=4, T=256, B=8)
    assert tr.SIZES["medium"] == dict(d_model=256, n_heads=8, n_layers=4, T=128, B=16)
    assert tr.SIZES["small"] == dict(d_model=64, n_heads=4, n_layers=2, T=64, B=32)


@pytest.mark.parametrize("flags, message", [
    (["--sizes", "huge"], "argument --sizes: expected a comma-separated subset of small, medium, "
                          "large, got 'huge'"),
    (["--rounds", "0"], "argument --rounds: expected an integer ≥ 1, got '0'"),
    (["--gen-batches", "1,x"], "argument --gen-batches: expected comma-separated integers from 1 "
                               "to 256, got '1,x'"),
    (["--gen-batches", "0"], "argument --gen-batches: expected comma-separated integers from 1 "
                             "to 256, got '0'")])
def test_bench_rejects_bad_flags_before_measuring_anything(flags, message, tmp_path, capsys):
    """A usage error at parse time (issue 53), nothing measured or written."""
    from tformer.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["bench", *flags, "--out", str(tmp_path / "b.json")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


def test_workers_see_no_thread_setting_by_default_and_every_one_with_threads(monkeypatch):
    run = _load("run")
    for var in run.THREAD_VARIABLES:
        monkeypatch.setenv(var, "7")
    env = run.worker_env(None, "tformer")
    assert not any(v in env for v in run.THREAD_VARIABLES)
    assert run.worker_env(None, "torch")["TFORMER_NUM_THREADS"] == "1"      # its setup's TinyGPT only
    assert all(run.worker_env(3, "tformer")[v] == "3" for v in run.THREAD_VARIABLES)
    assert all(run.worker_env(None, "tformer", "tuned")[k] == v for k, v in run.MALLOC_TUNED.items())


def test_time_steps_times_at_least_steps_and_min_time():
    """The step count: ``steps`` at least, more until the timed steps add up to ``min_time``."""
    from tformer.bench.training import time_steps
    calls = []
    wall, cpu = time_steps(lambda: calls.append(1), 2, 3)
    assert len(calls) == 5 and len(wall) == len(cpu) == 3
    calls.clear()
    wall, _ = time_steps(lambda: (calls.append(1), time.sleep(0.01)), 0, 2, min_time=0.05)
    # at least 2 steps, and then steps until they add up to 0.05 s, not one more (on a loaded
    # machine a 10 ms sleep can take longer, so the count itself is not fixed)
    assert len(wall) >= 2 and sum(wall) >= 0.05 and (len(wall) == 2 or sum(wall[:-1]) < 0.05)
    assert len(calls) == len(wall) and min(wall) >= 0.01


def test_bench_modules_import_without_torch():
    code = ("import sys; import tformer.bench.run, tformer.bench.flops, tformer.bench.op_profile, "
            "tformer.bench.training, tformer.bench.generation; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_tiny_bench_run_writes_its_json(tmp_path):
    """The whole driver end to end at the smallest settings (its numbers are not checked: timing)."""
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "tformer", "bench", "--sizes", "small", "--rounds", "1",
                        "--steps", "1", "--min-time", "0", "--warmup", "0", "--gen-batches", "2",
                        "--gen-new", "4",
                        "--gen-reps", "1", "--threads", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["threads"] == 1 and res["commit"] and res["date"] and res["machine"]["available_cores"] >= 1
    train = res["training"]["small"]["rounds"][0]
    assert train["tformer"]["tformer_threads"] == 1 and train["torch"]["torch_threads"] == 1
    assert train["tformer"]["peak_mb"] > 0 and train["torch"]["peak_mb"] > 0
    gen = res["generation"]["2"]["rounds"][0]
    assert gen["torch"]["logit_check"] < 1e-4 and gen["same_tokens"] == 1.0
    assert set(res["summary"]["generation"]["2"]) >= {"tformer", "torch", "tformer_nocache", "cache_speedup"}
    assert len(res["verdict"]) == 3
    assert {"vendor", "family", "model", "simd"} <= res["machine"].keys()      # on Linux x86
    libs = res["gemm_libraries"]["small"]
    assert libs["numpy"]["blas"].startswith("NumPy") and libs["torch"]["blas"].startswith("PyTorch")
    assert set(libs["numpy"]["layers"]) == {"W_qkv", "W_o", "W_1", "W_2", "W_lm"}
    assert all(x["step_s"] > 0 for x in libs.values())


def test_bench_times_one_part_alone_when_it_cuts_the_batch(tmp_path):
    """With two threads a round also times one thread's part (16 of the 32 sequences) on one core,
    and the verdict gives its ratio: the bound of any split across threads."""
    pytest.importorskip("torch")
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "tformer", "bench", "--sizes", "small", "--rounds", "1",
                        "--steps", "1", "--min-time", "0", "--warmup", "0", "--gen-batches", "",
                        "--threads", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    row = res["training"]["small"]["rounds"][0]
    assert row["tformer"]["tformer_threads"] == 2 and row["tformer_part"]["B"] == 16
    part = row["tformer_part"]
    assert 0 < part["update_s"] and part["bound_s"] == part["median_s"] - part["update_s"] / 2
    assert row["part_ratio"] == row["torch"]["median_s"] / part["bound_s"]
    assert row["processes_ratio"] == row["torch"]["median_s"] / part["processes_s"]
    assert any("processes side by side" in line for line in res["verdict"])
    assert any("one part on one core" in line for line in res["verdict"])


def test_the_default_output_is_one_file_per_cpu_vendor():
    run = _load("run")
    assert run.default_out("Intel").name == "bench_intel.json"
    assert run.default_out("AMD").name == "bench_amd.json"
    assert run.default_out("Hygon Genuine!").name == "bench_hygongenuine.json"
    assert run.default_out(None).name == "bench_unknown.json"


# --- generation: the torch twin's KV cache -----------------------------------------------------------

@pytest.mark.torch_parity
def test_torch_twin_kv_cache_decoding_matches_tinygpt_float64():
    torch = pytest.importorskip("torch")
    gen, tg = _load("generation"), _load("torch_gpt")
    from tformer.decoding.generate import greedy
    model = TinyGPT(d_model=16, n_heads=4, n_layers=2, max_len=24, vocab_size=11, seed=5, dtype=np.float64)
    tm = tg.from_tinygpt(model).eval()
    prompt = np.random.default_rng(0).integers(0, 11, (3, 4))
    assert gen.check_against_tformer(model, tm, prompt, n_check=20) < 1e-12
    ours = greedy(model, prompt, 20)
    theirs = tg.greedy_kv(tm, torch.from_numpy(prompt), 20).numpy()
    assert np.array_equal(ours, theirs)
    with torch.inference_mode():                         # the cached logits equal a full forward pass
        full = tm(torch.from_numpy(ours[:, :-1]))
        logits, past = tm.decode(torch.from_numpy(ours[:, :10]))
        step, _ = tm.decode(torch.from_numpy(ours[:, 10:11]), past)
    assert torch.allclose(logits, full[:, :10], rtol=0, atol=1e-12)
    assert torch.allclose(step[:, 0], full[:, 10], rtol=0, atol=1e-12)


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
