"""int8 quantization: rounding error, exact integer products, quantized layers and models, the file."""
import numpy as np
import pytest

from tformer.__main__ import main as cli
from tformer.training.checkpoint import load_checkpoint, read_checkpoint
from tformer.nn.layers import Embedding, Linear
from tformer.models.tinygpt import TinyGPT
from tformer.decoding.quantize import (QuantizedEmbedding, QuantizedLinear, dequantize_tensor, int_matmul,
                              load_model, load_quantized, quantize_model, quantize_rows, quantize_tensor,
                              save_quantized)


def tiny(seed=0, **kw):
    cfg = dict(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=seed)
    cfg.update(kw)
    return TinyGPT(**cfg)


def randomized(seed=0, scale=0.3, **kw):
    """A TinyGPT whose every parameter is random (LayerNorm gains near 1), so nothing is trivially 0."""
    m = tiny(seed, **kw)
    rng = np.random.default_rng(seed + 100)
    for n, p, _ in m.named_parameters():
        p[...] = (1.0 if n.endswith("gamma") else 0.0) + scale * rng.standard_normal(p.shape)
    return m


def tokens(seed=0, B=3, T=8):
    return np.random.default_rng(seed).integers(0, 256, (B, T))


def quantized_copy(model, scheme):
    q = TinyGPT(**model.config)
    q.load_state_dict(model.state_dict())
    return quantize_model(q, scheme)


# --- the rounding ---------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1])
def test_quantize_dequantize_error_at_most_half_a_step(axis):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((40, 24)) * rng.uniform(0.01, 3, 24 if axis == 0 else (40, 1))).astype(np.float32)
    q, s = quantize_tensor(w, axis)
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (w.shape[1 - axis],)
    assert np.abs(q.astype(int)).max() <= 127
    np.testing.assert_array_equal(np.abs(q.astype(int)).max(axis=axis), 127)   # the largest entry is ±127
    s64 = np.expand_dims(s.astype(np.float64), axis)
    err = np.abs(w.astype(np.float64) - q * s64)            # q·s is exact in float64
    assert (err <= s64 / 2 * (1 + 1e-12)).all()
    np.testing.assert_allclose(dequantize_tensor(q, s, axis), q * s64, rtol=2 ** -24)


def test_an_all_zero_channel_gets_step_one():
    w = np.zeros((5, 3), np.float32)
    w[:, 1] = [1, -2, 0.5, 0, 3]
    q, s = quantize_tensor(w, 0)
    assert s[0] == s[2] == 1.0 and not q[:, [0, 2]].any()
    with pytest.raises(ValueError, match="w: contains inf or NaN"):
        quantize_tensor(np.array([[np.inf]], np.float32), 0)


def test_per_token_activation_quantization():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 20)).astype(np.float32)
    x[3] = 0
    xq, a = quantize_rows(x)
    assert a[3, 0] == 1 and not xq[3].any()
    assert np.array_equal(xq, np.round(xq)) and np.abs(xq).max() == 127
    assert (np.abs(x - xq * a) <= a / 2 * (1 + 1e-6)).all()


@pytest.mark.parametrize("K", [1, 1040, 1041, 3000])
def test_integer_products_are_exact(K):
    """float32 BLAS up to K = 1040 (K·127² ≤ 2²⁴), float64 beyond: equal to NumPy's int32 product,
    even with every entry at ±127 (the largest partial sums)."""
    rng = np.random.default_rng(K)
    xq = rng.integers(-127, 128, (5, K)).astype(np.float32)
    q = rng.integers(-127, 128, (K, 7)).astype(np.int8)
    xq[0], q[:, 0] = 127, 127
    exact = xq.astype(np.int32) @ q.astype(np.int32)
    got = int_matmul(xq, q)
    assert got.dtype == (np.float32 if K <= 1040 else np.float64)
    np.testing.assert_array_equal(got, exact)


def test_float32_stops_being_exact_past_two_to_the_24():
    """Why the float64 switch: 1041·127² > 2²⁴, and float32 cannot hold every integer beyond 2²⁴."""
    assert 1040 * 127 ** 2 <= 2 ** 24 < 1041 * 127 ** 2
    assert np.float32(2 ** 24 + 1) == np.float32(2 ** 24)


