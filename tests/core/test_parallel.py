"""tformer.core.parallel: results for every thread count and the pool's contract. (The causal attention
path against the masked one: tests/kernels/test_fast_attention.py.)"""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.core import parallel
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW


@pytest.fixture
def threads():
    """Set the thread count inside a test; the count from before the test is restored after it."""
    before = parallel.get_num_threads()
    yield parallel.set_num_threads
    parallel.set_num_threads(before)


def _train_step(n_threads, set_threads):
    """Forward and backward of a float32 TinyGPT, big enough that every kernel splits (B·T = 1024 rows)."""
    set_threads(n_threads)
    model = TinyGPT(d_model=64, n_heads=4, n_layers=2, max_len=64, vocab_size=256, seed=0)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (16, 64)), rng.integers(0, 256, (16, 64))
    logits = model.forward(x)
    loss, dlogits = F.cross_entropy(logits, y)
    model.backward(dlogits)
    grads = {name: g.copy() for name, _, g in model.named_parameters()}
    return logits, loss, grads


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_gradients_agree_for_1_2_and_3_threads(threads):
    """Matrix products agree to float32 rounding only: OpenBLAS itself gives different last bits for
    a block of rows than for the whole product (and for 1 thread than for 2)."""
    ref_logits, ref_loss, ref_grads = _train_step(1, threads)
    for n in (2, 3):
        logits, loss, grads = _train_step(n, threads)
        assert _rel(logits, ref_logits) < 1e-5, n
        assert abs(loss - ref_loss) < 1e-5 * abs(ref_loss), n
        for name in ref_grads:
            assert _rel(grads[name], ref_grads[name]) < 1e-4, (n, name)


def test_adamw_step_gives_the_same_bits_for_every_thread_count(threads):
    """Parameters are dealt to threads whole; each update is elementwise."""
    results = []
    for n in (1, 2, 3):
        threads(n)
        model = TinyGPT(d_model=64, n_heads=4, n_layers=2, max_len=64, vocab_size=256, seed=0)
        rng = np.random.default_rng(0)
        for _, _, g in model.named_parameters():
            g[...] = rng.standard_normal(g.shape)
        opt = AdamW(model, lr=1e-3)
        opt.step()
        opt.step()
        results.append(model.state_dict())
    for other in results[1:]:
        for name, p in results[0].items():
            assert np.array_equal(other[name], p), name


