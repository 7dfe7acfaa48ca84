"""Mixed precision: the loss scaler's state machine, float16/bfloat16 kernels, master weights, underflow,
skipped steps, resumed runs, and bad input."""
import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.core.dtypes import bfloat16, finfo, float16, matmul
from tformer.__main__ import main as cli
from tformer.training.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from tformer.nn.layers import Linear
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import SGD, AdamW
from tformer.training.precision import DynamicLossScaler, MixedPrecision, precision_dtype, precision_policy
from tformer.training.train import NonFiniteLossError, train

LOW = [float16, bfloat16]
EPS = {float16: 2.0 ** -11, bfloat16: 2.0 ** -8}      # unit roundoff: half an ulp of 1


def tiny(seed=0, **kw):
    cfg = dict(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=seed)
    cfg.update(kw)
    return TinyGPT(**cfg)


def batch(i, B=4, T=8):
    rng = np.random.default_rng([7, i])
    w = rng.integers(0, 256, (B, T + 1))
    return w[:, :-1], w[:, 1:]


def forward_loss(model, b):
    x, y = b
    return F.cross_entropy(model.forward(x), y)


# --- the scaler's state machine ---------------------------------------------------------------

def test_scaler_overflow_skips_and_halves():
    s = DynamicLossScaler(init_scale=1024.0, growth_interval=3)
    s.update(False)
    s.update(False)
    assert (s.scale, s.growth_tracker, s.skipped) == (1024.0, 2, 0)
    assert s.update(True) == 512.0                     # overflow: halve, reset the streak, count a skip
    assert (s.growth_tracker, s.skipped) == (0, 1)


def test_scaler_doubles_after_n_clean_steps():
    s = DynamicLossScaler(init_scale=8.0, growth_interval=3)
    scales = [s.update(found_inf) for found_inf in (False, False, False, False, True, False, False, False)]
    assert scales == [8.0, 8.0, 16.0, 16.0, 8.0, 8.0, 8.0, 16.0]
    assert s.skipped == 1 and s.growth_tracker == 0


def test_scaler_refuses_to_skip_forever():
    s = DynamicLossScaler(init_scale=2.0, min_scale=1.0)
    s.update(True)                                     # 2 -> 1
    with pytest.raises(FloatingPointError, match="not finite even at loss scale 1"):
        s.update(True)


def test_scaler_state_round_trip_and_validation():
    s = DynamicLossScaler(init_scale=64.0, growth_interval=5)
    for f in (False, True, False, False):
        s.update(f)
    t = DynamicLossScaler().load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()
    bad = dict(s.state_dict(), growth_tracker=5)
    with pytest.raises(ValueError, match="growth_tracker"):
        t.load_state_dict(bad)
    with pytest.raises(ValueError, match="missing keys"):
        t.load_state_dict({"scale": 1.0})
    assert t.state_dict() == s.state_dict()            # untouched by the failed loads


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_init_scale_must_be_positive(value):
    with pytest.raises(ValueError, match="init_scale"):
        DynamicLossScaler(init_scale=value)
    with pytest.raises(ValueError, match="init_scale"):
        precision_policy(tiny(), "fp16", init_scale=value)


def test_scaler_factors_validated():
    with pytest.raises(ValueError, match="growth_factor"):
        DynamicLossScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        DynamicLossScaler(backoff_factor=1.0)
    with pytest.raises(ValueError, match="growth_interval"):
        DynamicLossScaler(growth_interval=0)


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match=r"precision: expected one of \['bf16', 'fp16', 'fp32'\], got 'fp8'"):
        precision_dtype("fp8")
    with pytest.raises(ValueError, match="precision"):
        precision_policy(tiny(), "float16")
    assert precision_policy(tiny(), "fp32") is None


@pytest.mark.parametrize("argv", [["run", "tinygpt", "--precision", "fp8"],
                                  ["run", "transformer", "--precision", "int4"]])