# --- quantized layers -----------------------------------------------------------------------------

def test_quantized_linear_w8_error_bound():
    """|ŷ_j − y_j| ≤ (s_j/2)·‖x‖₁: each weight moves by at most s_j/2 (checked in float64; the
    float32 computation of ŷ adds only its own rounding)."""
    rng = np.random.default_rng(2)
    lin = Linear(48, 20, seed=3)
    lin.b[...] = rng.standard_normal(20)
    x = rng.standard_normal((2, 9, 48)).astype(np.float32)
    ql = QuantizedLinear.from_linear(lin, "w8")
    y, yq = lin(x).astype(np.float64), ql(x).astype(np.float64)
    x64 = x.reshape(-1, 48).astype(np.float64)
    W_hat = ql.q * ql.scale.astype(np.float64)
    yq64 = (x64 @ W_hat + lin.b).reshape(y.shape)
    np.testing.assert_allclose(yq, yq64, rtol=0, atol=1e-5)             # float32 rounding only
    y64 = (x64 @ lin.W.astype(np.float64) + lin.b).reshape(y.shape)
    bound = (ql.scale / 2) * np.abs(x).sum(-1, keepdims=True)            # (2, 9, 20)
    assert (np.abs(yq64 - y64) <= bound).all()
    assert np.abs(yq - y).max() > 0                                       # it is not the float layer


def test_quantized_linear_w8a8_error_bound():
    """With x = a·x_q + e (|e| ≤ a/2) and w = s·q + d (|d| ≤ s/2):
    |ŷ − y| ≤ (s/2)‖x‖₁ + (a/2)‖w‖₁ + K·a·s/4, per token and output channel."""
    rng = np.random.default_rng(4)
    lin = Linear(64, 24, seed=5)
    x = (rng.standard_normal((30, 64)) * rng.uniform(0.1, 5, (30, 1))).astype(np.float32)
    ql = QuantizedLinear.from_linear(lin, "w8a8")
    yq = ql(x).astype(np.float64)
    y = x.astype(np.float64) @ lin.W.astype(np.float64) + lin.b
    a = np.abs(x).max(1, keepdims=True).astype(np.float64) / 127
    s = ql.scale.astype(np.float64)
    bound = s / 2 * np.abs(x).sum(1, keepdims=True) + a / 2 * np.abs(lin.W).sum(0) + 64 * a * s / 4
    assert (np.abs(yq - y) <= bound + 1e-5 * (1 + np.abs(y))).all()
    # the integer part is exact: ŷ = (X_q Q) ⊙ a sᵀ + b, with X_q Q equal to int32 arithmetic
    xq, a32 = quantize_rows(x)
    acc = xq.astype(np.int32) @ ql.q.astype(np.int32)
    np.testing.assert_allclose(yq, acc * a32.astype(np.float64) * s + lin.b, rtol=1e-6, atol=1e-6)


def test_quantized_embedding():
    emb = Embedding(30, 6, seed=1)
    qe = QuantizedEmbedding.from_embedding(emb)
    t = np.array([[0, 5, 29], [5, 5, 1]])
    e, eq = emb(t), qe(t)
    assert eq.dtype == np.float32
    assert (np.abs(e - eq) <= qe.scale[t][..., None] / 2 * (1 + 1e-6)).all()
    np.testing.assert_array_equal(eq, qe.W[t])
    with pytest.raises(ValueError, match="tokens"):
        qe(np.array([[30]]))
    with pytest.raises(RuntimeError, match="inference only"):
        qe.backward(eq)


# --- quantized models -----------------------------------------------------------------------------