def test_elementwise_and_row_kernels_give_the_same_bits_for_every_thread_count(threads):
    """Everything but the matrix products is split only along independent rows or elements, so the
    arithmetic of each element is the same whatever the thread count."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1024, 64)).astype(np.float32)
    gamma, beta = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
    h, dh = (rng.standard_normal((1024, 256)).astype(np.float32) for _ in range(2))
    t = rng.integers(0, 256, 1024)
    q, k, v, dy = (rng.standard_normal((16, 4, 64, 16)).astype(np.float32) for _ in range(4))

    def kernels():
        y, c = F.layernorm_forward(x, gamma, beta)
        g, gc = F.gelu_forward(h)
        a, ac = F.attention_forward(q, k, v, is_causal=True)
        loss, dz = F.cross_entropy(h, t)
        return [y, *F.layernorm_backward(x, c), g, F.gelu_backward(dh, gc), a, *F.attention_backward(dy, ac),
                np.array(loss), dz]

    threads(1)
    ref = kernels()
    for n in (2, 3):
        threads(n)
        for i, (got, want) in enumerate(zip(kernels(), ref)):
            assert np.array_equal(got, want), (n, i)


def test_parallel_for_covers_the_range_once_in_order_of_parts(threads):
    threads(3)
    for n, grain in [(0, 1), (1, 1), (7, 1), (100, 1), (1000, 1), (1000, 600), (4096, 8)]:
        hits = np.zeros(n, int)
        seen_threads = set()

        def fn(lo, hi):
            hits[lo:hi] += 1
            seen_threads.add(threading.get_ident())

        parallel.parallel_for(fn, n, grain)
        assert (hits == 1).all(), (n, grain)
        expected_parts = min(3, max(1, n // grain))
        assert len(seen_threads) <= expected_parts


def test_nested_calls_run_serially_and_errors_reach_the_caller(threads):
    threads(2)
    inner_calls = []

    def outer(lo, hi):
        parallel.parallel_for(lambda a, b: inner_calls.append((a, b)), 1000)

    parallel.parallel_for(outer, 2)
    assert sorted(inner_calls) == [(0, 1000), (0, 1000)]     # each part ran the inner loop whole

    def boom(lo, hi):
        if lo > 0:
            raise RuntimeError("part failed")

    with pytest.raises(RuntimeError, match="part failed"):
        parallel.parallel_for(boom, 100)
    assert parallel.run_tasks(lambda: 1, lambda: 2, lambda: 3) == [1, 2, 3]


def test_the_caller_runs_the_parts_no_worker_claimed(threads):
    """A worker that is busy (or not yet scheduled) delays nothing: the calling thread
    claims and runs every part itself, and a late worker finds nothing left to do."""
    threads(2)
    release = threading.Event()
    parallel._workers().jobs.put(lambda: release.wait(30))     # the one worker is busy
    try:
        seen = []
        parallel.parallel_for(
            lambda lo, hi: seen.append((lo, hi, threading.get_ident())), 1000)
        assert len(seen) == 2 and {s[2] for s in seen} == {threading.get_ident()}
        assert sorted(s[:2] for s in seen)[0][0] == 0
        assert sum(hi - lo for lo, hi, _ in seen) == 1000
        assert parallel.run_tasks(lambda: threading.get_ident(), lambda: 7) == [
            threading.get_ident(), 7]
    finally:
        release.set()
    parallel.parallel_for(lambda lo, hi: None, 1000)       # the pool still works after


def test_set_num_threads_rejects_bad_counts_and_limits_blas(threads):
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="n: expected an integer"):
            parallel.set_num_threads(bad)
    from threadpoolctl import threadpool_info
    threads(2)
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    assert blas and all(i["num_threads"] == 1 for i in blas)
    assert threads(1) == 2 and parallel.get_num_threads() == 1


def test_env_var_limits_blas_even_when_tformer_is_imported_before_numpy():
    code = ("import tformer.core.parallel as P; from threadpoolctl import threadpool_info; "
            "print(P.get_num_threads(), [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'])")
    env = dict(os.environ, TFORMER_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "[1]"]
    env["TFORMER_NUM_THREADS"] = "two"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "TFORMER_NUM_THREADS: expected an integer" in out.stderr


def test_scratch_is_reused_per_thread_and_slot_and_grows():
    a = parallel.scratch("test_slot", (4, 8), np.float32)
    b = parallel.scratch("test_slot", (2, 3), np.float32)
    assert a.shape == (4, 8) and b.shape == (2, 3) and np.shares_memory(a, b)
    assert not np.shares_memory(a, parallel.scratch("other_slot", (4, 8), np.float32))
    assert not np.shares_memory(a, parallel.scratch("test_slot", (4, 8), np.float64))
    big = parallel.scratch("test_slot", (100, 100), np.float32)
    assert big.shape == (100, 100)
    box = []
    t = threading.Thread(target=lambda: box.append(parallel.scratch("test_slot", (100, 100), np.float32)))
    t.start()
    t.join()
    assert not np.shares_memory(big, box[0])


def test_attention_writes_into_out_views_and_checks_them():
    rng = np.random.default_rng(2)
    B, H, T, D = 2, 3, 70, 4
    q, k, v, dy = (rng.standard_normal((B, H, T, D)) for _ in range(4))
    for kw in ({"is_causal": True}, {"mask": F.causal_mask(T)}):
        y_ref, cache = F.attention_forward(q, k, v, **kw)
        merged = np.empty((B, T, H * D))
        view = merged.reshape(B, T, H, D).transpose(0, 2, 1, 3)
        y, _ = F.attention_forward(q, k, v, out=view, **kw)
        assert y is view and np.array_equal(merged, F.merge_heads(y_ref))
        ref = F.attention_backward(dy, cache)
        bufs = tuple(np.empty((B, H, T, D)) for _ in range(3))
        got = F.attention_backward(dy, cache, out=bufs)
        assert all(g is b and np.array_equal(g, r) for g, b, r in zip(got, bufs, ref))
        with pytest.raises(ValueError, match=r"out\[1\] \(dk\): expected a float64 array of shape"):
            F.attention_backward(dy, cache, out=(bufs[0], np.empty((B, H, T, D + 1)), bufs[2]))
        with pytest.raises(ValueError, match="out: expected a float64 array"):
            F.attention_forward(q, k, v, out=np.empty((B, H, T, D), np.float32), **kw)


def test_gelu_backward_into_out_and_into_dy_itself(threads):
    threads(2)
    rng = np.random.default_rng(3)
    x, dy = (rng.standard_normal((64, 1024)).astype(np.float32) for _ in range(2))
    _, cache = F.gelu_forward(x)
    ref = F.gelu_backward(dy, cache)
    out = np.empty_like(dy)
    assert F.gelu_backward(dy, cache, out=out) is out and np.array_equal(out, ref)
    alias = dy.copy()
    F.gelu_backward(alias, cache, out=alias)
    assert np.array_equal(alias, ref)
    with pytest.raises(ValueError, match="out: expected a C-contiguous float32 array of shape"):
        F.gelu_backward(dy, cache, out=np.empty((64, 1024)))


def test_linear_backward_accumulates_into_running_gradients(threads):
    threads(2)
    rng = np.random.default_rng(4)
    x, W, b = rng.standard_normal((300, 40)), rng.standard_normal((40, 30)), rng.standard_normal(30)
    y, cache = F.linear_forward(x, W, b)
    dy = rng.standard_normal(y.shape)
    dx, dW, db = F.linear_backward(dy, cache)
    gW, gb = rng.standard_normal(W.shape), rng.standard_normal(30)
    want_W, want_b = gW + dW, gb + db
    dx2, gW2, gb2 = F.linear_backward(dy, cache, accumulate=(gW, gb))
    assert gW2 is gW and gb2 is gb and np.array_equal(dx2, dx)
    assert np.array_equal(gW, want_W) and np.array_equal(gb, want_b)
    with pytest.raises(ValueError, match=r"accumulate: expected arrays of shapes \(40, 30\) and \(30,\)"):
        F.linear_backward(dy, cache, accumulate=(np.zeros((30, 40)), gb))


def test_two_calling_threads_share_the_workers_without_mixing_results(threads):
    threads(3)
    out = {}

    def caller(tag):
        got = []
        for k in range(200):
            a, b, c = parallel.run_tasks(lambda: (tag, k, 0), lambda: (tag, k, 1), lambda: (tag, k, 2))
            got.append(a == (tag, k, 0) and b == (tag, k, 1) and c == (tag, k, 2))
        out[tag] = all(got)

    callers = [threading.Thread(target=caller, args=(tag,)) for tag in "ab"]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert out == {"a": True, "b": True}


def test_an_error_is_raised_only_after_every_part_has_finished(threads):
    threads(2)
    finished = []

    def part(lo, hi):
        if lo == 0:
            raise RuntimeError("first part failed")
        time.sleep(0.05)
        finished.append((lo, hi))

    with pytest.raises(RuntimeError, match="first part failed"):
        parallel.parallel_for(part, 100)
    assert len(finished) == 1 and finished[0][1] == 100     # the other part ran to its end


@pytest.mark.parametrize("kw", [{}, {"n_kv_heads": 2}, {"rope": True}, {"fused_qkv": True}])
def test_kv_cache_decoding_paths_equal_the_full_causal_pass(kw):
    """A prompt entering an empty cache takes the causal path; each later single token takes the
    unmasked one (it may see every cached key): both equal rows of one full causal pass."""
    from tformer.nn.attention import MultiHeadAttention
    att = MultiHeadAttention(16, n_heads=4, causal=True, dtype=np.float64, seed=1, **kw)
    x = np.random.default_rng(6).standard_normal((2, 9, 16))
    full = att(x)
    cache = att.new_cache(2, 9)
    parts = [att.forward(x[:, :5], kv_cache=cache)]
    parts += [att.forward(x[:, t:t + 1], kv_cache=cache) for t in range(5, 9)]
    assert np.abs(np.concatenate(parts, axis=1) - full).max() < 1e-12


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2
                    or parallel._current_cpu() is None,
                    reason="needs per-thread CPU affinity, sched_getcpu and two CPUs")
def test_workers_are_kept_off_the_callers_cpu(threads):
    """Linux wakes a thread on its waker's CPU when it judges them to share data; the pool keeps
    its workers off the caller's CPU so that the parts run side by side."""
    threads(2)
    parallel.parallel_for(lambda lo, hi: None, 1000)
    pool = parallel._workers()
    cpu = pool._steered_from
    assert cpu in os.sched_getaffinity(0)
    for t in pool.threads:
        assert os.sched_getaffinity(t.native_id) == os.sched_getaffinity(0) - {cpu}


def test_a_refused_affinity_call_stops_steering_not_the_work(threads, monkeypatch):
    """Where the system refuses to set a thread's affinity, the parts still run, unsteered."""
    threads(2)
    parallel._workers()._steered_from = None
    monkeypatch.setattr(parallel, "_current_cpu", lambda: 0)

    def refuse(*args):
        raise PermissionError("not allowed here")

    monkeypatch.setattr(parallel.os, "sched_setaffinity", refuse, raising=False)
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    hits = np.zeros(1000, int)

    def fn(lo, hi):
        hits[lo:hi] += 1

    parallel.parallel_for(fn, 1000)
    parallel.parallel_for(fn, 1000)
    assert (hits == 2).all() and parallel._workers()._steered_from == -1
