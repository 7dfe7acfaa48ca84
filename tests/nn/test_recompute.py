"""Gradient checkpointing (tformer.nn.recompute): the same gradients bit for bit, less kept memory."""
import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.training.checkpoint import load_checkpoint, save_checkpoint
from tformer.decoding.generate import greedy
from tformer.models.tinygpt import TinyGPT
from tformer.models.transformer import Transformer
from tformer.training.optim import AdamW
from tformer.nn.recompute import Recompute, check_checkpointing
from tformer.training.train import train


def _tinygpt(dtype, dropout, **kw):
    return TinyGPT(d_model=32, n_heads=2, n_layers=4, max_len=16, dropout=dropout, seed=3,
                   dtype=dtype, **kw)


def _grads(model, x, y, steps=2):
    """Parameter gradients of ``steps`` forward/backward passes (the dropout stream moves on)."""
    out = []
    for _ in range(steps):
        model.zero_grad()
        loss, dlogits = F.cross_entropy(model.forward(x), y)
        model.backward(dlogits)
        out.append((loss, {n: g.copy() for n, _, g in model.named_parameters()}))
    return out


def _tokens(V, B=3, T=12, seed=0):
    t = np.random.default_rng(seed).integers(4 if V < 256 else 0, V, (B, T + 1))
    return t[:, :-1].copy(), t[:, 1:].copy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("every", [1, 2, 3])
@pytest.mark.parametrize("kw", [{}, {"norm_position": "post", "norm": "rmsnorm", "positions": "rope",
                                     "mlp": "swiglu", "n_kv_heads": 1, "tie_embeddings": True}])
def test_tinygpt_gradients_bit_identical(dtype, dropout, every, kw):
    x, y = _tokens(256)
    ref = _grads(_tinygpt(dtype, dropout, **kw), x, y)
    got = _grads(_tinygpt(dtype, dropout, gradient_checkpointing=True, blocks_per_segment=every, **kw),
                 x, y)
    for (l0, g0), (l1, g1) in zip(ref, got):
        assert l0 == l1
        assert g0.keys() == g1.keys()
        for name in g0:
            assert np.array_equal(g0[name], g1[name]), name
    assert any(np.abs(g).max() > 0 for g in ref[0][1].values())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_transformer_gradients_bit_identical(dtype, dropout):
    x, y = _tokens(14, B=4, T=10, seed=1)
    x[0, 7:] = 0                                             # some padding: the mask is replayed too
    kw = dict(vocab_size=14, d_model=32, n_heads=4, n_layers=3, d_ff=64, max_len=16,
              dropout=dropout, seed=5, dtype=dtype)
    ref = _grads(Transformer(**kw), x, y)
    got = _grads(Transformer(**kw, gradient_checkpointing=True, blocks_per_segment=2), x, y)
    for (l0, g0), (l1, g1) in zip(ref, got):
        assert l0 == l1
        for name in g0:
            assert np.array_equal(g0[name], g1[name]), name


def test_training_losses_identical():
    data = np.random.default_rng(7).integers(0, 256, (8, 17))

    def run(**kw):
        model = _tinygpt(np.float32, 0.1, **kw)
        opt = AdamW(model, lr=3e-3)

        def batch(i):
            rows = data[(i % 2) * 4:(i % 2) * 4 + 4]               # two batches in turn
            return rows[:, :-1], rows[:, 1:]
        hist = train(model, opt, batch, lambda m, b: F.cross_entropy(m.forward(b[0]), b[1]), 8,
                     clip_norm=1.0)
        return hist, model
    h0, m0 = run()
    h1, m1 = run(gradient_checkpointing=True)
    assert h0["loss"] == h1["loss"] and h0["grad_norm"] == h1["grad_norm"]
    assert h0["loss"][-1] < h0["loss"][0]
    assert np.array_equal(m0.flat_buffers()[0], m1.flat_buffers()[0])
    assert m0.rng.bit_generator.state == m1.rng.bit_generator.state


