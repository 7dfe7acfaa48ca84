"""``make bench``: one TinyGPT training step in tformer and in PyTorch, side by side, against the GEMM peak.

    python benchmarks/run.py [--sizes small,medium,large] [--steps N] [--warmup N] [--threads N]
                             [--malloc default|tuned|both] [--out benchmarks/results] [--no-torch]

Each (size, side) runs in its own fresh subprocess, so neither side inherits the other's thread
pools, allocator state or spinning OpenMP workers. ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` and
``MKL_NUM_THREADS`` are set to ``--threads`` (default: every core), and so are
``torch.set_num_threads`` and tformer's own ``TFORMER_NUM_THREADS`` (``tformer.parallel``). A step
is ``zero_grad``, forward, mean cross-entropy, backward, AdamW update, in float32,
on one fixed batch; reported: the median wall time of ``--steps`` steps after ``--warmup`` (and
the process CPU time, and the load average of the machine around each run, since other work on
the machine inflates wall times).

Before timing, the torch subprocess builds the TinyGPT with the same seed, copies its weights into
the PyTorch twin (``torch_gpt.py``) and asserts that the losses agree, before and after one AdamW step.

Allocator (``--malloc``): ``default`` runs both sides as a user would; ``tuned`` runs both with
``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_MMAP_THRESHOLD_`` raised, so that glibc keeps freed memory
instead of handing it back to the kernel and faulting it in again, one 4 KiB page at a time, on the
next step (``both``, the default, measures both; the headline is ``default``).

Memory: peak resident set size (``VmHWM`` in ``/proc/self/status``, which sees every allocation of
NumPy, PyTorch and their BLAS alike) minus the RSS right after the imports: what the model, the
optimizer and training cost the process, allocator caches included. The torch side's weight-copy
setup is excluded by resetting the peak (``/proc/self/clear_refs``) before the model under test is
built. For tformer the ``tracemalloc`` peak of one step (NumPy reports its buffers to it) is given too.

The GEMM peak is the best float32 ``A @ B`` rate NumPy (OpenBLAS) reaches on square matrices with the
same thread count; GFLOP/s count matrix products only (``flops.py``). The tformer worker also records
a per-op profile of its step (``op_profile.py``). Writes ``bench.json`` and ``bench.png`` under ``--out``.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# `python benchmarks/run.py` puts benchmarks/ first on sys.path: take it off (its file names are not
# package names) and load the siblings by path.
if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == HERE:
    sys.path.pop(0)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZES = {
    "small": dict(d_model=64, n_heads=4, n_layers=2, T=64, B=32),
    "medium": dict(d_model=256, n_heads=8, n_layers=4, T=128, B=16),
    "large": dict(d_model=512, n_heads=8, n_layers=4, T=256, B=8),
}
VOCAB = 256
OPT = dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
TARGET_RATIO, TARGET_PEAK = 1.0, 0.40
MALLOC_TUNED = {"MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}


def load_sibling(name):
    """Import ``benchmarks/<name>.py`` by file path (benchmarks/ is not a package, nor on sys.path)."""
    import importlib.util
    key = f"tformer_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


# --- the workers (each runs in its own subprocess) ------------------------------------------------

def _status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak():
    """Reset VmHWM to the current RSS (Linux ≥ 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _batch(B, T, seed=0):
    import numpy as np
    tok = np.random.default_rng(seed).integers(0, VOCAB, (B, T + 1))
    return tok[:, :-1].copy(), tok[:, 1:].copy()                        # (B, T) inputs, targets


def _tinygpt(size, dtype="float32"):
    from tformer.models.tinygpt import TinyGPT
    s = SIZES[size]
    return TinyGPT(d_model=s["d_model"], n_heads=s["n_heads"], n_layers=s["n_layers"], max_len=s["T"],
                   vocab_size=VOCAB, seed=0, dtype=dtype)


def _tformer_step_fn(model, opt, x, y):
    from tformer import functional as F

    def step():
        model.zero_grad()
        logits = model.forward(x)                                       # (B, T, V)
        loss, dlogits = F.cross_entropy(logits, y)
        model.backward(dlogits)
        opt.step()
        return loss
    return step


def _torch_step_fn(tm, opt, x, y):
    from torch.nn import functional as TF

    def step():
        opt.zero_grad(set_to_none=True)
        logits = tm(x)                                                  # (B, T, V)
        loss = TF.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
        loss.backward()
        opt.step()
        return loss.item()
    return step


def _time(step, warmup, steps):
    for _ in range(warmup):
        step()
    wall, cpu = [], []
    for _ in range(steps):
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def worker_tformer(size, warmup, steps, threads):
    import tracemalloc

    from tformer import parallel
    from tformer.optim import AdamW
    base_kb = _status_kb("VmRSS")
    s = SIZES[size]
    x, y = _batch(s["B"], s["T"])
    model = _tinygpt(size)
    opt = AdamW(model, **OPT)
    step = _tformer_step_fn(model, opt, x, y)
    wall, cpu = _time(step, warmup, steps)
    peak_kb = _status_kb("VmHWM")
    tracemalloc.start()                       # one more step, untimed, with allocation tracing
    before, _ = tracemalloc.get_traced_memory()
    loss = float(step())
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    prof = load_sibling("op_profile")
    rows, total = prof.profile_step(model, opt, x, y, steps=2, warmup=0,
                                    clock="cpu" if threads == 1 else "wall")
    return dict(times=wall, cpu_times=cpu, loss=loss, peak_mb=(peak_kb - base_kb) / 1024,
                tracemalloc_step_peak_mb=(traced_peak - before) / 2**20,
                n_params=int(model.num_parameters()), tformer_threads=parallel.get_num_threads(),
                profile=dict(step_ms=total * 1e3, categories=prof.group(rows),
                             top=[(n, round(ms, 3)) for n, ms, _, _ in rows[:8]]))


def worker_torch(size, warmup, steps, threads):
    import torch

    from tformer.optim import AdamW
    from_tinygpt = load_sibling("torch_gpt").from_tinygpt
    torch.set_num_threads(threads)
    base_kb = _status_kb("VmRSS")
    s = SIZES[size]
    x, y = _batch(s["B"], s["T"])
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    # Equivalence: same weights, same loss before and after one AdamW step.
    ref = _tinygpt(size)
    tm = from_tinygpt(ref)
    ref_step = _tformer_step_fn(ref, AdamW(ref, **OPT), x, y)
    t_step = _torch_step_fn(tm, torch.optim.AdamW(tm.parameters(), **OPT), xt, yt)
    losses = [(ref_step(), t_step()), (ref_step(), t_step())]
    for i, (a, b) in enumerate(losses):
        if not abs(a - b) <= 1e-4 * abs(a) + 1e-5:
            raise AssertionError(f"{size}: tformer loss {a:.6f} != torch loss {b:.6f} at check {i}")
    del ref, tm, ref_step, t_step

    # The model under test, built fresh (the same initial weights) after resetting the memory peak.
    if _reset_peak():
        base_kb = min(base_kb, _status_kb("VmRSS"))
    tm = from_tinygpt(_tinygpt(size))
    step = _torch_step_fn(tm, torch.optim.AdamW(tm.parameters(), **OPT), xt, yt)
    wall, cpu = _time(step, warmup, steps)
    peak_kb = _status_kb("VmHWM")
    return dict(times=wall, cpu_times=cpu, loss=float(step()), peak_mb=(peak_kb - base_kb) / 1024,
                loss_check=[list(p) for p in losses], torch=torch.__version__,
                n_params=int(sum(p.numel() for p in tm.parameters())))


def worker_gemm(threads):
    """Best float32 GEMM rate over square sizes 1024..4096 (a few repeats each), in GFLOP/s."""
    import numpy as np
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
    return dict(gflops=max(per_n.values()), per_n=per_n, threads=threads, numpy=np.__version__)


# --- the driver --------------------------------------------------------------------------------------

def _run_worker(args, threads, malloc="default"):
    # TFORMER_NUM_THREADS, for the tformer side only: tformer splits its kernels across as many
    # threads as PyTorch's intra-op pool gets (tformer.parallel then holds BLAS at one thread per
    # call inside its own threads). The torch side builds a TinyGPT only to copy its weights, with
    # tformer at one thread, so nothing limits PyTorch's threads; the GEMM-peak worker is plain NumPy.
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), TFORMER_PROGRESS="0",
               TFORMER_NUM_THREADS=str(threads) if args[0] == "tformer" else "1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for key in MALLOC_TUNED:
        env.pop(key, None)
    if malloc == "tuned":
        env.update(MALLOC_TUNED)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", *args, "--threads", str(threads)]
    load0 = os.getloadavg()[0]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"worker {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["loadavg_1min"] = [load0, os.getloadavg()[0]]
    return res


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def summarise(side, flops, peak):
    """Median, quartiles and rates of one side's step times."""
    t = statistics.median(side["times"])
    q = statistics.quantiles(side["times"], n=4) if len(side["times"]) >= 2 else [t, t, t]
    gf = flops / t / 1e9
    out = dict(median_s=t, q1_s=q[0], q3_s=q[2], min_s=min(side["times"]),
               cpu_median_s=statistics.median(side["cpu_times"]), gflops=gf, frac_peak=gf / peak,
               peak_mb=side["peak_mb"], loss=side["loss"], loadavg_1min=side["loadavg_1min"])
    for key in ("tracemalloc_step_peak_mb", "profile", "loss_check", "torch", "n_params", "tformer_threads"):
        if key in side:
            out[key] = side[key]
    return out


