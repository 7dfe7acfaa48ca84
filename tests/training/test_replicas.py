"""tformer.training.batch_threads: a TinyGPT training batch cut across threads (``BatchCut``, the
wrapper ``tformer.training.train`` trains through) gives the whole batch's logits and gradients (float64 to 1e-12, float32 to rounding, finite differences, PyTorch), only where it
should, and deterministically."""
import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.core import parallel
from tformer.training import batch_threads
from tformer.core.gradcheck import numerical_grad, rel_error
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW
from tformer.training.precision import MixedPrecision
from tformer.training.train import train


@pytest.fixture
def threads(monkeypatch):
    """Set the thread count inside a test (restored after it); every batch is worth cutting."""
    monkeypatch.setattr(batch_threads, "MIN_PART_MACS", 0)
    before = parallel.get_num_threads()
    yield parallel.set_num_threads
    parallel.set_num_threads(before)


CONFIGS = {
    "TinyGPT": {},
    "tied embeddings": dict(tie_embeddings=True),
    "gradient checkpointing": dict(gradient_checkpointing=True),
    "online softmax": dict(attention="flash"),
    "modern block": dict(norm="rmsnorm", positions="rope", mlp="swiglu", n_kv_heads=2),
    "post-norm": dict(norm_position="post"),
}


def _model(dtype=np.float64, **kw):
    """A small TinyGPT trained through ``BatchCut`` (as ``tformer.training.train`` trains every model)."""
    return batch_threads.BatchCut(TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=16,
                                          vocab_size=64, seed=0, dtype=dtype, **kw))


def _batch(B=5, T=16, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 64, (B, T)), rng.integers(0, 64, (B, T))


def _step(model, x, y, dlogits=None):
    """Forward, loss, backward (of ``dlogits`` if given, else of the mean cross-entropy)."""
    logits = model.forward(x)
    loss, d = F.cross_entropy(logits, y)
    model.backward(d if dlogits is None else dlogits)
    return logits, loss, {name: g.copy() for name, _, g in model.named_parameters()}


def test_parts_cover_the_batch_in_balanced_order():
    for B, n in [(1, 2), (2, 2), (5, 2), (5, 3), (32, 2), (7, 16)]:
        cut = batch_threads.parts(B, n)
        assert len(cut) == min(n, B)
        assert cut[0][0] == 0 and cut[-1][1] == B
        assert all(a[1] == b[0] for a, b in zip(cut, cut[1:]))
        sizes = [hi - lo for lo, hi in cut]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("n", [2, 3])
def test_cut_batch_gives_the_whole_batch_gradients_in_float64(threads, config, n):
    """Two steps (so gradients accumulate over two backward passes): the logits, the loss and every
    gradient of the cut batch equal the whole batch's to 1e-12 (float64 rounding of the sums)."""
    x, y = _batch()
    threads(1)
    whole = _model(**CONFIGS[config])
    ref = [_step(whole, x, y) for _ in range(2)][-1]
    threads(n)
    cut = _model(**CONFIGS[config])
    got = [_step(cut, x, y) for _ in range(2)][-1]
    assert cut.replicas.last is None and len(cut.replicas._copies) == n - 1   # it was cut
    assert rel_error(got[0], ref[0]) < 1e-12
    assert got[1] == pytest.approx(ref[1], rel=1e-12)
    for name, g in ref[2].items():
        assert rel_error(got[2][name], g, floor=1e-30) < 1e-12, name


def test_cut_batch_agrees_in_float32(threads):
    x, y = _batch(B=8)
    threads(1)
    ref = _step(_model(np.float32), x, y)
    threads(2)
    got = _step(_model(np.float32), x, y)
    assert rel_error(got[0], ref[0]) < 1e-5
    for name, g in ref[2].items():
        assert np.abs(got[2][name] - g).max() <= 1e-4 * np.abs(g).max() + 1e-12, name


def test_cut_batch_gradients_match_finite_differences(threads):
    """A random upstream gradient G on the logits: ∂⟨G, logits⟩/∂θ by central differences, for a
    few entries of every parameter, against the gradients the cut batch accumulates."""
    threads(2)
    model = _model()
    x, _ = _batch(B=4, T=8)
    G = np.random.default_rng(7).standard_normal((4, 8, 64))
    model.forward(x)
    model.backward(G)
    assert model.replicas.last is None and len(model.replicas._copies) == 1

    def scalar():
        return float(np.vdot(model.forward(x), G))

    rng = np.random.default_rng(0)
    for name, p, g in model.named_parameters():
        num, idx = numerical_grad(scalar, p, h=1e-6, rng=rng, max_entries=4)
        assert rel_error(g.reshape(-1)[idx], num, floor=1e-8) < 1e-6, name


def test_cut_batch_matches_pytorch(threads, torch):
    """The cut batch's gradients against the PyTorch twin's, in float64."""
    from tformer.bench import torch_gpt as tg
    threads(2)
    model = batch_threads.BatchCut(TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=16,
                                           vocab_size=256, seed=0, dtype=np.float64))
    tm = tg.from_tinygpt(model.model)
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 256, (6, 16)), rng.integers(0, 256, (6, 16))
    logits = model.forward(x)
    loss, d = F.cross_entropy(logits, y)
    model.backward(d)
    assert len(model.replicas._copies) == 1
    tl = torch.nn.functional.cross_entropy(tm(torch.from_numpy(x)).reshape(-1, 256),
                                           torch.from_numpy(y).reshape(-1))
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-12)
    theirs = tg.grads_as_tformer(tm, 2)
    for name, _, g in model.named_parameters():
        np.testing.assert_allclose(g, theirs[name], rtol=0, atol=1e-12, err_msg=name)