def test_cli_rejects_unknown_precision(argv, capsys):
    with pytest.raises(SystemExit):
        cli(argv)
    assert "argument --precision: invalid choice" in capsys.readouterr().err


# --- the kernels in float16 and bfloat16 -------------------------------------------------------

@pytest.mark.parametrize("dt", LOW)
def test_matmul_is_the_float32_product_rounded_once(dt):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((33, 70)).astype(dt), rng.standard_normal((70, 9)).astype(dt)
    c = matmul(a, b)
    assert c.dtype == dt
    np.testing.assert_array_equal(c, (a.astype(np.float32) @ b.astype(np.float32)).astype(dt))
    out = np.empty((33, 9), np.float32)                # a float32 output keeps the accumulator
    np.testing.assert_array_equal(matmul(a, b, out=out), a.astype(np.float32) @ b.astype(np.float32))


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("dt", LOW)
def test_kernels_stay_in_their_format_and_near_float32(dt):
    """Each kernel, fed low-precision inputs, returns low-precision outputs within a few roundings
    (a relative error of a few units of the format's roundoff) of its float32 self."""
    rng = np.random.default_rng(1)
    tol = 8 * EPS[dt]
    x32 = rng.standard_normal((2, 5, 16)).astype(np.float32)
    W32, b32 = (0.3 * rng.standard_normal((16, 12))).astype(np.float32), rng.standard_normal(12).astype(np.float32)
    g32 = rng.standard_normal((2, 5, 12)).astype(np.float32)
    lo = lambda a: a.astype(dt)                                   # noqa: E731
    up = lambda a: lo(a).astype(np.float32)                       # the low-precision value, exactly
    cases = {
        "linear": (F.linear_forward, F.linear_backward, (x32, W32, b32), g32),
        "gelu": (F.gelu_forward, F.gelu_backward, (x32,), x32[::-1].copy()),
        "layernorm": (F.layernorm_forward, F.layernorm_backward,
                      (x32, 1 + 0.1 * x32[0, 0], 0.1 * x32[1, 0]), x32[:, ::-1].copy()),
        "softmax": (F.softmax_forward, F.softmax_backward, (x32,), x32[::-1].copy()),
    }
    for name, (fwd, bwd, args, dy) in cases.items():
        y_low, cache_low = fwd(*map(lo, args))
        y_ref, cache_ref = fwd(*map(up, args))
        assert y_low.dtype == dt, name
        assert _rel(y_low, y_ref) < tol, (name, _rel(y_low, y_ref))
        g_low, g_ref = bwd(lo(dy), cache_low), bwd(up(dy), cache_ref)
        for gl, gr in zip(g_low if isinstance(g_low, tuple) else (g_low,),
                          g_ref if isinstance(g_ref, tuple) else (g_ref,)):
            assert gl.dtype == dt, name
            assert _rel(gl, gr) < tol, (name, _rel(gl, gr))
    q, k, v = (lo(rng.standard_normal((2, 2, 70, 8)).astype(np.float32)) for _ in range(3))
    y, cache = F.attention_forward(q, k, v, is_causal=True)
    y_ref, cache_ref = F.attention_forward(*(t.astype(np.float32) for t in (q, k, v)), is_causal=True)
    assert y.dtype == dt and _rel(y, y_ref) < tol
    dy = lo(rng.standard_normal(y.shape).astype(np.float32))
    for gl, gr in zip(F.attention_backward(dy, cache), F.attention_backward(dy.astype(np.float32), cache_ref)):
        assert gl.dtype == dt and _rel(gl, gr) < tol


@pytest.mark.parametrize("dt", LOW)
def test_loss_runs_in_float32_and_returns_a_float32_gradient(dt):
    rng = np.random.default_rng(2)
    z = rng.standard_normal((64, 40)).astype(dt)
    t = rng.integers(0, 40, 64)
    loss, dz = F.cross_entropy(z, t)
    ref, dref = F.cross_entropy(z.astype(np.float32), t)
    assert dz.dtype == np.float32 and loss == ref
    np.testing.assert_array_equal(dz, dref)