def test_no_block_cache_survives_the_forward():
    x, y = _tokens(256)
    model = _tinygpt(np.float32, 0.0, gradient_checkpointing=True)
    model.forward(x)
    for block in model.blocks:
        assert block.attn.att is None and block.attn._cache is None
        assert block.ffn.fc1._cache is None and block.ln1._cache is None
    plain = _tinygpt(np.float32, 0.0)
    plain.forward(x)
    assert all(block.attn.att is not None for block in plain.blocks)


def test_eval_mode_and_kv_cache_unaffected():
    x, _ = _tokens(256)
    a = _tinygpt(np.float32, 0.2).eval()
    b = _tinygpt(np.float32, 0.2, gradient_checkpointing=True, blocks_per_segment=2).eval()
    assert np.array_equal(a.forward(x), b.forward(x))
    assert b.blocks[0].attn.att is not None              # eval keeps the ordinary path
    assert np.array_equal(greedy(a, x[:, :4], 6), greedy(b, x[:, :4], 6))


def test_config_and_checkpoint_round_trip(tmp_path):
    model = _tinygpt(np.float32, 0.0, gradient_checkpointing=True, blocks_per_segment=2)
    assert model.config["gradient_checkpointing"] is True and model.config["blocks_per_segment"] == 2
    path = save_checkpoint(tmp_path / "m.npz", model)
    again = TinyGPT(**{k: v for k, v in model.config.items()}, seed=9)
    meta = load_checkpoint(path, again)
    assert meta["config"]["gradient_checkpointing"] is True
    assert np.array_equal(again.flat_buffers()[0], model.flat_buffers()[0])
    t = Transformer(14, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=8)
    assert t.config["gradient_checkpointing"] is False and t.config["blocks_per_segment"] == 1


@pytest.mark.parametrize("value", ["yes", 1, None, 0.0])
def test_gradient_checkpointing_must_be_bool(value):
    with pytest.raises(TypeError, match="gradient_checkpointing"):
        _tinygpt(np.float32, 0.0, gradient_checkpointing=value)
    with pytest.raises(TypeError, match="gradient_checkpointing"):
        Transformer(14, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=8,
                    gradient_checkpointing=value)


def test_blocks_per_segment_checked():
    with pytest.raises(ValueError, match="blocks_per_segment"):
        check_checkpointing(True, 0)
    with pytest.raises(TypeError, match="blocks_per_segment"):
        check_checkpointing(True, 1.5)
    with pytest.raises(TypeError, match="blocks_per_segment"):
        _tinygpt(np.float32, 0.0, gradient_checkpointing=True, blocks_per_segment=True)


def test_segments_and_backward_without_forward():
    model = _tinygpt(np.float32, 0.0)
    r = Recompute(model.blocks, every=3)
    assert [len(s) for s in r.segments()] == [3, 1]
    with pytest.raises(RuntimeError, match="backward"):
        r.backward(np.zeros((1, 2, 32), np.float32))


def test_runtime_keys_do_not_block_loading(tmp_path):
    """A checkpoint loads into a model that differs only in how it computes (kernel, recomputation),
    and one saved before those keys existed loads too; a real difference still raises."""
    model = _tinygpt(np.float32, 0.0, gradient_checkpointing=True, blocks_per_segment=2)
    path = save_checkpoint(tmp_path / "m.npz", model)
    plain = _tinygpt(np.float32, 0.0, attention="flash")
    load_checkpoint(path, plain)
    assert np.array_equal(plain.flat_buffers()[0], model.flat_buffers()[0])
    old = {k: v for k, v in model.config.items()
           if k not in ("gradient_checkpointing", "blocks_per_segment")}
    path = save_checkpoint(tmp_path / "old.npz", model, config=old)
    load_checkpoint(path, _tinygpt(np.float32, 0.0))
    with pytest.raises(ValueError, match="another configuration.*dropout"):
        load_checkpoint(path, _tinygpt(np.float32, 0.1))
