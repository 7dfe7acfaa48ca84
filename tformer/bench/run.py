"""``python -m tformer bench`` (``make bench``): training and generation, tformer against PyTorch.

    python -m tformer bench [--sizes small,medium,large] [--rounds 3] [--steps 10] [--min-time 2]
                            [--threads N]
                            [--gen-batches 1,8] [--gen-new 256] [--out book/data/bench_intel.json]

**Training**: one TinyGPT training step (``training.py``) at each size, tformer and PyTorch, each
in its own fresh subprocess; the median of ``--steps`` steps after ``--warmup`` (more steps
where those take less than ``--min-time`` seconds: the small step), the peak memory of
each side, and the ratio torch time / tformer time (above 1: tformer is faster).
**Generation** (``generation.py``): the medium TinyGPT, greedy, ``--gen-new`` tokens after a
``--gen-prompt``-token prompt, at each batch of ``--gen-batches``: tformer with its KV cache,
PyTorch with a KV cache, tformer without one; tokens per second and the cache's speed-up.
**GEMM peak**: the best float32 ``A @ B`` rate of NumPy's BLAS on square matrices.

Everything is measured ``--rounds`` times in one run (the two sides of a comparison one right
after the other, their order alternating from round to round), so each ratio compares two
measurements made under the same load; the 1-minute load average around each is recorded.

**Threads**: without ``--threads``, no thread setting reaches any side: the variables
``TFORMER_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``
are removed from the workers' environment, and each library takes its own default (tformer and
PyTorch: every core), which is what a user gets. ``--threads N`` sets all of them, and
``torch.set_num_threads``, to N. Each side reports the thread count it ran with.

**The per-core bound**: with n threads, one thread's part of the batch (B/n sequences) also runs
alone on one core; less (1 − 1/n) of its parameter update (AdamW and ``zero_grad``, from its
profile, which n threads share), it is the step n perfectly independent cores would take. If
PyTorch's whole step is faster than that, no way of sharing the work between the threads can
catch up. The n parts are also run side by side, each in a process of its own: the cost of the
cores sharing memory and caches, without the interpreter lock (GIL) that threads share.
**The GEMM library** (``gemm_shapes.py``): every product of the step's linear layers in NumPy's
BLAS and in PyTorch's, one thread each.

The result, with the command line, the commit, the machine (the CPU's vendor, family, model and
vector width: ``tformer.core.cpu``), the date and the load, is written atomically to
``--out`` (default ``book/data/bench_<vendor>.json``, e.g. ``bench_intel.json``, one per CPU vendor;
the Performance chapter reads each).
"""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tformer.core import cpu, provenance
from tformer.core.atomic import write_json
from tformer.bench import gemm_shapes, training
from tformer.bench.training import MALLOC_TUNED, SIZES, TARGET_PEAK, TARGET_RATIO, VOCAB

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "book" / "data"


def default_out(vendor):
    """``book/data/bench_<vendor>.json``: one result per CPU vendor (``bench_intel.json``,
    ``bench_amd.json``), so that a run on one kind of machine never replaces the other's."""
    name = "".join(ch for ch in (vendor or "unknown").lower() if ch.isalnum()) or "unknown"
    return DATA / f"bench_{name}.json"


