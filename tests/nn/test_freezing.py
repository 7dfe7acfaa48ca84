"""Freezing (``Module.freeze``, PyTorch's ``requires_grad = False``): frozen weights never change,
their gradient products are never formed, and every other parameter gets the very update it gets
when the frozen ones' gradients are computed and thrown away. That reference is a model with
nothing frozen, trained through a view that shows the optimizer, the clipping and the loss scaler
only the parameters the frozen model trains (what LoRA's ``Adapters`` did before freezing
existed). Every comparison with it is bit for bit: a frozen layer's backward forms dX with the
same products on the same arrays, the clipping sums the same per-tensor squares in the same order,
and every update is elementwise.

With the batch cut across threads, mixed precision, gradient checkpointing, a resumed checkpoint,
two MPI ranks and ZeRO-1. (``tests/step_matrix.py`` adds frozen layers to the option matrix of
``tests/training/test_step_matrix.py``: 1, 2 and 3 threads, 2 ranks, four precisions.)"""
from pathlib import Path

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.nn import layers
from tformer.core import parallel
from tformer.training.checkpoint import load_checkpoint, read_checkpoint
from tformer.fast import linear as fast_linear
from tformer.nn.layers import Linear
from tformer.nn.lora import Adapters, LoRALinear, apply_lora
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW, clip_grad_norm
from tformer.training import batch_threads
from tformer.training.mpi import find_mpiexec, launch
from tformer.training.precision import MixedPrecision
from tformer.training.train import train

SHAPE = dict(d_model=16, n_heads=2, n_layers=2, max_len=8, vocab_size=64)
# Embeddings (W_pe's gradient TinyGPT's backward adds itself), a whole block, one projection, the head.
FROZEN = ("wte", "wpe", "blocks.0", "blocks.1.ffn.fc2", "lm_head")
B, T = 6, 8


def submodule(model, path):
    return dict(model.named_modules())[path]


def frozen_model(paths=FROZEN, **kw):
    model = TinyGPT(**SHAPE, seed=0, **kw)
    for path in paths:
        submodule(model, path).freeze()
    return model


def batch(i):
    w = np.random.default_rng([11, i]).integers(0, SHAPE["vocab_size"], (B, T + 1))
    return w[:, :-1], w[:, 1:]


def forward_loss(m, b):
    return F.cross_entropy(m.forward(b[0]), b[1])


class Trained:
    """A view of ``model`` that shows only the parameters named ``names`` (with their gradients)
    to an optimizer, the clipping and the loss scaler; the model still computes every gradient."""

    def __init__(self, model, names):
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "names", set(names))

    def __getattr__(self, name):
        return getattr(self.model, name)

    def named_parameters(self, prefix=""):
        return ((n, p, g) for n, p, g in self.model.named_parameters(prefix) if n in self.names)

    def flat_buffers(self):
        return None

    def forward(self, *a):
        return self.model.forward(*a)

    def backward(self, dy):
        return self.model.backward(dy)


def trained_names(model):
    return [n for n, _, g in model.named_parameters() if g is not None]


def params(model):
    return {n: p.copy() for n, p, _ in model.named_parameters()}


@pytest.fixture
def threads(monkeypatch):
    """Sets the thread count (restored after the test); every batch is worth cutting, and
    ``threads.cuts`` lists the cuts the batches got (None: run whole)."""
    before = parallel.get_num_threads()
    monkeypatch.setattr(batch_threads, "MIN_PART_MACS", 0)             # cut even this batch
    cuts, real_split = [], batch_threads.Replicas.split

    def spy(self, *a):
        cuts.append(real_split(self, *a))
        return cuts[-1]
    monkeypatch.setattr(batch_threads.Replicas, "split", spy)

    def set_threads(n):
        parallel.set_num_threads(n)
        cuts.clear()
    set_threads.cuts = cuts
    yield set_threads
    parallel.set_num_threads(before)


# threads, precision, gradient checkpointing
CASES = [(1, "fp32", False), (2, "fp32", False), (3, "fp32", True), (1, "fp16", False),
         (2, "bf16", True)]