@pytest.mark.parametrize("scheme, bound", [("w8", 0.03), ("w8a8", 0.04)])
def test_quantized_logits_stay_near_the_float_models(scheme, bound):
    """Stated bound: on a TinyGPT with random N(0, 0.3²) weights the logits' relative rms error is
    below 3% (w8) and 4% (w8a8). The Δ²/12 model predicts about max|w|/(127·√12·σ_w) ≈ 0.5% per
    layer for Gaussian columns of 16 to 64 entries; a dozen layers in series add up to this."""
    for seed in range(3):
        m = randomized(seed)
        x = tokens(seed)
        z = m.forward(x).astype(np.float64)
        d = quantized_copy(m, scheme).forward(x) - z
        rel = np.sqrt((d * d).mean() / (z * z).mean())
        assert 1e-4 < rel < bound, (seed, rel)


def test_quantize_model_replaces_every_linear_and_embedding():
    m = quantize_model(tiny(), "w8")
    assert isinstance(m.lm_head, QuantizedLinear) and isinstance(m.wte, QuantizedEmbedding)
    assert isinstance(m.blocks[1].attn.qkv, QuantizedLinear) and isinstance(m.blocks[0].ffn.fc2, QuantizedLinear)
    assert dict(m.named_modules())["blocks.1"] is m.blocks[1] and dict(m.named_children())["lm_head"] is m.lm_head
    assert m.quantization == "w8" and not m.training
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(m, "w8")
    with pytest.raises(ValueError, match=r"scheme: expected one of \['w8', 'w8a8'\], got 'w4'"):
        quantize_model(tiny(), "w4")
    out = m.forward(tokens())
    assert out.shape == (3, 8, 256) and out.dtype == np.float32
    with pytest.raises(RuntimeError, match="inference only"):
        m.backward(np.zeros_like(out))


# --- the file ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["w8", "w8a8"])
def test_file_round_trip_is_exact(scheme, tmp_path):
    m = quantized_copy(randomized(1), scheme)
    path = save_quantized(tmp_path / "q.npz", m, step=7, extra={"note": "x"})
    fresh = tiny(seed=5)
    meta = load_model(path, fresh)
    assert meta["step"] == 7 and meta["quantized"]["scheme"] == scheme and fresh.quantization == scheme
    for a, b in zip(m.modules(), fresh.modules()):
        assert type(a) is type(b)
        if hasattr(a, "q"):
            np.testing.assert_array_equal(a.q, b.q)
            np.testing.assert_array_equal(a.scale, b.scale)
    for (n, p, _), (n2, p2, _) in zip(m.named_parameters(), fresh.named_parameters()):
        assert n == n2
        np.testing.assert_array_equal(p, p2)
    x = tokens(2)
    np.testing.assert_array_equal(m.forward(x), fresh.forward(x))


