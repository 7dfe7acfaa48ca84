"""Every training option composes with every way of running a step: the gradient handed to the
optimizer at 2 and 3 threads (the batch cut across threads) and on 2 MPI ranks equals one
thread's, at the same weights, for every configuration × precision of ``tests/step_matrix.py``
(frozen layers among them: their places in the flat gradient are exactly zero everywhere).

Bounds, as ‖g_n − g_1‖ / ‖g_1‖ over each step's whole gradient:
- float64: 1e-12 (only the order of a few sums changes);
- float32: 1e-5, bfloat16: 2⁻⁷, float16: 2⁻¹⁰ — twice each format's unit roundoff u (2⁻²⁴ for
  float32, 2⁻⁸ for bfloat16's 8 significant bits, 2⁻¹¹ for float16's 11), float32's widened to
  1e-5 for the accumulation of T·B products. A part cut off at other boundaries rounds its
  activations differently, and a value that lands on the other side of a rounding boundary moves
  by one unit in the last place; a part that computes with other weights than the model's (the
  bug this file was written for: replicas kept stale low-precision copies) moves the gradient by
  its own size, ‖g_n − g_1‖ / ‖g_1‖ ≈ 1.

Then one short training run per precision at the defaults, cut across 2 threads, must end where one
thread's ends: a gradient computed at the wrong weights cannot do that.
"""
import functools
import os
from pathlib import Path

import numpy as np
import pytest

import step_matrix as sm
from tformer.nn import functional as F
from tformer.core import parallel
from tformer.training import batch_threads
from tformer.training.mpi import find_mpiexec, launch
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW
from tformer.training.precision import precision_policy
from tformer.training.train import train

BOUND = {"float64": 1e-12, "float32": 1e-5, "bf16": 2.0 ** -7, "fp16": 2.0 ** -10}
CASES = [(c, p) for c in sm.CONFIGS for p in sm.PRECISIONS]


@pytest.fixture
def cut_everything(monkeypatch):
    """Every batch is worth cutting; the thread count is restored after the test. Yields the cuts
    ``Replicas.split`` chose (None where a batch ran whole)."""
    monkeypatch.setattr(batch_threads, "MIN_PART_MACS", 0)
    cuts, real_split = [], batch_threads.Replicas.split

    def spy(self, *a):
        cuts.append(real_split(self, *a))
        return cuts[-1]
    monkeypatch.setattr(batch_threads.Replicas, "split", spy)
    before = parallel.get_num_threads()
    yield cuts
    parallel.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def one_thread(config, precision):
    before = parallel.get_num_threads()
    parallel.set_num_threads(1)
    try:
        return sm.step_grads(config, precision)
    finally:
        parallel.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def frozen_places(config):
    return sm.frozen_places(config)


def _check(got, ref, precision, where, config=None):
    frozen = frozen_places(config) if config is not None else None
    if frozen is not None:
        assert not got[:, frozen].any(), f"{where}: a frozen parameter has a gradient"
    for k in range(sm.STEPS):
        err = sm.rel_norm(got[k], ref[k])
        assert err < BOUND[precision], (f"{where}, step {k + 1}: ‖g − g₁‖/‖g₁‖ = {err:.3g}, "
                                        f"bound {BOUND[precision]:.3g}")


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("config,precision", CASES)
def test_threads_hand_the_optimizer_one_threads_gradient(config, precision, threads,
                                                         cut_everything):
    ref = one_thread(config, precision)
    parallel.set_num_threads(threads)
    model_parts = []
    real_split = batch_threads.Replicas.split

    def spy(self, *a):                      # the batch really was cut
        cut = real_split(self, *a)
        model_parts.append(cut)
        return cut
    batch_threads.Replicas.split = spy
    try:
        got = sm.step_grads(config, precision)
    finally:
        batch_threads.Replicas.split = real_split
    assert any(cut is not None and len(cut) == threads for cut in model_parts)
    _check(got, ref, precision, f"{config}, {precision}, {threads} threads", config)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    if find_mpiexec() is None:
        pytest.fail("no mpiexec beside this Python nor on PATH (requirements.txt installs MPICH's)")
    out = tmp_path_factory.mktemp("ranks") / "grads.npz"
    worker = str(Path(sm.__file__))
    r = launch(2, [worker, "--out", str(out)], timeout=600,
               env={**os.environ, "TFORMER_NUM_THREADS": "1",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(sm.__file__).parent),
                                                                os.environ.get("PYTHONPATH")]))})
    assert r.returncode == 0, r.stderr
    return dict(np.load(out))


@pytest.mark.parametrize("config,precision", CASES)
def test_two_ranks_hand_the_optimizer_one_process_gradient(config, precision, two_ranks):
    _check(two_ranks[f"{config}|{precision}"], one_thread(config, precision), precision,
           f"{config}, {precision}, 2 MPI ranks", config)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_training_cut_across_threads_ends_where_one_thread_ends(precision, cut_everything):
    """40 AdamW steps of a small TinyGPT on a sequence in which each byte is a function of the two
    before it: from ln 32 ≈ 3.47 nats, one thread's run ends near 0.1, and the run cut across 2
    threads must end within 0.05 nats of it (rounding moves it by about 0.01; with half of each
    batch's gradient taken at stale weights, as in the bug this file was written for, the cut
    run stalled at 1.85)."""
    rng = np.random.default_rng(0)
    table = rng.integers(0, 32, (32, 32))
    seq = [1, 2]
    for _ in range(4000):
        seq.append(int(table[seq[-2], seq[-1]]))
    seq = np.array(seq)

    def batch(i):
        starts = np.random.default_rng([5, i]).integers(0, seq.size - 33, 8)
        w = np.stack([seq[s:s + 33] for s in starts])
        return w[:, :-1], w[:, 1:]

    def run(n):
        parallel.set_num_threads(n)
        model = TinyGPT(d_model=64, n_heads=4, n_layers=2, max_len=32, vocab_size=32, seed=0)
        mp = precision_policy(model, precision)
        hist = train(model, AdamW(model, lr=1e-2, betas=(0.9, 0.95)), batch,
                     lambda m, b: F.cross_entropy(m.forward(b[0]), b[1]), 40,
                     clip_norm=1.0, progress_bar=False, precision=mp)
        return np.mean(hist["loss"][-5:]), hist["loss"][0], model

    one, start, _ = run(1)
    two, _, model = run(2)
    assert any(cut is not None for cut in cut_everything), "the batch was not cut"
    assert start > 3.4 and one < 0.2, f"{precision}: one thread {start:.3f} -> {one:.3f}"
    assert abs(two - one) < 0.05, f"{precision}: 2 threads {two:.4f}, 1 thread {one:.4f}"
