"""Decoding with a KV cache (the model's own forward, handed the caches of
tformer.decoding.kv_cache): every layer type decodes as its own forward pass computes (float, int8
weights, int8 weights and activations, LoRA), and the lean one-token step (each layer's row path,
tformer.fast.decode) gives the bits of the general path, is taken only where it applies, makes no
more Python calls than it did as a copy of the block, and raises the same errors."""
import cProfile

import numpy as np
import pytest

from tformer.decoding import kv_cache
from tformer.core import parallel
from tformer.decoding.generate import greedy
from tformer.fast import decode
from tformer.nn.blocks import PreNormBlock
from tformer.nn.lora import apply_lora
from tformer.models.tinygpt import TinyGPT
from tformer.decoding.quantize import quantize_model

from kv_steps import cached_logits


@pytest.fixture
def threads():
    before = parallel.get_num_threads()
    yield parallel.set_num_threads
    parallel.set_num_threads(before)


def _steps(model, seq, prefill, lean):
    """Logits of each one-token step after a ``prefill``-token prompt, lean path on/off."""
    out, caches = cached_logits(model, seq, prefill, lean)
    assert all(c.lean == lean for c in caches)                    # the row paths allowed, or not
    return out[1:], caches, [blk.attn.att.copy() for blk in model.blocks]


def _variant(kind, threads_n=1):
    """A small TinyGPT as each layer type makes it: float, w8, w8a8, LoRA (with trained-looking
    adapters), in eval mode."""
    model = TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=16, seed=2)
    if kind in ("w8", "w8a8"):
        quantize_model(model, kind)
    elif kind == "lora":
        apply_lora(model, 4, targets=("attn", "mlp"), seed=1)
        rng = np.random.default_rng(5)
        for name, p, _ in model.named_parameters():
            if name.endswith((".A", ".B")):
                p += 0.1 * rng.standard_normal(p.shape).astype(p.dtype)
    return model.eval()


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("kind", ["float", "w8", "w8a8", "lora"])
def test_every_layer_type_decodes_as_its_own_forward(kind, lean, n_threads, threads):
    """A cached step computes with the layer's own arithmetic: int8 products for a quantized
    model, the adapter for LoRA. (A lean step that read the dequantized float weights of a w8a8
    model was 2e-3 away from the model's own logits.)"""
    threads(n_threads)
    model = _variant(kind)
    caches = kv_cache.new_caches(model, 1, lean)
    assert all(c.lean == lean for c in caches)                     # every one of them can be lean
    seq = np.random.default_rng(3).integers(0, 256, (2, 16))
    full = model.forward(seq)                                      # (B, T, V)
    cached, _ = cached_logits(model, seq, 5, lean)
    got = np.concatenate(cached, axis=1)
    assert got.shape == full.shape and got.dtype == full.dtype
    assert np.abs(got - full).max() <= 1e-5 * np.abs(full).max()
    out = greedy(model, seq[:, :3], 10)
    assert np.array_equal(out, greedy(model, seq[:, :3], 10, use_cache=False))


@pytest.mark.parametrize("kind", ["w8", "w8a8", "lora"])
def test_lean_and_general_steps_agree_bit_for_bit_for_every_layer_type(kind):
    model = _variant(kind)
    seq = np.random.default_rng(4).integers(0, 256, (3, 16))
    lean, _, lean_att = _steps(model, seq, 4, True)
    full, _, full_att = _steps(model, seq, 4, False)
    assert all(np.array_equal(a, b) for a, b in zip(lean, full))
    assert all(np.array_equal(a, b) for a, b in zip(lean_att, full_att))


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
    """KV cache = recomputation (as the TinyGPT model tests), through the lean step."""
    model = TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=16, seed=3,
                    dtype=np.float64).eval()
    seq = np.random.default_rng(1).integers(0, 256, (2, 16))
    steps = _steps(model, seq, 4, True)[0]
    full = model.forward(seq)
    for i, logits in enumerate(steps):
        np.testing.assert_allclose(logits[:, 0], full[:, 4 + i], rtol=1e-12, atol=1e-12)


