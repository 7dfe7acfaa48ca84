"""The lean one-token decoding step (tformer.fast.decode) against the general layers:
the same bits, taken only where it applies, and the same errors."""
import numpy as np
import pytest

from tformer import parallel
from tformer.generate import greedy
from tformer.fast import decode
from tformer.models.tinygpt import TinyGPT


@pytest.fixture
def threads():
    before = parallel.get_num_threads()
    yield parallel.set_num_threads
    parallel.set_num_threads(before)


def _steps(model, seq, prefill, lean):
    """Logits of each one-token step after a ``prefill``-token prompt, lean path on/off."""
    model.lean_decode = lean
    caches = model.new_kv_caches(seq.shape[0])
    model.forward(seq[:, :prefill], kv_caches=caches)
    out = [model.forward(seq[:, t:t + 1], kv_caches=caches)
           for t in range(prefill, seq.shape[1])]
    return out, caches, [blk.attn.att.copy() for blk in model.blocks]


CONFIGS = [
    (dict(d_model=64, n_heads=4, n_layers=2), 1, np.float32),
    (dict(d_model=256, n_heads=8, n_layers=4), 3, np.float32),
    (dict(d_model=32, n_heads=2, n_layers=2, positions="sinusoidal", dropout=0.1), 2,
     np.float64),
]


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("cfg, B, dtype", CONFIGS)
def test_lean_step_gives_the_bits_of_the_general_layers(cfg, B, dtype, n_threads,
                                                        threads):
    threads(n_threads)
    model = TinyGPT(**cfg, max_len=24, seed=1, dtype=dtype).eval()
    seq = np.random.default_rng(0).integers(0, 256, (B, 24))
    lean, lean_caches, lean_att = _steps(model, seq, 5, True)
    full, full_caches, full_att = _steps(model, seq, 5, False)
    assert len(lean) == 19
    for a, b in zip(lean, full):
        assert a.shape == (B, 1, 256) and a.dtype == dtype
        assert np.array_equal(a, b)
    for c, d in zip(lean_caches, full_caches):            # the caches hold the same keys
        assert c.t == d.t == 24
        assert np.array_equal(c.k[:, :, :24], d.k[:, :, :24])
        assert np.array_equal(c.v[:, :, :24], d.v[:, :, :24])
    for a, b in zip(lean_att, full_att):                  # the last step's probabilities
        assert a.shape == (B, cfg["n_heads"], 1, 24) and np.array_equal(a, b)


def test_lean_step_equals_recomputation_float64():
    """KV cache = recomputation (as test_seed_004), through the lean step."""
    model = TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=16, seed=3,
                    dtype=np.float64).eval()
    seq = np.random.default_rng(1).integers(0, 256, (2, 16))
    steps = _steps(model, seq, 4, True)[0]
    full = model.forward(seq)
    for i, logits in enumerate(steps):
        np.testing.assert_allclose(logits[:, 0], full[:, 4 + i], rtol=1e-12, atol=1e-12)


def test_lean_step_is_taken_only_where_it_applies(monkeypatch):
    calls = []
    real = decode.block_step
    monkeypatch.setattr(decode, "block_step", lambda *a: calls.append(1) or real(*a))
    seq = np.random.default_rng(2).integers(0, 256, (1, 12))
    for kw, used in [({}, True), (dict(positions="rope"), False),
                     (dict(attention="flash"), False), (dict(n_kv_heads=2), False),
                     (dict(norm="rmsnorm"), False), (dict(mlp="swiglu"), False),
                     (dict(tie_embeddings=True), False),
                     (dict(norm_position="post"), False)]:
        calls.clear()
        model = TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=12, seed=0, **kw)
        out = greedy(model, seq[:, :4], 8)
        assert bool(calls) == used, kw
        model.lean_decode = False
        assert np.array_equal(out, greedy(model, seq[:, :4], 8)), kw
    model = TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=12, seed=0)
    calls.clear()                                  # training mode: the general path
    caches = model.new_kv_caches(1)
    model.forward(seq[:, :4], kv_caches=caches)
    model.forward(seq[:, 4:5], kv_caches=caches)
    assert not calls


def test_no_split_follows_the_kernels_thresholds(threads):
    threads(2)
    assert decode.no_split(1, 256, 1024, 8) and decode.no_split(8, 256, 1024, 8)
    assert not decode.no_split(64, 256, 1024, 8)
    threads(1)
    assert decode.no_split(64, 256, 1024, 8)


def test_lean_step_errors_match_the_general_path():
    model = TinyGPT(d_model=32, n_heads=4, n_layers=1, max_len=8, seed=0).eval()
    caches = model.new_kv_caches(1)
    model.forward(np.array([[1, 2]]), kv_caches=caches)
    with pytest.raises(ValueError, match="tokens"):
        model.forward(np.array([[300]]), kv_caches=caches)          # not a byte
    with pytest.raises(ValueError, match="kv_caches: expected one per block"):
        model.forward(np.array([[3]]), kv_caches=caches + caches)
    model.blocks[0].attn.qkv.W[0, 0] = np.nan
    for lean in (True, False):
        model.lean_decode = lean
        c = model.new_kv_caches(1)
        model.blocks[0].attn.qkv.W[0, 0] = 0.0
        model.forward(np.array([[1, 2]]), kv_caches=c)
        model.blocks[0].attn.qkv.W[0, 0] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            model.forward(np.array([[3]]), kv_caches=c)