def measure(size, a, malloc, use_torch, peak, flops):
    """Both sides of one size under one allocator setting: ``{tformer, torch, ratio}``."""
    args = [size, "--steps", str(a.steps), "--warmup", str(a.warmup)]
    row = {"tformer": summarise(_run_worker(["tformer", *args], a.threads, malloc), flops, peak)}
    if use_torch:
        row["torch"] = summarise(_run_worker(["torch", *args], a.threads, malloc), flops, peak)
        row["ratio"] = row["torch"]["median_s"] / row["tformer"]["median_s"]
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--sizes", default="small,medium,large", help="comma-separated subset of "
                   + ", ".join(SIZES) + " (default: all)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per side (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="BLAS/OpenMP/torch threads")
    p.add_argument("--malloc", default="both", choices=("default", "tuned", "both"),
                   help="glibc allocator settings of both sides (see above); headline: default")
    p.add_argument("--out", default=str(HERE / "results"), help="folder for bench.json and bench.png")
    p.add_argument("--no-torch", action="store_true", help="benchmark tformer alone")
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.worker:
        kind = a.worker[0]
        res = (worker_gemm(a.threads) if kind == "gemm" else
               worker_tformer(a.worker[1], a.warmup, a.steps, a.threads) if kind == "tformer" else
               worker_torch(a.worker[1], a.warmup, a.steps, a.threads))
        print(json.dumps(res))
        return 0

    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    if not sizes or any(s not in SIZES for s in sizes):
        p.error(f"--sizes: expected a subset of {list(SIZES)}, got {a.sizes!r}")
    if a.steps < 1 or a.warmup < 0 or a.threads < 1:
        p.error("--steps must be ≥ 1, --warmup ≥ 0, --threads ≥ 1")
    use_torch = not a.no_torch and have_torch()
    if not use_torch and not a.no_torch:
        print("PyTorch is not installed (pip install torch==2.13.0, the CPU build): tformer alone.")
    mallocs = ["default", "tuned"] if a.malloc == "both" else [a.malloc]
    breakdown = load_sibling("flops").breakdown

    gemm = _run_worker(["gemm"], a.threads)
    peak = gemm["gflops"]
    print(f"float32 GEMM peak (NumPy/OpenBLAS, {a.threads} threads): {peak:.1f} GFLOP/s; "
          f"load average {os.getloadavg()[0]:.2f}")
    results = dict(threads=a.threads, gemm_peak_gflops=peak, gemm=gemm, steps=a.steps, warmup=a.warmup,
                   malloc_tuned_env=MALLOC_TUNED, headline_malloc=mallocs[0],
                   machine=dict(platform=platform.platform(), processor=platform.processor(),
                                python=platform.python_version(), cpu_count=os.cpu_count()),
                   targets=dict(ratio=TARGET_RATIO, frac_peak_large=TARGET_PEAK), sizes={})
    print(f"{'size':<7} {'malloc':<8} {'side':<8} {'step ms':>9} {'cpu ms':>8} {'GFLOP/s':>8} "
          f"{'% peak':>7} {'mem MB':>7} {'ratio':>6}")
    for size in sizes:
        s = SIZES[size]
        fl = breakdown(dict(s, vocab_size=VOCAB, d_ff=4 * s["d_model"]), s["B"], s["T"])
        row = dict(config=s, flops=fl)
        for malloc in mallocs:
            row[malloc] = measure(size, a, malloc, use_torch, peak, fl["total"])
            _print_rows(size, malloc, row[malloc])
        results["sizes"][size] = row
    results["verdict"] = verdict(results)
    print("\n".join(results["verdict"]))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "bench.png")
    print(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")
    return 0


def _print_rows(size, malloc, row):
    for side in ("tformer", "torch"):
        if side in row:
            r = row[side]
            ratio = f"{row['ratio']:6.3f}" if side == "tformer" and "ratio" in row else ""
            print(f"{size:<7} {malloc:<8} {side:<8} {r['median_s'] * 1e3:9.1f} {r['cpu_median_s'] * 1e3:8.1f} "
                  f"{r['gflops']:8.1f} {r['frac_peak'] * 100:6.1f}% {r['peak_mb']:7.0f} {ratio:>6}",
                  flush=True)


def verdict(results):
    """One line per target: met, or missed by how much and what dominates tformer's step."""
    lines, key = [], results["headline_malloc"]
    for size, row in results["sizes"].items():
        r = row[key]
        if "ratio" in r:
            extra = "".join(f"; with the tuned allocator {row[m]['ratio']:.3f}" for m in ("tuned",)
                            if m != key and m in row and "ratio" in row[m])
            if r["ratio"] >= TARGET_RATIO:
                lines.append(f"{size}: speed ratio torch/tformer = {r['ratio']:.3f} (target ≥ 1.0 met{extra})")
            else:
                lines.append(f"{size}: speed ratio torch/tformer = {r['ratio']:.3f} (target ≥ 1.0 MISSED by "
                             f"{TARGET_RATIO - r['ratio']:.3f}{extra}; tformer's step: {_dominant(r)})")
    if "large" in results["sizes"]:
        r = results["sizes"]["large"][key]["tformer"]
        f = r["frac_peak"]
        lines.append(f"large: tformer reaches {f * 100:.1f}% of the GEMM peak " + (
            "(target ≥ 40% met)" if f >= TARGET_PEAK else
            f"(target ≥ 40% MISSED by {(TARGET_PEAK - f) * 100:.1f} points; tformer's step: "
            f"{_dominant(results['sizes']['large'][key])})"))
    return lines


def _dominant(row):
    cats = row["tformer"]["profile"]["categories"]
    total = sum(cats.values())
    return ", ".join(f"{k} {v / total * 100:.0f}%" for k, v in list(cats.items())[:4])


def plot(results, path):
    """Step time, fraction of the GEMM peak and peak memory per size, both sides, both allocators."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    sizes = list(results["sizes"])
    bars = [(m, side) for m in ("default", "tuned") for side in ("tformer", "torch")
            if all(m in results["sizes"][k] and side in results["sizes"][k][m] for k in sizes)]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    w = 0.8 / max(len(bars), 1)
    colors = {"tformer": "tab:blue", "torch": "tab:orange"}
    for i, (m, side) in enumerate(bars):
        xs = np.arange(len(sizes)) + (i - (len(bars) - 1) / 2) * w
        rows = [results["sizes"][k][m][side] for k in sizes]
        kw = dict(color=colors[side], hatch="//" if m == "tuned" else None, alpha=0.55 if m == "tuned" else 1,
                  label=f"{side} ({m} malloc)")
        axes[0].bar(xs, [r["median_s"] * 1e3 for r in rows], w, **kw)
        axes[1].bar(xs, [r["frac_peak"] * 100 for r in rows], w, **kw)
        axes[2].bar(xs, [r["peak_mb"] for r in rows], w, **kw)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("training step, median (ms)")
    axes[1].axhline(TARGET_PEAK * 100, color="gray", ls="--", lw=1)
    axes[1].set_ylabel(f"% of GEMM peak ({results['gemm_peak_gflops']:.0f} GFLOP/s)")
    axes[2].set_ylabel("peak memory over imports (MB)")
    for ax in axes:
        ax.set_xticks(range(len(sizes)), sizes)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"TinyGPT training step, float32, {results['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
