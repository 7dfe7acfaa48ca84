"""The models' listed passes and their twins (issue 31): TinyGPT and Transformer list
``_forward_whole`` / ``_backward_whole``, the chapters' equations; ``forward`` / ``backward`` check
their input and run those, or a twin with the same arithmetic (gradient checkpointing, a part of the
batch written into ``out``). tests/test_recompute.py and tests/test_replicas.py compare whole
training runs; here each twin is held equal to the listed pass directly."""
import numpy as np
import pytest

from tformer.blocks import TINYGPT_PARTS, PostNormGPTBlock, PreNormBlock, modern_parts
from tformer.models.tinygpt import TinyGPT
from tformer.models.transformer import Transformer


def _tokens(V, B=3, T=10, seed=0):
    return np.random.default_rng(seed).integers(1, V, (B, T))


def _grads(model):
    return {n: g.copy() for n, _, g in model.named_parameters()}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tinygpt_trains_through_the_listed_pass(dtype, monkeypatch):
    """Without threads or checkpointing, a training step runs ``_forward_whole`` and
    ``_backward_whole`` themselves."""
    model = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=16, seed=1, dtype=dtype)
    called = []
    for name in ("_forward_whole", "_backward_whole"):
        fn = getattr(TinyGPT, name)
        monkeypatch.setattr(TinyGPT, name, lambda self, *a, _fn=fn, _n=name, **k:
                            called.append(_n) or _fn(self, *a, **k))
    z = model.forward(_tokens(256))
    model.backward(np.ones_like(z))
    assert called == ["_forward_whole", "_backward_whole"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_tinygpt_train_twin_equals_listed_pass(dtype, checkpointing):
    kw = dict(d_model=16, n_heads=2, n_layers=3, max_len=16, seed=2, dtype=dtype)
    plain = TinyGPT(**kw)
    twin = TinyGPT(gradient_checkpointing=checkpointing, **kw)
    x = _tokens(256)
    dz = np.random.default_rng(1).standard_normal((3, 10, 256)).astype(dtype)
    z0 = plain._forward_whole(x)
    plain._backward_whole(dz)
    out = np.empty_like(z0)
    z1 = twin._forward_train(x, out=out)
    assert np.array_equal(z0, z1) and np.array_equal(z0, out)          # written into out
    twin._backward_train(dz)
    g0, g1 = _grads(plain), _grads(twin)
    assert all(np.array_equal(g0[n], g1[n]) for n in g0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transformer_checkpointed_twin_equals_listed_pass(dtype):
    kw = dict(vocab_size=14, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16, dropout=0.0,
              seed=3, dtype=dtype)
    plain, twin = Transformer(**kw), Transformer(gradient_checkpointing=True, **kw)
    x = _tokens(14)
    dz = np.random.default_rng(2).standard_normal((3, 10, 14)).astype(dtype)
    z0 = plain._forward_whole(x, None)
    z1 = twin._forward_train(x, None)
    assert np.array_equal(z0, z1)
    plain._backward_whole(dz)
    twin._backward_train(dz)
    g0, g1 = _grads(plain), _grads(twin)
    assert all(np.array_equal(g0[n], g1[n]) for n in g0)


@pytest.mark.parametrize("Block", [PreNormBlock, PostNormGPTBlock])
def test_modern_parts_with_defaults_build_seed_004s_block(Block):
    """``modern_parts()`` with its defaults gives the same layers as seed 004's parts: the same
    parameters from the same seed, the same output."""
    a = Block(8, 2, 16, dtype=np.float64, seed=4)
    b = Block(8, 2, 16, dtype=np.float64, seed=4, parts=modern_parts())
    c = Block(8, 2, 16, dtype=np.float64, seed=4, parts=TINYGPT_PARTS)
    for m in (b, c):
        assert [type(x) for x in m._modules()] == [type(x) for x in a._modules()]
        for (n0, p0, _), (n1, p1, _) in zip(a.named_parameters(), m.named_parameters()):
            assert n0 == n1 and np.array_equal(p0, p1)
    x = np.random.default_rng(5).standard_normal((2, 6, 8))
    assert np.array_equal(a(x), b(x)) and np.array_equal(a(x), c(x))