def test_quantized_file_into_a_model_of_another_shape(tmp_path):
    path = save_quantized(tmp_path / "q.npz", quantized_copy(tiny(), "w8"))
    other = tiny(d_model=32)
    before = other.state_dict()
    with pytest.raises(ValueError, match=r"made for another configuration \(d_ff: checkpoint 64 vs model 128, "
                                         r"d_model: checkpoint 16 vs model 32\)"):
        load_model(path, other)
    with pytest.raises(ValueError, match="layer 'wte' is a embedding of shape \\(256, 16\\) in the file, "
                                         "a embedding of shape \\(256, 32\\) in the model"):
        load_quantized(path, other, config={})          # past the config check: the shapes differ
    assert isinstance(other.lm_head, Linear) and not hasattr(other, "quantization")
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def _tamper(path, out, **changes):
    """Rewrite the .npz at ``path`` into ``out`` with some arrays replaced."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(changes)
    np.savez(out, **arrays)
    return out


@pytest.mark.parametrize("how", ["truncated", "flipped", "minus128", "zero_scale", "shape", "missing_float",
                                 "not_npz"])
def test_a_corrupt_quantized_file_is_refused_and_the_model_untouched(how, tmp_path):
    m = quantized_copy(randomized(2), "w8")
    path = str(save_quantized(tmp_path / "q.npz", m))
    data = open(path, "rb").read()
    bad = str(tmp_path / "bad.npz")
    if how == "truncated":
        open(bad, "wb").write(data[: len(data) // 2])
    elif how == "flipped":                                   # a byte inside the lm_head's int8 array
        with np.load(path) as z:
            q = z["int8/lm_head.W"]
        at = data.find(q.tobytes()[:64]) + 100
        open(bad, "wb").write(data[:at] + bytes([data[at] ^ 0x55]) + data[at + 1:])
    elif how == "minus128":
        q = m.lm_head.q.copy()
        q[0, 0] = -128
        _tamper(path, bad, **{"int8/lm_head.W": q})
    elif how == "zero_scale":
        s = m.blocks[0].ffn.fc1.scale.copy()
        s[3] = 0
        _tamper(path, bad, **{"scale/blocks.0.ffn.fc1.W": s})
    elif how == "shape":
        _tamper(path, bad, **{"int8/blocks.1.attn.o.W": np.zeros((16, 8), np.int8)})
    elif how == "missing_float":
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files if k != "model/ln_f.gamma"}
        np.savez(bad, **arrays)
    else:
        open(bad, "wb").write(b"not a zip file at all")
    target = tiny(seed=8)
    before = target.state_dict()
    with pytest.raises(ValueError, match="path: .*bad.npz"):
        load_model(bad, target)
    assert not hasattr(target, "quantization") and isinstance(target.blocks[1].attn.o, Linear)
    for k, v in target.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_quantized_file_refuses_optimizer_and_precision(tmp_path):
    from tformer.training.optim import AdamW
    path = save_quantized(tmp_path / "q.npz", quantized_copy(tiny(), "w8"))
    m = tiny()
    with pytest.raises(ValueError, match="quantized checkpoint \\(inference only\\)"):
        load_checkpoint(path, m, AdamW(m))
    with pytest.raises(ValueError, match="load it with tformer.decoding.quantize.load_model"):
        load_checkpoint(path, m)
    with pytest.raises(ValueError, match="not quantized"):
        save_quantized(tmp_path / "x.npz", tiny())


# --- the command --------------------------------------------------------------------------------

def test_quantize_command_and_generate(tmp_path, capsys):
    ck = str(tmp_path / "gpt.npz")
    assert cli(["run", "tinygpt", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--max-len", "16",
                "--batch-size", "4", "--steps", "2", "--eval-windows", "4", "--eval-every", "2",
                "--sample-tokens", "3", "--temperatures", "0.8", "--checkpoint", ck, "--no-progress"]) == 0
    capsys.readouterr()
    for scheme in ("w8", "w8a8"):
        out = str(tmp_path / f"{scheme}.npz")
        assert cli(["quantize", ck, "--out", out, "--scheme", scheme, "--gen-tokens", "4"]) == 0
        text = capsys.readouterr().out
        assert f"{scheme}: {out} is " in text and "% of the float32 weights" in text
        assert "validation: float32 " in text and "generation: float32 " in text
        assert read_checkpoint(out)[0]["quantized"]["scheme"] == scheme
        assert cli(["generate", "--checkpoint", out, "--max-new-tokens", "5", "--prompt", "ab"]) == 0
        assert capsys.readouterr().out.startswith("ab")
    with pytest.raises(SystemExit):
        cli(["quantize", ck, "--out", out, "--scheme", "w4"])
    assert "argument --scheme: invalid choice: 'w4'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:             # a usage error, not a traceback
        cli(["quantize", out, "--out", str(tmp_path / "again.npz")])
    assert e.value.code == 2 and "already quantized" in capsys.readouterr().err


def test_int8_swaps_its_layers_through_module_replace(monkeypatch):
    """``quantize_model`` finds its layers with ``Module.named_layers`` and swaps each with
    ``Module.replace``: one call per Linear and Embedding, depth first."""
    from tformer.nn.layers import Module
    calls = []
    real = Module.replace
    monkeypatch.setattr(Module, "replace", lambda self, path, new: calls.append(path) or real(self, path, new))
    model = tiny().eval()
    expect = [p for p, m in model.named_modules() if isinstance(m, (Linear, Embedding))]
    assert [p for p, _ in model.named_layers(Linear, Embedding)] == expect
    quantize_model(model, "w8")
    assert calls == expect
    assert [p for p, _ in model.named_layers(QuantizedLinear, QuantizedEmbedding)] == expect