def test_lean_step_is_taken_only_where_it_applies(monkeypatch):
    calls = []
    real = PreNormBlock.rows
    monkeypatch.setattr(PreNormBlock, "rows", lambda *a: calls.append(1) or real(*a))
    seq = np.random.default_rng(2).integers(0, 256, (1, 12))
    # the tied head has no row path of its own, but its blocks are TinyGPT's: they take theirs
    for kw, used in [({}, True), (dict(positions="rope"), False),
                     (dict(attention="flash"), False), (dict(n_kv_heads=2), False),
                     (dict(norm="rmsnorm"), False), (dict(mlp="swiglu"), False),
                     (dict(mlp="relu"), False), (dict(mlp="relu2"), False),
                     (dict(tie_embeddings=True), True),
                     (dict(norm_position="post"), False)]:
        calls.clear()
        model = TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=12, seed=0, **kw)
        out = greedy(model, seq[:, :4], 8)
        assert len(calls) == (2 * 7 if used else 0), kw          # 2 blocks × 7 one-token steps
        assert all(c.lean == used for c in kv_cache.new_caches(model, 1)), kw
        calls.clear()
        general, _ = cached_logits(model.eval(), out, 4, lean=False)   # the greedy tokens again
        assert not calls
        assert np.array_equal(out[:, 4:], np.concatenate(general, 1)[:, 3:11].argmax(-1)), kw
    model = TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=12, seed=0)
    calls.clear()                                  # training mode: the general path
    cached_logits(model, seq[:, :5], 4)
    assert not calls


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_cached_step_in_training_mode_runs_the_general_layers(checkpointing):
    """The model's forward with a cache in training mode (dropout 0): the general path, whose
    logits are those of the forward without a cache; a checkpointed stack runs it plainly."""
    model = TinyGPT(d_model=32, n_heads=4, n_layers=3, max_len=12, seed=4, dtype=np.float64,
                    gradient_checkpointing=checkpointing)
    seq = np.random.default_rng(6).integers(0, 256, (2, 12))
    steps, caches = cached_logits(model, seq, 5)
    assert all(c.lean for c in caches) and model.training
    np.testing.assert_allclose(np.concatenate(steps, axis=1), model.forward(seq),
                               rtol=1e-12, atol=1e-12)


def test_no_split_follows_the_kernels_thresholds(threads):
    threads(2)
    assert decode.no_split(1, 256, 1024, 8) and decode.no_split(8, 256, 1024, 8)
    assert not decode.no_split(64, 256, 1024, 8)
    threads(1)
    assert decode.no_split(64, 256, 1024, 8)


def test_lean_step_errors_match_the_general_path():
    model = TinyGPT(d_model=32, n_heads=4, n_layers=1, max_len=8, seed=0).eval()
    caches = kv_cache.new_caches(model, 1)
    model.forward(np.array([[1, 2]]), kv_cache=caches)
    with pytest.raises(ValueError, match="tokens"):
        model.forward(np.array([[300]]), kv_cache=caches)          # not a byte
    with pytest.raises(ValueError, match="kv_cache: expected one per block"):
        model.forward(np.array([[3]]), kv_cache=caches + caches)
    with pytest.raises(ValueError, match="tokens: 9 positions exceed max_len = 8"):
        model.forward(np.ones((1, 7), np.int64), kv_cache=caches)
    for lean in (True, False):
        c = kv_cache.new_caches(model, 1, lean)
        model.blocks[0].attn.qkv.W[0, 0] = 0.0
        model.forward(np.array([[1, 2]]), kv_cache=c)
        model.blocks[0].attn.qkv.W[0, 0] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            model.forward(np.array([[3]]), kv_cache=c)


# Python calls (cProfile) per new token of the medium model (4 layers, batch 1, one thread) when
# the one-token step was a second copy of the block (fast.decode.block_step, commit 32db412).
CALLS_AS_A_COPY = 309


def _calls_per_token(lean, n_new=8):
    model = TinyGPT(d_model=256, n_heads=8, n_layers=4, max_len=32, seed=0).eval()
    caches = kv_cache.new_caches(model, 1, lean)
    seq = np.random.default_rng(8).integers(0, 256, (1, 16 + n_new))
    model.forward(seq[:, :16], kv_cache=caches)
    counter = cProfile.Profile()
    counter.enable()
    for t in range(16, 16 + n_new):
        model.forward(seq[:, t:t + 1], kv_cache=caches)
    counter.disable()
    # counted per code object: pstats would merge two functions of one file, line and name (two
    # lambdas made by exec), keeping one count at random
    return sum(entry.callcount for entry in counter.getstats()) / n_new


def test_the_row_paths_make_no_more_calls_than_the_copy_of_the_block(threads):
    """The lean path exists for speed: chosen in the block's forward, it may not cost more Python
    calls per token than the separate copy of the block did; the general path costs ~4×."""
    threads(1)
    lean, general = _calls_per_token(True), _calls_per_token(False)
    print(f"calls per token: {lean:.0f} by the row paths (a copy of the block: "
          f"{CALLS_AS_A_COPY}), {general:.0f} through the general layers")
    assert lean <= CALLS_AS_A_COPY and lean < general / 3