# --- master weights, scaling, skipping ---------------------------------------------------------

def test_layers_read_copies_optimizer_updates_float32_masters():
    model = tiny()
    mp = MixedPrecision(model, "fp16")
    opt = AdamW(model, lr=1e-2)
    assert model.lm_head.W.dtype == float16 and model.lm_head.params["W"].dtype == np.float32
    assert all(p.dtype == np.float32 and g.dtype == np.float32 for _, p, g in model.named_parameters())
    assert all(a.dtype == np.float32 for s in opt.state.values() for a in s.values())
    train(model, opt, batch, forward_loss, 2, precision=mp, progress_bar=False)
    for _, p, _ in model.named_parameters():                       # the copies follow the masters
        assert p.dtype == np.float32
    np.testing.assert_array_equal(model.lm_head.W, model.lm_head.params["W"].astype(float16))
    np.testing.assert_array_equal(model.wte.W, model.wte.params["W"].astype(float16))
    mp.detach()
    assert model.lm_head.W is model.lm_head.params["W"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_low_precision_step_equals_the_float32_step(precision):
    """One SGD step (Δθ = −lr·g) in fp16 with loss scaling, or bf16, against float32 from the same
    weights and batch: the loss and the update agree to the format's tolerance (the gradient passes
    through a few dozen roundings of relative size 2⁻¹¹, or 2⁻⁸)."""
    ref, low = tiny(seed=3), tiny(seed=3)
    mp = MixedPrecision(low, precision)
    before = ref.state_dict()
    h_ref = train(ref, SGD(ref, lr=0.1), batch, forward_loss, 1, progress_bar=False)
    h_low = train(low, SGD(low, lr=0.1), batch, forward_loss, 1, precision=mp, progress_bar=False)
    assert h_low["skipped"] == [] and h_low["loss_scale"] == [2.0 ** 16 if precision == "fp16" else 1.0]
    tol = {"fp16": 1e-2, "bf16": 6e-2}[precision]
    assert abs(h_low["loss"][0] - h_ref["loss"][0]) < 20 * EPS[mp.dtype] * h_ref["loss"][0]
    sd_ref, sd_low = ref.state_dict(), low.state_dict()
    upd_ref = np.concatenate([(sd_ref[k] - before[k]).ravel() for k in before])
    upd_low = np.concatenate([(sd_low[k] - before[k]).ravel() for k in before])
    assert _rel(upd_low, upd_ref) < tol, _rel(upd_low, upd_ref)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_modern_block_trains_in_low_precision(precision):
    """RMSNorm, RoPE, SwiGLU, grouped-query attention and tied embeddings: the same one-step check."""
    kw = dict(seed=4, norm="rmsnorm", positions="rope", mlp="swiglu", n_kv_heads=1, tie_embeddings=True)
    ref, low = tiny(**kw), tiny(**kw)
    mp = MixedPrecision(low, precision)
    assert low.lm_head.W is low.wte.W and low.wte.W.dtype == mp.dtype      # one tied copy
    before = ref.state_dict()
    train(ref, SGD(ref, lr=0.1), batch, forward_loss, 1, progress_bar=False)
    train(low, SGD(low, lr=0.1), batch, forward_loss, 1, precision=mp, progress_bar=False)
    upd = [np.concatenate([(m.state_dict()[k] - before[k]).ravel() for k in before]) for m in (ref, low)]
    assert _rel(upd[1], upd[0]) < {"fp16": 1e-2, "bf16": 6e-2}[precision]


def test_small_gradients_underflow_in_float16_without_scaling_and_survive_with_it():
    """A constructed case: L = ½‖X W − T‖² · 10⁻⁹ puts every entry of dY near 10⁻⁹, below
    float16's smallest subnormal 2⁻²⁴ ≈ 6·10⁻⁸. Unscaled, dY and therefore dW are exactly 0 in
    float16; with S = 2¹⁶ they are representable and the unscaled dW matches float32."""
    assert finfo(float16).smallest_subnormal == 2.0 ** -24
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    t = rng.standard_normal((64, 8)).astype(np.float32)

    def grads(layer, mp):
        layer.zero_grad()
        y = layer(x.astype(mp.dtype) if mp else x)
        _, dy = F.mse_loss(y, t, reduction="half_sum")
        dy = dy * np.float32(1e-9)                          # the tiny gradient
        layer.backward(mp.scale_grad(dy) if mp else dy)
        if mp:
            assert mp.unscale_()
        return layer.grads["W"].copy()

    g32 = grads(Linear(16, 8, seed=5), None)
    assert 0 < np.abs(g32).max() < 1e-6
    unscaled = MixedPrecision(Linear(16, 8, seed=5), "fp16", scaler=None)
    assert np.count_nonzero(grads(unscaled.model, unscaled)) == 0          # every entry underflowed
    scaled = MixedPrecision(Linear(16, 8, seed=5), "fp16")
    g16 = grads(scaled.model, scaled)
    assert np.count_nonzero(g16) == g16.size
    assert _rel(g16, g32) < 1e-2


def test_no_update_from_a_non_finite_gradient():
    """S = 2⁶⁰ overflows float16 on every step: each is skipped, S halves, and neither the weights
    nor the optimizer (t, m, v) move. Then a NaN injected into one step's gradient is skipped too."""
    model = tiny()
    mp = MixedPrecision(model, "fp16", init_scale=2.0 ** 60)
    opt = AdamW(model, lr=1e-2)
    before = model.state_dict()
    h = train(model, opt, batch, forward_loss, 3, precision=mp, progress_bar=False)
    assert h["skipped"] == [1, 2, 3] and h["loss_scale"] == [2.0 ** 60, 2.0 ** 59, 2.0 ** 58]
    assert mp.scaler.scale == 2.0 ** 57 and mp.scaler.skipped == 3 and opt.t == 0
    assert all(np.isnan(h["grad_norm"]))
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    assert all(not a.any() for s in opt.state.values() for a in s.values())

    model = tiny()
    mp = MixedPrecision(model, "fp16", init_scale=2.0 ** 8)
    opt = AdamW(model, lr=1e-2)

    def poisoned(m, b):
        loss, d = forward_loss(m, b)
        if poisoned.calls == 1:
            d[0, 0, 0] = np.nan
        poisoned.calls += 1
        return loss, d
    poisoned.calls = 0
    h = train(model, opt, batch, poisoned, 1, precision=mp, progress_bar=False)
    after_one = model.state_dict()
    h = train(model, opt, batch, poisoned, 2, start_step=1, precision=mp, progress_bar=False)
    assert h["skipped"] == [2] and opt.t == 1 and mp.loss_scale == 2.0 ** 7
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, after_one[k])


