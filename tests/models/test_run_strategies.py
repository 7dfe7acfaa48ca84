"""One model, one way to run it: TinyGPT and the complete Transformer have one ``forward`` and one
``backward``, and each way of running them wraps them from outside or hands them what they use,
with the same arithmetic: gradient checkpointing (``Recompute`` standing in for the stack of
blocks), the batch cut across threads (``BatchCut``) and decoding, which hands TinyGPT's own
forward a KV cache (``forward(tokens, kv_cache)``, ``tformer.decoding.kv_cache``). tests/nn/test_recompute.py,
tests/training/test_replicas.py and tests/decoding/test_decode.py hold each strategy in depth; here each is held to
the model's own pass directly."""
import ast
import inspect
import textwrap

import numpy as np
import pytest

from tformer.decoding import kv_cache
from tformer.nn.blocks import TINYGPT_PARTS, BlockStack, PostNormGPTBlock, PreNormBlock, modern_parts
from tformer.models.tinygpt import TinyGPT
from tformer.models.transformer import Transformer
from tformer.training.batch_threads import BatchCut
from tformer.nn.recompute import Recompute


def _tokens(V, B=3, T=10, seed=0):
    return np.random.default_rng(seed).integers(1, V, (B, T))


def _code(function):
    """The source of ``function`` without its docstring (which may name what calls it)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        tree.body[0].body = body[1:]
    return ast.unparse(tree)


def _grads(model):
    return {n: g.copy() for n, _, g in model.named_parameters()}


@pytest.mark.parametrize("Model", [TinyGPT, Transformer])
def test_a_model_has_one_forward_and_one_backward(Model):
    """No twin passes, no decoding step and no strategy state in the model: the strategies are
    outside it; a KV cache is an argument of the one forward, not a second pass."""
    names = set(vars(Model))
    assert not {n for n in names if n.startswith(("_forward", "_backward", "_decode", "_lean"))}
    assert not names & {"lean_decode", "new_kv_caches", "_replicas", "_recompute"}
    source = _code(Model.forward) + _code(Model.backward)
    for word in ("replica", "recompute", "decode", "training", "Decoder"):
        assert word not in source, word
    assert list(inspect.signature(Model.forward).parameters)[-1:] in (["kv_cache"], ["padding_mask"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tinygpt_checkpointed_stack_equals_the_plain_stack(dtype):
    kw = dict(d_model=16, n_heads=2, n_layers=3, max_len=16, seed=2, dtype=dtype)
    plain, ck = TinyGPT(**kw), TinyGPT(gradient_checkpointing=True, **kw)
    assert type(plain.blocks) is BlockStack and type(ck.blocks) is Recompute
    x = _tokens(256)
    dz = np.random.default_rng(1).standard_normal((3, 10, 256)).astype(dtype)
    z0, z1 = plain.forward(x), ck.forward(x)
    assert np.array_equal(z0, z1)
    assert ck.blocks._saved is not None                              # only segment inputs kept
    plain.backward(dz)
    ck.backward(dz)
    g0, g1 = _grads(plain), _grads(ck)
    assert all(np.array_equal(g0[n], g1[n]) for n in g0)
    ck.eval()
    assert np.array_equal(ck.forward(x), z0) and ck.blocks._saved is None    # eval: plain


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transformer_checkpointed_stack_equals_the_plain_stack(dtype):
    kw = dict(vocab_size=14, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16, dropout=0.0,
              seed=3, dtype=dtype)
    plain, ck = Transformer(**kw), Transformer(gradient_checkpointing=True, **kw)
    x = _tokens(14)
    dz = np.random.default_rng(2).standard_normal((3, 10, 14)).astype(dtype)
    assert np.array_equal(plain.forward(x), ck.forward(x))
    plain.backward(dz)
    ck.backward(dz)
    g0, g1 = _grads(plain), _grads(ck)
    assert all(np.array_equal(g0[n], g1[n]) for n in g0)


@pytest.mark.parametrize("Model, V", [(TinyGPT, 256), (Transformer, 14)])
def test_batch_cut_on_one_thread_is_the_model(Model, V):
    """On one thread (as notebooks and tests run) ``BatchCut`` runs the model's own passes."""
    kw = dict(d_model=16, n_heads=2, n_layers=2, max_len=16, seed=4, dtype=np.float64)
    if Model is Transformer:
        kw.update(vocab_size=V, d_ff=32, dropout=0.0)
    a, b = Model(**kw), Model(**kw)
    x = _tokens(V)
    dz = np.random.default_rng(3).standard_normal((3, 10, V))
    net = BatchCut(b)
    assert np.array_equal(a.forward(x), net.forward(x)) and net.replicas.last is None
    a.backward(dz)
    net.backward(dz)
    g0, g1 = _grads(a), _grads(b)
    assert all(np.array_equal(g0[n], g1[n]) for n in g0)


def test_the_general_decode_step_is_the_models_forward_on_one_position():
    """The general cached step of a one-token prompt is the model's forward of that token."""
    model = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=16, seed=5).eval()
    x = _tokens(256, B=2, T=1)
    caches = kv_cache.new_caches(model, 2, lean=False)
    assert np.array_equal(model.forward(x, kv_cache=caches), model.forward(x))


@pytest.mark.parametrize("Block", [PreNormBlock, PostNormGPTBlock])
def test_modern_parts_with_defaults_build_tinygpts_block(Block):
    """``modern_parts()`` with its defaults gives the same layers as TinyGPT's parts: the same
    parameters from the same seed, the same output."""
    a = Block(8, 2, 16, dtype=np.float64, seed=4)
    b = Block(8, 2, 16, dtype=np.float64, seed=4, parts=modern_parts())
    c = Block(8, 2, 16, dtype=np.float64, seed=4, parts=TINYGPT_PARTS)
    for m in (b, c):
        assert [type(x) for x in m.modules()] == [type(x) for x in a.modules()]
        for (n0, p0, _), (n1, p1, _) in zip(a.named_parameters(), m.named_parameters()):
            assert n0 == n1 and np.array_equal(p0, p1)
    x = np.random.default_rng(5).standard_normal((2, 6, 8))
    assert np.array_equal(a(x), b(x)) and np.array_equal(a(x), c(x))