def test_training_with_threads_follows_one_thread(threads):
    """Ten float64 AdamW steps with clipping and two micro-batches per step through ``train``: the
    replicas see every update of the shared parameters, so the trajectories stay together."""
    rng = np.random.default_rng(5)
    batches = [tuple(rng.integers(0, 64, (2, 6, 16))) for _ in range(20)]

    def run(n):
        threads(n)
        model = _model().model                 # the model itself: train cuts its batches
        hist = train(model, AdamW(model, lr=1e-2), lambda i: batches[i],
                     lambda m, b: F.cross_entropy(m.forward(b[0]), b[1]), 10, accum_steps=2,
                     clip_norm=0.5, progress_bar=False)
        return np.array(hist["loss"]), model.state_dict()

    ref_loss, ref_params = run(1)
    made = []
    real = batch_threads.Replicas._replicate
    batch_threads.Replicas._replicate = lambda self: made.append(1) or real(self)
    try:
        loss, params = run(2)
    finally:
        batch_threads.Replicas._replicate = real
    assert made == [1]                         # one replica, made once, used for every step
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-10)
    for name, p in ref_params.items():
        np.testing.assert_allclose(params[name], p, rtol=0, atol=1e-10, err_msg=name)


def test_replicas_follow_load_state_dict_and_mixed_precision(threads):
    x, y = _batch(B=4)
    threads(2)
    model = _model(np.float32)
    _step(model, x, y)
    other = _model(np.float32)
    for _, p, _ in other.named_parameters():
        p *= 1.5
    model.load_state_dict(other.state_dict())
    model.zero_grad()
    threads(1)
    ref = _step(other, x, y)
    threads(2)
    got = _step(model, x, y)
    assert rel_error(got[0], ref[0]) < 1e-5
    # Mixed precision binds the layers to bfloat16 copies: every replica computes with them too.
    model.zero_grad()
    mp = MixedPrecision(model, "bf16")
    low = model.forward(x)
    (rep, _), = model.replicas._copies
    assert rep.blocks[0].attn.qkv.W is model.blocks[0].attn.qkv.W
    assert rep.blocks[0].attn.qkv.W.dtype == mp.dtype and low.dtype == mp.dtype
    mp.detach()
    assert model.forward(x).dtype == np.float32
    assert rep.blocks[0].attn.qkv.W is model.blocks[0].attn.qkv.params["W"]


def test_cut_only_where_it_should(threads, monkeypatch):
    x, y = _batch(B=4)
    threads(2)
    model = _model()
    model.forward(x)
    assert model.replicas.last == [(0, 2), (2, 4)]
    model.forward(x[:1])                                    # one sequence
    assert model.replicas.last is None
    model.eval()
    model.forward(x)                                        # evaluation
    assert model.replicas.last is None
    model.train()
    threads(1)
    model.forward(x)                                        # one thread
    assert model.replicas.last is None
    threads(2)
    monkeypatch.setattr(batch_threads, "MIN_PART_MACS", 10 ** 12)
    model.forward(x)                                        # too little work per part
    assert model.replicas.last is None
    monkeypatch.setattr(batch_threads, "MIN_PART_MACS", 0)
    drop = _model(dropout=0.1)
    drop.forward(x)                                         # dropout masks to draw
    assert drop.replicas.last is None


def test_cut_batch_is_deterministic_and_errors_reach_the_caller(threads):
    x, y = _batch(B=6)
    threads(2)
    runs = []
    for _ in range(2):
        model = _model(np.float32)
        opt = AdamW(model, lr=1e-2)
        for _ in range(3):
            model.zero_grad()
            _step(model, x, y)
            opt.step()
        runs.append(model.state_dict())
    for name, p in runs[0].items():
        assert np.array_equal(runs[1][name], p), name
    model = _model()
    logits = model.forward(x)
    with pytest.raises(ValueError, match="dlogits"):
        model.backward(logits[:, :-1])
    bad = x.copy()
    bad[5, 3] = 64                                          # out of the vocabulary, in part 2
    with pytest.raises(ValueError, match="tokens"):
        model.forward(bad)


def test_linear_forward_writes_into_out():
    """Each part's LM head writes its logits straight into its rows of the batch's array."""
    rng = np.random.default_rng(0)
    x, W, b = rng.standard_normal((4, 3, 5)), rng.standard_normal((5, 7)), rng.standard_normal(7)
    want, _ = F.linear_forward(x, W, b)
    buf = np.zeros((6, 3, 7))
    got, cache = F.linear_forward(x, W, b, out=buf[1:5])
    assert np.shares_memory(got, buf) and np.array_equal(buf[1:5], want)
    assert not buf[0].any() and not buf[5].any()
    dx, dW, db = F.linear_backward(rng.standard_normal((4, 3, 7)), cache)
    assert dx.shape == x.shape and dW.shape == W.shape
    for bad in (np.zeros((4, 3, 7), np.float32), np.zeros((4, 3, 6)), np.zeros((4, 7, 3)).swapaxes(1, 2),
                [[0.0]]):
        with pytest.raises(ValueError, match="out"):
            F.linear_forward(x, W, b, out=bad)