@pytest.mark.parametrize("n_threads, precision, checkpointing", CASES)
def test_frozen_layers_stay_and_the_others_get_the_thrown_away_update(threads, n_threads,
                                                                     precision, checkpointing):
    threads(n_threads)
    runs = []
    for freeze in (True, False):
        model = frozen_model(FROZEN if freeze else (), gradient_checkpointing=checkpointing)
        view = model if freeze else Trained(model, trained_names(frozen_model()))
        mp = None if precision == "fp32" else MixedPrecision(model, precision, init_scale=2.0 ** 10)
        start = params(model)
        hist = train(view, AdamW(view, lr=1e-2, weight_decay=0.1), batch, forward_loss, 3,
                     clip_norm=0.5, progress_bar=False, precision=mp)
        runs.append((model, start, hist))
    (frozen, start, hist), (reference, _, ref_hist) = runs
    assert all(cut is not None and len(cut) == n_threads for cut in threads.cuts) \
        if n_threads > 1 else not any(threads.cuts)
    assert hist["grad_norm"] == ref_hist["grad_norm"] and hist["loss"] == ref_hist["loss"]
    assert hist.get("skipped", []) == []
    trained = set(trained_names(frozen))
    after, ref_after = params(frozen), params(reference)
    for name in after:
        if name in trained:
            assert not np.array_equal(after[name], start[name]), name
            assert np.array_equal(after[name], ref_after[name]), name
        else:
            assert np.array_equal(after[name], start[name]), name         # bit for bit unchanged
    G = frozen.flat_buffers()[1]                     # the frozen places of the buffer: zeros
    assert sum(np.count_nonzero(g) for _, _, g in frozen.named_parameters() if g is not None) \
        == np.count_nonzero(G)


def test_the_optimizer_keeps_no_state_and_the_norm_no_term_for_a_frozen_parameter():
    model = frozen_model()
    opt = AdamW(model)
    assert set(opt.state) == set(trained_names(model)) and opt.state
    assert not any(n.startswith(("wte.", "wpe.", "blocks.0.", "lm_head.")) for n in opt.state)
    model.zero_grad()
    model.backward(forward_loss(model, batch(0))[1])
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2))
                       for _, _, g in model.named_parameters() if g is not None))
    assert clip_grad_norm(model, 1e9) == pytest.approx(norm, rel=1e-6)


def _products(monkeypatch):
    """Patch the linear layers' products: a list that receives (M, K, N) of each 2-D product."""
    seen = []

    def counting(a, b, *args, **kwargs):
        if a.ndim == 2 and b.ndim == 2:
            seen.append((a.shape[0], a.shape[1], b.shape[1]))
        return real(a, b, *args, **kwargs)
    real = fast_linear.matmul
    monkeypatch.setattr(fast_linear, "matmul", counting)
    return seen


def _linears(model):
    return [m for m in model.modules() if isinstance(m, Linear)]


def test_a_frozen_weights_product_is_never_formed(monkeypatch):
    """The backward pass's products, counted: 2 per linear layer (dX = dY Wᵀ and dW = Xᵀ dY), one
    (dX) per frozen one; a frozen embedding runs no scatter-add."""
    seen = _products(monkeypatch)
    emb_calls = []
    real_emb = layers.fast_emb.embedding_backward
    monkeypatch.setattr(layers.fast_emb, "embedding_backward",
                        lambda *a: emb_calls.append(1) or real_emb(*a))
    N = B * T
    for freeze in (False, True):
        model = frozen_model(FROZEN if freeze else ())
        dlogits = forward_loss(model, batch(0))[1]
        seen.clear()
        emb_calls.clear()
        model.backward(dlogits)
        dX = sum(N * m.W.shape[0] * m.W.shape[1] for m in _linears(model))
        dW = sum(N * m.W.shape[0] * m.W.shape[1] for m in _linears(model) if not m.is_frozen("W"))
        assert sum(M * K * Nn for M, K, Nn in seen) == dX + dW
        weight_products = [s for s in seen if s[0] != N]          # Xᵀ dY: (C_in, N) @ (N, C_out)
        assert len(weight_products) == sum(not m.is_frozen("W") for m in _linears(model))
        assert len(emb_calls) == (0 if freeze else 1)
    assert dW < dX                                               # something was skipped


def test_tied_head_frozen_forms_no_weight_product(monkeypatch):
    seen = _products(monkeypatch)
    model = TinyGPT(**SHAPE, tie_embeddings=True, seed=0).freeze()
    model.blocks[1].attn.o.unfreeze()
    dlogits = forward_loss(model, batch(0))[1]
    seen.clear()
    model.backward(dlogits)
    assert [s for s in seen if s[0] != B * T] == [(16, B * T, 16)]    # W_o's alone
    assert trained_names(model) == ["blocks.1.attn.o.W", "blocks.1.attn.o.b"]