def test_a_gradient_that_no_scale_cures_stops_training(tmp_path):
    model = tiny()
    mp = MixedPrecision(model, "fp16", init_scale=4.0)

    def always_nan(m, b):
        loss, d = forward_loss(m, b)
        d[0, 0, 0] = np.nan
        return loss, d
    before = model.state_dict()
    with pytest.raises(NonFiniteLossError, match="step 3: the gradient is not finite even at loss scale 1"):
        train(model, AdamW(model), batch, always_nan, 5, precision=mp, progress_bar=False)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_bf16_non_finite_gradient_raises_as_float32_does():
    model = tiny()
    mp = MixedPrecision(model, "bf16")
    assert mp.scaler is None and mp.loss_scale == 1.0

    def nan_loss_grad(m, b):
        loss, d = forward_loss(m, b)
        d[...] = np.inf
        return loss, d
    with pytest.raises(NonFiniteLossError, match="gradient norm"):
        train(model, AdamW(model), batch, nan_loss_grad, 1, precision=mp, progress_bar=False)


def test_resumed_run_continues_the_same_scale_schedule(tmp_path):
    """6 steps straight against 3 steps, a checkpoint, a fresh model + policy + optimizer loaded
    from it, and 3 more: the same weights, optimizer state and scaler state, bit for bit. The
    scale starts high enough to overflow, and grows every 2 clean steps, so the schedule moves."""
    def setup():
        model = tiny(seed=9)
        mp = MixedPrecision(model, "fp16", scaler=DynamicLossScaler(2.0 ** 24, growth_interval=2))
        return model, mp, AdamW(model, lr=1e-2)

    m1, p1, o1 = setup()
    h1 = train(m1, o1, batch, forward_loss, 6, precision=p1, progress_bar=False)
    assert h1["skipped"] and len(set(h1["loss_scale"])) > 2
    path = tmp_path / "half.npz"
    m2, p2, o2 = setup()
    train(m2, o2, batch, forward_loss, 3, precision=p2, checkpoint_path=path, progress_bar=False)
    meta = read_checkpoint(path)[0]
    assert meta["precision"]["scaler"] == p2.scaler.state_dict()
    m3, p3, o3 = setup()
    start = load_checkpoint(path, m3, o3, precision=p3)["step"]
    train(m3, o3, batch, forward_loss, 6, start_step=start, precision=p3, progress_bar=False)
    assert p3.scaler.state_dict() == p1.scaler.state_dict()
    for k, v in m1.state_dict().items():
        np.testing.assert_array_equal(m3.state_dict()[k], v)
    for k, v in o1.state_dict().items():
        np.testing.assert_array_equal(o3.state_dict()[k], v)


