"""One TinyGPT training step, timed in tformer and in PyTorch, with its peak memory.

A step is ``zero_grad``, forward, mean cross-entropy, backward, AdamW update, in float32, on one
fixed batch of random bytes. Each ``worker_*`` function runs in a fresh subprocess of the driver
(``run.py``), so neither side inherits the other's thread pools or allocator state.

Memory: peak resident set size (``VmHWM`` in ``/proc/self/status``, which sees every allocation of
NumPy, PyTorch and their BLAS alike) minus the RSS right after the imports: what the model, the
optimizer and training cost the process, allocator caches included. The torch side's weight-copy
setup is excluded by resetting the peak (``/proc/self/clear_refs``) before the model under test is
built. For tformer the ``tracemalloc`` peak of one step (NumPy reports its buffers to it) is given too.
"""
import time

from tformer.core.rss import reset_peak, status_bytes
from tformer.bench.workload import OPT, SIZES, VOCAB, batch, tformer_step_fn, tinygpt  # noqa: F401 (re-exported)

TARGET_RATIO, TARGET_PEAK = 1.0, 0.75
MALLOC_TUNED = {"MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}


def status_kb(key):
    """``/proc/self/status`` entry ``key`` in kB (``tformer.core.rss``), 0 where it is unknown."""
    return (status_bytes(key) or 0) // 1024


def torch_step_fn(tm, opt, x, y):
    from torch.nn import functional as TF

    def step():
        opt.zero_grad(set_to_none=True)
        logits = tm(x)                                                  # (B, T, V)
        loss = TF.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
        loss.backward()
        opt.step()
        return loss.item()
    return step


def time_steps(step, warmup, steps, min_time=0.0):
    """Wall and CPU seconds of each timed step, after ``warmup`` untimed ones: at least ``steps``
    steps, and more until they add up to ``min_time`` seconds (a 20 ms step is then timed often
    enough that its median does not hang on a few of them)."""
    for _ in range(warmup):
        step()
    wall, cpu = [], []
    while len(wall) < steps or sum(wall) < min_time:
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def have_torch():
    """True when PyTorch can be imported."""
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def worker_tformer(size, warmup, steps, threads, profile=True, min_time=0.0, B=None):
    """Time ``steps`` steps after ``warmup``; peak memory; a per-op profile of the step.
    ``B``: a batch of this many sequences instead of the size's own (one thread's part)."""
    import tracemalloc

    from tformer.core import parallel
    from tformer.training.optim import AdamW
    base_kb = status_kb("VmRSS")
    s = SIZES[size]
    x, y = batch(B or s["B"], s["T"])
    model = tinygpt(size)
    opt = AdamW(model, **OPT)
    step = tformer_step_fn(model, opt, x, y)
    wall, cpu = time_steps(step, warmup, steps, min_time)
    peak_kb = status_kb("VmHWM")
    tracemalloc.start()                       # one more step, untimed, with allocation tracing
    before, _ = tracemalloc.get_traced_memory()
    loss = float(step())
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out = dict(times=wall, cpu_times=cpu, loss=loss, peak_mb=(peak_kb - base_kb) / 1024,
                tracemalloc_step_peak_mb=(traced_peak - before) / 2**20,
                n_params=int(model.num_parameters()), tformer_threads=parallel.get_num_threads())
    if profile:
        from tformer.bench import op_profile as prof
        # warmup=1: profile_step builds a new step (a new BatchCut), whose first call makes the
        # replicas; profiled, that copy showed as 100-400 ms of "glue" that no later step pays.
        rows, total = prof.profile_step(model, opt, x, y, steps=2, warmup=1,
                                        clock="cpu" if parallel.get_num_threads() == 1 else "wall")
        out["profile"] = dict(step_ms=total * 1e3, categories=prof.group(rows),
                              top=[(n, round(ms, 3)) for n, ms, _, _ in rows[:8]])
    return out


def worker_torch(size, warmup, steps, threads, min_time=0.0):
    """The PyTorch twin: equivalence asserted (the same loss before and after an AdamW step), then
    timed as ``worker_tformer``. ``threads=None`` leaves PyTorch on its default thread count."""
    import torch

    from tformer.training.optim import AdamW
    from tformer.bench.torch_gpt import from_tinygpt
    if threads is not None:
        torch.set_num_threads(threads)
    base_kb = status_kb("VmRSS")
    s = SIZES[size]
    x, y = batch(s["B"], s["T"])
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    # Equivalence: same weights, same loss before and after one AdamW step.
    ref = tinygpt(size)
    tm = from_tinygpt(ref)
    ref_step = tformer_step_fn(ref, AdamW(ref, **OPT), x, y)
    t_step = torch_step_fn(tm, torch.optim.AdamW(tm.parameters(), **OPT), xt, yt)
    losses = [(ref_step(), t_step()), (ref_step(), t_step())]
    for i, (a, b) in enumerate(losses):
        if not abs(a - b) <= 1e-4 * abs(a) + 1e-5:
            raise AssertionError(f"{size}: tformer loss {a:.6f} != torch loss {b:.6f} at check {i}")
    del ref, tm, ref_step, t_step

    # The model under test, built fresh (the same initial weights) after resetting the memory peak.
    if reset_peak():
        base_kb = min(base_kb, status_kb("VmRSS"))
    tm = from_tinygpt(tinygpt(size))
    step = torch_step_fn(tm, torch.optim.AdamW(tm.parameters(), **OPT), xt, yt)
    wall, cpu = time_steps(step, warmup, steps, min_time)
    peak_kb = status_kb("VmHWM")
    return dict(times=wall, cpu_times=cpu, loss=float(step()), peak_mb=(peak_kb - base_kb) / 1024,
                loss_check=[list(p) for p in losses], torch=torch.__version__,
                torch_threads=torch.get_num_threads(),
                n_params=int(sum(p.numel() for p in tm.parameters())))


def worker_gemm(threads):
    """Best float32 GEMM rate over square sizes 1024..4096 (a few repeats each), in GFLOP/s, with
    BLAS on ``threads`` threads (None: its default, every core)."""
    import numpy as np
    from threadpoolctl import threadpool_info
    rng = np.random.default_rng(0)
    per_n = {}
    for n in (1024, 2048, 3072, 4096):
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = np.empty((n, n), np.float32)
        np.matmul(a, b, out=c)
        best = 0.0
        for _ in range(3 if n >= 3072 else 5):
            t0 = time.perf_counter()
            np.matmul(a, b, out=c)
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t0) / 1e9)
        per_n[n] = best
    blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    return dict(gflops=max(per_n.values()), per_n=per_n, threads=blas[0] if blas else threads,
                numpy=np.__version__)