def test_freezing_is_a_choice_the_layer_reads_no_method_is_rebound():
    """``freeze`` only records the choice (``is_frozen``); each layer's own ``backward`` reads it.
    No instance holds a ``backward`` of its own, and ``TiedLinear`` defines its path without dW
    in its class, as ``Linear`` and ``Embedding`` do."""
    from tformer.nn.layers import Embedding
    from tformer.nn.modern_layers import TiedLinear
    model = TinyGPT(**SHAPE, tie_embeddings=True, seed=0).freeze()
    assert all("backward" not in vars(m) and "backward_without_dW" not in vars(m)
               for m in model.modules())
    for cls in (Linear, Embedding, TiedLinear):
        assert "backward_without_dW" in vars(cls)
        assert cls.backward.__code__.co_names.count("is_frozen") == 1
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 4, 6))
    lin = Linear(5, 6, dtype=np.float64, seed=1).freeze()
    lin(x)
    assert np.array_equal(lin.backward(dy), lin.backward_without_dW(dy))
    assert np.abs(lin.backward(dy) - dy @ lin.W.T).max() < 1e-12           # dX = dY Wᵀ
    assert not lin.grads["W"].any() and not lin.grads["b"].any()          # nothing accumulated


def test_a_trained_bias_of_a_frozen_weight_gets_its_gradient():
    """BitFit's case: W frozen, b trained; db = 1ᵀ dY, dX = dY Wᵀ as with nothing frozen."""
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 4, 6))
    a, b = Linear(5, 6, dtype=np.float64, seed=1), Linear(5, 6, dtype=np.float64, seed=1)
    a.freeze("W")
    a(x), b(x)
    assert np.array_equal(a.backward(dy), b.backward(dy))
    assert np.array_equal(a.grads["b"], b.grads["b"])
    assert [(n, g is None) for n, _, g in a.named_parameters()] == [("W", True), ("b", False)]
    assert not a.grads["W"].any()


def test_resume_from_a_checkpoint_is_the_straight_run(tmp_path):
    """4 steps straight, or 2, a checkpoint, and 2 more in a new process's objects: the same bits.
    The checkpoint holds every parameter and optimizer state for the trained ones only."""
    def run(steps, start=0, path=None):
        model = frozen_model()
        opt = AdamW(model, lr=1e-2, weight_decay=0.1)
        if start:
            load_checkpoint(path, model, opt)
        train(model, opt, batch, forward_loss, steps, start_step=start, clip_norm=0.5,
              checkpoint_path=path, checkpoint_every=2, progress_bar=False)
        return model
    straight = run(4)
    path = tmp_path / "ck.npz"
    run(2, path=path)
    _, model_state, optim_state = read_checkpoint(path)
    assert set(model_state) == {n for n, _, _ in straight.named_parameters()}
    assert {k.split(".", 1)[1] for k in optim_state if k.startswith(("m.", "v."))} \
        == set(trained_names(straight))
    resumed = run(4, start=2, path=path)
    assert all(np.array_equal(p, q) for p, q in zip(params(resumed).values(),
                                                    params(straight).values()))


def test_freezing_after_the_optimizer_was_made_turns_its_flat_sweep_off():
    model = TinyGPT(**SHAPE, seed=0)
    opt = AdamW(model, lr=1e-2, weight_decay=0.1)
    assert opt._flat is not None                     # one sweep over the flat buffers
    model.blocks[0].freeze()
    before = params(model)
    train(model, opt, batch, forward_loss, 2, progress_bar=False)
    after = params(model)
    assert all(np.array_equal(after[n], before[n]) == n.startswith("blocks.0.") for n in after)


def test_unfreeze_trains_again():
    model = frozen_model()
    model.unfreeze()
    assert all(g is not None for _, _, g in model.named_parameters())
    assert all("backward" not in vars(m) for m in model.modules())
    ref = TinyGPT(**SHAPE, seed=0)
    for m in (model, ref):
        m.zero_grad()
        m.backward(forward_loss(m, batch(0))[1])
    assert np.array_equal(model.flat_buffers()[1], ref.flat_buffers()[1])


def test_bad_input():
    with pytest.raises(ValueError, match=r"keys: expected parameters of Linear among \['W', 'b'\], "
                                         r"got \['w'\]"):
        Linear(3, 2).freeze("w")
    with pytest.raises(ValueError, match="every parameter is frozen"):
        AdamW(TinyGPT(**SHAPE).freeze())
    tied = TinyGPT(**SHAPE, tie_embeddings=True)
    tied.wte.freeze()                                # the head still trains the same array
    with pytest.raises(ValueError, match=r"'lm_head.W': a tied array, frozen under one name"):
        AdamW(tied)


# ---------------------------------------------------------------- LoRA through freezing