def test_checkpoint_holds_float32_masters(tmp_path):
    model = tiny()
    mp = MixedPrecision(model, "bf16")
    opt = AdamW(model)
    train(model, opt, batch, forward_loss, 1, precision=mp, progress_bar=False)
    save_checkpoint(tmp_path / "c.npz", model, opt, precision=mp)
    meta, state, optim = read_checkpoint(tmp_path / "c.npz")
    assert meta["precision"] == {"precision": "bf16", "scaler": None}
    assert all(v.dtype == np.float32 for v in state.values())
    for name, p, _ in model.named_parameters():
        np.testing.assert_array_equal(state[name], p)
    with pytest.raises(ValueError, match="saved in precision 'bf16'"):
        load_checkpoint(tmp_path / "c.npz", tiny(), precision=MixedPrecision(tiny(), "fp16"))


def test_mixed_precision_needs_float32_masters():
    with pytest.raises(TypeError, match="float32 parameters"):
        MixedPrecision(tiny(dtype=np.float64), "fp16")
    with pytest.raises(ValueError, match="needs no MixedPrecision"):
        MixedPrecision(tiny(), "fp32")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cli_runs_train_in_low_precision(precision, tmp_path, capsys):
    ck = str(tmp_path / "t.npz")
    assert cli(["run", "tinygpt", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--max-len", "16",
                "--batch-size", "4", "--steps", "3", "--eval-windows", "4", "--eval-every", "3",
                "--sample-tokens", "5", "--temperatures", "0.8", "--checkpoint", ck, "--no-progress",
                "--precision", precision]) == 0
    out = capsys.readouterr().out
    assert f"{precision}: 0 of 3 steps skipped on overflow" in out
    assert read_checkpoint(ck)[0]["precision"]["precision"] == precision
    assert cli(["run", "transformer", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32",
                "--max-len", "4", "--steps", "3", "--warmup", "1", "--batch-size", "8", "--eval-size", "8",
                "--eval-every", "0", "--target", "0", "--checkpoint", str(tmp_path / "tr.npz"),
                "--no-progress", "--precision", precision]) == 0
    assert f"{precision}: 0 of 3 steps skipped" in capsys.readouterr().out