THREAD_VARIABLES = ("TFORMER_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
TARGET_CACHE_SPEEDUP = 5.0


# The ranges the measurements hold: the generation model's context is prompt + new tokens, and
# its uncached side recomputes the whole prefix at every token (time ∝ T²): 4,096 tokens each is
# 16 times the default; a batch of 256 sequences, 32 times the largest default; --min-time at most
# ten minutes a side and round.
MAX_GEN_TOKENS, MAX_GEN_BATCH, MAX_MIN_TIME = 4096, 256, 600.0


def _type_error(what, text):
    import argparse
    return argparse.ArgumentTypeError(f"expected {what}, got {text!r}")


def _sizes(text):
    """``--sizes``: a comma-separated subset of ``SIZES`` (empty: no training), as given."""
    if any(s.strip() not in SIZES for s in text.split(",") if s.strip()):
        raise _type_error(f"a comma-separated subset of {', '.join(SIZES)}", text)
    return text


def _gen_batches(text):
    """``--gen-batches``: comma-separated batch sizes from 1 to ``MAX_GEN_BATCH`` (empty: no
    generation), as given."""
    what = f"comma-separated integers from 1 to {MAX_GEN_BATCH}"
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise _type_error(what, text) from None
    if not all(1 <= b <= MAX_GEN_BATCH for b in batches):
        raise _type_error(what, text)
    return text


def _gen_tokens(text):
    from tformer.runs.flags import _number
    return _number(text, int, f"an integer from 1 to {MAX_GEN_TOKENS:,} (the uncached side "
                              f"recomputes the prefix at every token)",
                   lambda v: 1 <= v <= MAX_GEN_TOKENS)


def _min_time(text):
    from tformer.runs.flags import _number
    return _number(text, float, f"seconds from 0 to {MAX_MIN_TIME:g}",
                   lambda v: 0 <= v <= MAX_MIN_TIME)


def add_arguments(p):
    """The bench command's flags."""
    p.description = ("Training and generation, tformer against PyTorch (make bench). --threads N "
                     "sets every library's threads on both sides; without it, each runs on its "
                     "defaults.")
    from tformer.runs.flag_groups import (Flag, add_output_flags, add_timing_flags,
                                          add_training_flags)
    from tformer.runs.flags import positive_int
    p.add_argument("--sizes", type=_sizes, default="small,medium,large",
                   help="training sizes, a comma-separated subset of " + ", ".join(SIZES)
                        + " ('' to skip training)")
    add_timing_flags(p, rounds=Flag(3, "every measurement this many times"))
    add_training_flags(p, steps=Flag(10, "timed training steps per side and round"),
                       warmup=Flag(2, "untimed training steps first"))
    p.add_argument("--min-time", type=_min_time, default=2.0,
                   help="time more than --steps training steps until they take this many seconds "
                        "(both sides, each round)")
    p.add_argument("--malloc", default="default", choices=("default", "tuned"),
                   help="glibc's allocator as a user gets it, or keeping freed memory ("
                        + " ".join(f"{k}={v}" for k, v in MALLOC_TUNED.items()) + ")")
    p.add_argument("--gen-batches", type=_gen_batches, default="1,8",
                   help="batch sizes of the generation benchmark "
                                                        "('' to skip it)")
    p.add_argument("--gen-new", type=_gen_tokens, default=256, help="new tokens per generation")
    p.add_argument("--gen-prompt", type=_gen_tokens, default=16, help="prompt tokens")
    p.add_argument("--gen-reps", type=positive_int, default=3,
                   help="timed generations per cached side and round (without the cache: one)")
    add_output_flags(p, out=Flag(None, "the JSON file to write (default: "
                                       "book/data/bench_<CPU vendor>.json, e.g. bench_intel.json)"),
                     no_torch=Flag(False, "tformer alone"))


def unused_flags(a):
    """The flags of a benchmark that ``--sizes ''`` or ``--gen-batches ''`` leaves out."""
    from tformer.runs.flags import idle
    no_training = not [x for x in a.sizes.split(",") if x.strip()]
    no_generation = not [x for x in a.gen_batches.split(",") if x.strip()]
    return [*idle(["--steps", "--warmup", "--min-time", "--malloc"],
                  "without training (--sizes '')", no_training),
            *idle(["--gen-new", "--gen-prompt", "--gen-reps"],
                  "without generation (--gen-batches '')", no_generation)]


def check_flags(a):
    """Something is measured: training, generation or both."""
    sizes, batches = _check(a)
    if not sizes and not batches:
        raise ValueError("--sizes, --gen-batches: expected training sizes or generation batches, "
                         "got neither")


def files(a):
    """What the command writes (``tformer.runs.declare``): ``--out`` (default: the file of this
    machine's CPU vendor, ``default_out``)."""
    from tformer.runs.declare import writes
    if a.out is None:
        a.out = str(default_out(cpu.identify().get("vendor")))
    return [writes("--out", a.out)]


# --- workers: one fresh subprocess per measurement ----------------------------------------------

def worker_main(spec):
    """Run the measurement that ``spec`` names (in the worker subprocess); its result dict."""
    from tformer.bench import generation
    kind, a = spec["kind"], spec["args"]
    if kind == "gemm":
        return training.worker_gemm(a["threads"])
    if kind == "train-tformer":
        return training.worker_tformer(a["size"], a["warmup"], a["steps"], a["threads"],
                                       profile=a["profile"], min_time=a.get("min_time", 0.0),
                                       B=a.get("B"))
    if kind == "gemm-shapes":
        return gemm_shapes.worker(a["library"], a["size"])
    if kind == "train-torch":
        return training.worker_torch(a["size"], a["warmup"], a["steps"], a["threads"],
                                     min_time=a.get("min_time", 0.0))
    if kind == "gen-tformer":
        return generation.worker_tformer(a["B"], a["prompt"], a["new"], a["reps"], cache=a["cache"])
    if kind == "gen-torch":
        return generation.worker_torch(a["B"], a["prompt"], a["new"], a["reps"], a["threads"])
    raise ValueError(f"kind: unknown worker {kind!r}")


def worker_env(threads, side, malloc="default"):
    """The environment of one worker: thread variables removed (``threads=None``) or all set to
    ``threads``. The torch side builds a TinyGPT only to copy its weights: tformer runs one
    thread there."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES and k not in MALLOC_TUNED}
    if threads is not None:
        env.update({v: str(threads) for v in THREAD_VARIABLES})
    if side == "torch":
        env["TFORMER_NUM_THREADS"] = "1"
    env["TFORMER_PROGRESS"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    if malloc == "tuned":
        env.update(MALLOC_TUNED)
    return env


def run_worker(kind, threads, malloc="default", **args):
    """``worker_main`` of ``{kind, args}`` in a fresh Python; the result, with the load around it."""
    load0 = os.getloadavg()[0]
    res = run_workers_together(1, kind, threads, malloc, **args)[0]
    res["loadavg_1min"] = [load0, os.getloadavg()[0]]
    return res


def run_workers_together(n, kind, threads, malloc="default", **args):
    """``n`` copies of one worker, started together so that they run side by side, each in a
    fresh Python of its own; their results."""
    spec = json.dumps({"kind": kind, "args": dict(args, threads=threads)})
    side = "torch" if kind.endswith("torch") else "tformer"
    procs = [subprocess.Popen([sys.executable, "-m", "tformer.bench.run", "--worker", spec],
                              env=worker_env(threads, side, malloc), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"worker {kind} {args} failed:\n{err[-3000:]}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


# --- the measurements ----------------------------------------------------------------------------

def summarise_train(side, flops, peak):
    """Median, quartiles and rates of one side's step times."""
    t = statistics.median(side["times"])
    q = statistics.quantiles(side["times"], n=4) if len(side["times"]) >= 2 else [t, t, t]
    gf = flops / t / 1e9
    out = dict(median_s=t, q1_s=q[0], q3_s=q[2], min_s=min(side["times"]),
               cpu_median_s=statistics.median(side["cpu_times"]), gflops=gf, frac_peak=gf / peak,
               peak_mb=side["peak_mb"], loss=side["loss"], loadavg_1min=side["loadavg_1min"])
    for key in ("tracemalloc_step_peak_mb", "profile", "loss_check", "torch", "n_params",
                "tformer_threads", "torch_threads"):
        if key in side:
            out[key] = side[key]
    return out


def measure_training(size, a, r, use_torch, peak, flops):
    """Both sides of one size in round ``r`` (their order alternates): ``{tformer, torch, ratio}``."""
    args = dict(size=size, steps=a.steps, warmup=a.warmup, min_time=a.min_time)
    sides = ["tformer", "torch"] if use_torch else ["tformer"]
    row = {}
    for side in (sides if r % 2 == 0 else sides[::-1]):
        extra = dict(profile=r == 0) if side == "tformer" else {}
        row[side] = summarise_train(run_worker(f"train-{side}", a.threads, a.malloc, **args, **extra),
                                    flops, peak)
    if use_torch:
        row["ratio"] = row["torch"]["median_s"] / row["tformer"]["median_s"]
    n = row["tformer"]["tformer_threads"]
    if use_torch and n > 1:
        # One thread's part of the batch, alone on one core: the step n perfectly independent
        # cores would take, once the update of the parameters (AdamW and zero_grad, which the
        # part does whole and n threads share) counts 1/n. Where PyTorch beats even this, no
        # way of sharing the work between threads can catch up; only less work per core can.
        B = SIZES[size]["B"]
        part = B - B * (n - 1) // n                       # the largest of batch_threads.parts(B, n)
        x = summarise_train(run_worker("train-tformer", 1, a.malloc, **args, profile=True, B=part),
                            flops * part / B, peak)
        cats = x["profile"]["categories"]
        update_s = (cats.get("AdamW", 0.0) + cats.get("zero_grad", 0.0)) / 1e3
        x.update(B=part, update_s=update_s, bound_s=x["median_s"] - (1 - 1 / n) * update_s)
        # The n parts side by side, each in a process of its own: what the cores cost each other
        # (memory, caches) without the GIL that n threads of one process share.
        together = run_workers_together(n, "train-tformer", 1, a.malloc, **args, profile=False,
                                        B=part)
        x["processes_s"] = (max(statistics.median(w["times"]) for w in together)
                            - (1 - 1 / n) * update_s)
        row["tformer_part"] = x
        row["part_ratio"] = row["torch"]["median_s"] / x["bound_s"]
        row["processes_ratio"] = row["torch"]["median_s"] / x["processes_s"]
    return row


def measure_generation(B, a, r, use_torch):
    """Generation at batch ``B`` in round ``r``: every side, speed-up and ratio."""
    base = dict(B=B, prompt=a.gen_prompt, new=a.gen_new)
    jobs = [("tformer", "gen-tformer", dict(reps=a.gen_reps, cache=True)),
            ("tformer_nocache", "gen-tformer", dict(reps=1, cache=False))]
    if use_torch:
        jobs.insert(1, ("torch", "gen-torch", dict(reps=a.gen_reps)))
    row = {}
    for name, kind, extra in (jobs if r % 2 == 0 else jobs[::-1]):
        row[name] = run_worker(kind, a.threads, a.malloc, **base, **extra)
    row["cache_speedup"] = row["tformer_nocache"]["seconds"] / row["tformer"]["seconds"]
    if use_torch:
        row["ratio"] = row["torch"]["seconds"] / row["tformer"]["seconds"]
        ours, theirs = row["tformer"]["tokens"], row["torch"]["tokens"]
        row["same_tokens"] = sum(x == y for u, v in zip(ours, theirs) for x, y in zip(u, v)) / (B * a.gen_new)
    for name in ("tformer", "torch", "tformer_nocache"):
        if name in row:
            row[name].pop("tokens")
    return row


def summary(results):
    """Per size and per batch: the median over rounds of each time and each ratio, and the rounds' ratios."""
    out = {"training": {}, "generation": {}}
    for size, row in results["training"].items():
        rounds = row["rounds"]
        s = {side: {k: statistics.median(rr[side][k] for rr in rounds)
                    for k in ("median_s", "peak_mb", "frac_peak", "gflops")}
             for side in ("tformer", "torch") if side in rounds[0]}
        if "ratio" in rounds[0]:
            s["ratios"] = [rr["ratio"] for rr in rounds]
            s["ratio"] = statistics.median(s["ratios"])
        if "part_ratio" in rounds[0]:
            s["part_ratios"] = [rr["part_ratio"] for rr in rounds]
            s["processes_ratios"] = [rr["processes_ratio"] for rr in rounds]
            s["tformer_part"] = {k: statistics.median(rr["tformer_part"][k] for rr in rounds)
                                 for k in ("median_s", "bound_s", "processes_s", "update_s", "B")}
        out["training"][size] = s
    for B, row in results["generation"].items():
        rounds = row["rounds"]
        s = {side: {"tokens_per_s": statistics.median(rr[side]["tokens_per_s"] for rr in rounds)}
             for side in ("tformer", "torch", "tformer_nocache") if side in rounds[0]}
        s["cache_speedups"] = [rr["cache_speedup"] for rr in rounds]
        s["cache_speedup"] = statistics.median(s["cache_speedups"])
        if "ratio" in rounds[0]:
            s["ratios"] = [rr["ratio"] for rr in rounds]
            s["ratio"] = statistics.median(s["ratios"])
        out["generation"][B] = s
    return out


def verdict(results):
    """One line per target (torch/tformer ≥ 1 in every round, the large step's share of the GEMM
    peak, the KV cache's speed-up, generation ≥ 1): met in every round, or not. And, for each
    size, the ratio of one thread's part alone on one core (the most a split across threads
    could give) and of the parts side by side in processes (the same without the GIL)."""
    lines, summ = [], results["summary"]
    for size, s in summ["training"].items():
        if "ratios" in s:
            ok = min(s["ratios"]) >= TARGET_RATIO
            lines.append(f"training, {size}: torch/tformer = " + ", ".join(f"{x:.3f}" for x in s["ratios"])
                         + f" ({'≥' if ok else 'NOT ≥'} {TARGET_RATIO} in every round)")
    for size, s in summ["training"].items():
        if "part_ratios" in s:
            lines.append(f"training, {size}: torch/(one part on one core) = "
                         + ", ".join(f"{x:.3f}" for x in s["part_ratios"])
                         + " (the most any split across threads could reach)")
            lines.append(f"training, {size}: torch/(the parts in processes side by side) = "
                         + ", ".join(f"{x:.3f}" for x in s["processes_ratios"])
                         + " (the same without the GIL)")
    if "large" in summ["training"]:
        f = summ["training"]["large"]["tformer"]["frac_peak"]
        lines.append(f"training, large: tformer at {f:.0%} of the GEMM peak "
                     f"({'≥' if f >= TARGET_PEAK else 'NOT ≥'} {TARGET_PEAK:.0%})")
    for B, s in summ["generation"].items():
        ok = min(s["cache_speedups"]) >= TARGET_CACHE_SPEEDUP
        speedups = ", ".join(f"{x:.1f}" for x in s["cache_speedups"])
        lines.append(f"generation, batch {B}: KV cache {speedups}"
                     + f"× faster than recomputing ({'≥' if ok else 'NOT ≥'} {TARGET_CACHE_SPEEDUP:.0f}×)")
        if "ratios" in s:
            ok = min(s["ratios"]) >= 1.0
            ratios = ", ".join(f"{x:.3f}" for x in s["ratios"])
            lines.append(f"generation, batch {B}: torch/tformer = {ratios}"
                         + f" ({'≥' if ok else 'NOT ≥'} 1 in every round)")
    return lines


def machine():
    """What the numbers were measured on (``tformer.core.provenance.machine``) and the cores this
    process may use."""
    from tformer.core.parallel import available_cores
    return dict(provenance.machine(), available_cores=available_cores())


def _check(a):
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    if any(s not in SIZES for s in sizes):
        raise ValueError(f"--sizes: expected a subset of {list(SIZES)}, got {a.sizes!r}")
    try:
        batches = [int(b) for b in a.gen_batches.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--gen-batches: expected comma-separated integers, got {a.gen_batches!r}") from None
    if not a.min_time >= 0:
        raise ValueError(f"--min-time: expected seconds ≥ 0, got {a.min_time}")
    for name, value, low in (("--rounds", a.rounds, 1), ("--steps", a.steps, 1), ("--warmup", a.warmup, 0),
                             ("--gen-new", a.gen_new, 1), ("--gen-prompt", a.gen_prompt, 1),
                             ("--gen-reps", a.gen_reps, 1),
                             ("--threads", getattr(a, "threads", None) or 1, 1),
                             *(("--gen-batches", b, 1) for b in batches)):
        if value < low:
            raise ValueError(f"{name}: expected an integer ≥ {low}, got {value}")
    return sizes, batches


def main(a):
    a.threads = getattr(a, "threads", None)     # python -m tformer's --threads: every library, both sides
    sizes, batches = _check(a)
    from tformer.bench.flops import breakdown
    from tformer.bench.training import have_torch
    use_torch = not a.no_torch and have_torch()
    if not use_torch and not a.no_torch:
        print("PyTorch is not installed (pip install torch==2.13.0, the CPU build): tformer alone.")
    t_start = time.perf_counter()
    rec = provenance.record("bench")
    if a.out is None:
        a.out = str(default_out(rec["machine"].get("vendor")))
    print(f"CPU: {cpu.label(rec['machine'])}", flush=True)
    results = dict(command=rec["command"], commit=rec["commit"], dirty=rec["dirty"],
                   date=rec["date"], machine=machine(), threads=a.threads or "default", malloc=a.malloc, rounds=a.rounds,
                   steps=a.steps, min_time=a.min_time, warmup=a.warmup,
                   loadavg_start=list(os.getloadavg()),
                   generation_config=dict(batches=batches, new=a.gen_new, prompt=a.gen_prompt,
                                          reps=a.gen_reps, vocab=VOCAB))
    gemm = run_worker("gemm", a.threads)
    peak = results["gemm_peak_gflops"] = gemm["gflops"]
    results["gemm"] = gemm
    print(f"float32 GEMM peak (NumPy's BLAS, {gemm['threads']} threads): {peak:.1f} GFLOP/s; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    if use_torch:
        results["gemm_libraries"] = {size: {lib: run_worker("gemm-shapes", 1, a.malloc, library=lib,
                                                            size=size)
                                            for lib in ("numpy", "torch")} for size in sizes}
        for size, libs in results["gemm_libraries"].items():
            print(f"linear products of a {size} step, one thread: "
                  + ", ".join(f"{x['blas']} {x['step_s'] * 1e3:.1f} ms ({x['gflops']:.0f} GFLOP/s)"
                              for x in libs.values()), flush=True)
    results["training"] = {}
    for size in sizes:
        s = SIZES[size]
        fl = breakdown(dict(s, vocab_size=VOCAB, d_ff=4 * s["d_model"]), s["B"], s["T"])
        results["training"][size] = dict(config=s, flops=fl, rounds=[])
    results["generation"] = {str(B): dict(rounds=[]) for B in batches}
    for r in range(a.rounds):
        for size in sizes:
            row = measure_training(size, a, r, use_torch, peak, results["training"][size]["flops"]["total"])
            results["training"][size]["rounds"].append(row)
            print(_train_line(size, r, row), flush=True)
        for B in batches:
            row = measure_generation(B, a, r, use_torch)
            results["generation"][str(B)]["rounds"].append(row)
            print(_gen_line(B, r, row), flush=True)
    results["summary"] = summary(results)
    results["verdict"] = verdict(results)
    results["loadavg_end"] = list(os.getloadavg())
    results["seconds"] = time.perf_counter() - t_start
    print("\n".join(results["verdict"]))
    write_json(a.out, results)
    print(f"wrote {a.out} ({results['seconds']:.0f} s)")
    return 0


def _train_line(size, r, row):
    parts = [f"round {r + 1} training {size:<6}"]
    for side in ("tformer", "torch"):
        if side in row:
            x = row[side]
            parts.append(f"{side} {x['median_s'] * 1e3:7.1f} ms {x['peak_mb']:5.0f} MB")
    if "ratio" in row:
        parts.append(f"ratio {row['ratio']:.3f}")
    if "part_ratio" in row:
        x = row["tformer_part"]
        parts.append(f"(one part, B = {x['B']}, on one core: {x['median_s'] * 1e3:.1f} ms, "
                     f"{x['bound_s'] * 1e3:.1f} ms with 1/n of the update: "
                     f"ratio {row['part_ratio']:.3f}; the parts in processes side by side: "
                     f"{x['processes_s'] * 1e3:.1f} ms, ratio {row['processes_ratio']:.3f})")
    return "  ".join(parts)


def _gen_line(B, r, row):
    parts = [f"round {r + 1} generation B={B}"]
    for side in ("tformer", "torch", "tformer_nocache"):
        if side in row:
            parts.append(f"{side} {row[side]['tokens_per_s']:7.0f} tok/s")
    parts.append(f"cache ×{row['cache_speedup']:.1f}")
    if "ratio" in row:
        parts.append(f"torch/tformer {row['ratio']:.3f}")
    return "  ".join(parts)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"] or len(sys.argv) != 3:
        sys.exit("usage: python -m tformer bench [flags] (this module's own entry runs one worker)")
    print(json.dumps(worker_main(json.loads(sys.argv[2]))))