def test_lora_trains_what_it_trained_before_freezing(threads):
    """apply_lora freezes the model: only A and B keep a gradient, the layers without an adapter
    skip their dW. The adapters' training is bit for bit the one where every other gradient is
    computed and thrown away (LoRA before freezing existed), on 1 and 2 threads."""
    for n in (1, 2):
        threads(n)
        runs = []
        for thrown_away in (False, True):
            model = TinyGPT(**SHAPE, seed=0)
            apply_lora(model, 2, 4.0, "attn", seed=1)
            if thrown_away:
                model.unfreeze()                     # every gradient is computed again ...
                view = Trained(model, [n for n, _, _ in runs[0][1].named_parameters()])
            else:
                view = Adapters(model)               # ... this view shows only A and B
                assert trained_names(model) == [n for n, _, _ in view.named_parameters()]
                assert all(n.endswith((".A", ".B")) for n in trained_names(model))
                assert all(m.base.is_frozen("W") for m in model.modules() if isinstance(m, LoRALinear))
            hist = train(view, AdamW(view, lr=1e-2, weight_decay=0.0), batch, forward_loss, 3,
                         clip_norm=1.0, progress_bar=False)
            runs.append((model, view, hist))
        (a, va, ha), (b, vb, hb) = runs
        assert all((cut is not None) == (n > 1) for cut in threads.cuts) and threads.cuts
        assert ha["loss"] == hb["loss"] and ha["grad_norm"] == hb["grad_norm"]
        assert all(np.array_equal(p, q) for p, q in zip(params(a).values(), params(b).values()))


def test_lora_on_attention_skips_the_mlp_and_head_weight_products(monkeypatch):
    seen = _products(monkeypatch)
    model = TinyGPT(**SHAPE, seed=0)
    apply_lora(model, 4, targets="attn")
    dlogits = forward_loss(model, batch(0))[1]
    seen.clear()
    model.backward(dlogits)
    assert [s for s in seen if s[0] != B * T] == []            # no Xᵀ dY of any linear layer


# ---------------------------------------------------------------- MPI and ZeRO-1

WORKER = str(Path(__file__).resolve().parents[1] / "mpi_worker.py")


def _worker(tmp_path, name, *flags, n=None):
    import subprocess
    import sys
    out = tmp_path / f"{name}.npz"
    argv = [WORKER, *flags, "--out", str(out)]
    if n is None:
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
    else:
        r = launch(n, argv, timeout=300)
    assert r.returncode == 0, r.stderr
    return np.load(out)


def test_two_ranks_and_zero1_train_what_one_process_trains(tmp_path):
    """float64, no clipping: 2 ranks with the all-reduce and 2 ranks with ZeRO-1 (whose shards hold
    runs of trained numbers between frozen ones) agree bit for bit, the frozen parameters are the
    initial ones, and a checkpoint of the ZeRO-1 ranks resumes in one process where one process
    alone gets to (to 1e-12: the ranks' sums round differently)."""
    if find_mpiexec() is None:
        pytest.fail("no mpiexec beside this Python nor on PATH (requirements.txt installs MPICH's)")
    frozen = ["--freeze", "wte", "blocks.0.attn", "blocks.1.ln2", "lm_head"]
    flags = ["--dtype", "float64", *frozen]
    ck = tmp_path / "z.npz"
    dp = _worker(tmp_path, "dp", *flags, "--steps", "4", n=2)
    zero = _worker(tmp_path, "zero", *flags, "--steps", "4", "--zero", "--checkpoint", str(ck), n=2)
    np.testing.assert_array_equal(zero["P"], dp["P"])
    model = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, dtype="float64")
    for path in frozen[1:]:
        submodule(model, path).freeze()
    P0 = model.flat_buffers()[0]
    mask = model.frozen_mask()
    assert mask.any() and not mask.all()
    np.testing.assert_array_equal(zero["P"][mask], P0[mask])
    assert (zero["P"][~mask] != P0[~mask]).mean() > 0.9
    meta, _, opt = read_checkpoint(ck)
    assert meta["step"] == 4 and "m.blocks.0.ln1.gamma" in opt and "m.lm_head.W" not in opt
    one = _worker(tmp_path, "one", *flags, "--steps", "6")
    resumed = _worker(tmp_path, "resumed", *flags, "--steps", "6", "--resume", "--checkpoint", str(ck))
    assert np.abs(resumed["P"] - one["P"]).max() / np.abs(one["P"]).max() < 1e-12
    np.testing.assert_array_equal(resumed["P"][mask], P0[mask])
