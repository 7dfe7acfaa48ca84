"""``python -m tformer memory``: the measurements of the chapter "Fitting in memory" (JSON).

- ``memory``: one TinyGPT training step (forward, cross-entropy, backward; float32, plain causal
  attention, B = 8, C = 128, H = 4, V = 256) for each (T, L, k) of the sweep, k = 0 meaning no
  checkpointing and k ≥ 1 checkpointing in segments of k blocks. Each configuration runs in two
  fresh Python processes (one BLAS thread, one tformer thread): in one, the ``tracemalloc`` peak
  of the first step, counted from just before it (the parameters, their gradients and the tokens
  are allocated earlier and not counted); in the other, without tracemalloc, the peak resident set
  of the first step (``VmHWM`` after ``/proc/self/clear_refs`` was reset, minus ``VmRSS`` before
  it) and then the median seconds of ``--reps`` more steps.
- ``overhead``: the time of recomputation, in one fresh process per (T, L): a step without and a
  step with checkpointing (k = 1) in turn, ``--reps`` times each after one warm-up step, timed by
  the wall clock and by the process's CPU time (which a busy machine inflates much less: the
  process runs one thread, so its CPU time is the work it did, not the time it waited).
- ``batching``: ``run transformer`` with fixed, pool-bucketed and step-sorted batches, run side
  by side (``memory_batching``).
- ``grad_norms``: the complete Transformer's model with and without warm-up and clipping
  (``memory_batching``).

``--parts`` chooses what to run; the parts not run are kept from an existing ``--out`` file. Each
part records the command, the git commit, the machine, the date and the load average.
"""
import json
import os
import time

from tformer.core.atomic import write_json
from tformer.core.rss import reset_peak, status_bytes
from tformer.core.provenance import record
from tformer.runs.flag_groups import (Flag, add_data_flags, add_experiment_flags, add_output_flags,
                                      add_timing_flags, add_training_flags)
from tformer.runs.flags import nonnegative_int, positive_int
from tformer.experiments.fresh import run_fresh

DEFAULT_OUT = "book/data/fitting_in_memory.json"
SHAPE = dict(B=8, d_model=128, n_heads=4, vocab_size=256)
# (T, L, k): T up to 1024 at L = 4, off and on; L = 2, 4, 8 at T = 512; segments k at L = 8
SWEEP = ([(T, 4, k) for T in (128, 256, 512, 1024) for k in (0, 1)]
         + [(512, L, k) for L in (2, 8) for k in (0, 1)]
         + [(512, 8, k) for k in (2, 3, 4, 8)])


def add_arguments(p):
    add_output_flags(p, out=Flag(DEFAULT_OUT, "the JSON file to write (parts not run are kept)"),
                     parts=Flag(["memory", "overhead", "batching", "grad_norms"],
                                "what to measure"))
    add_timing_flags(p, reps=Flag(3, "timed training steps per configuration"))
    add_experiment_flags(p, quick=Flag(False, "a few small configurations only (a smoke test, "
                                              "not the book's numbers)"))
    p.add_argument("--batching-steps", type=positive_int, default=1500,
                   help="training steps of each run of the batching comparison")
    p.add_argument("--batching-lengths", type=positive_int, nargs=2, default=[1, 32], metavar=("MIN", "MAX"),
                   help="sequence lengths of the batching comparison (entry 'batching' for 1 32, "
                        "else 'batching_MIN_MAX')")
    p.add_argument("--modes", nargs="+", choices=["fixed", "bucketed", "sorted"],
                   default=["fixed", "bucketed", "sorted"],
                   help="which kinds of batches the batching comparison trains with")
    add_training_flags(p, seeds=Flag([0, 1, 2], "batching comparison: one run of each mode per "
                                                "seed (model, dropout, data)"))
    p.add_argument("--dropout-stream", type=nonnegative_int, default=0,
                   help="batching comparison: N > 0 re-seeds the dropout masks after the weights "
                        "are drawn (a control: the same run but for dropout; entry "
                        "'batching_dropoutN')")
    p.add_argument("--chunk", type=positive_int, default=25,
                   help="batching comparison: the runs advance in turn by this many steps")
    add_data_flags(p, pool_size=1024)
    p.add_argument("--grad-norm-steps", type=positive_int, default=300,
                   help="training steps of each run of the gradient-norm comparison")



# The longest sequences of the batching comparison: rows of 2·MAX + 2 tokens, 64 a batch; 256 is
# eight times the book's 32.
MAX_BATCHING_LENGTH = 256


def unused_flags(args):
    """The flags of a part ``--parts`` leaves out (and ``--batching-steps`` under ``--quick``)."""
    from tformer.runs.flags import idle
    parts = set(args.parts)
    return [*idle("--reps", "without --parts memory or overhead (it times their steps)",
                  not parts & {"memory", "overhead"}),
            *idle(["--modes", "--seeds", "--dropout-stream", "--chunk", "--batching-steps",
                   "--batching-lengths", "--pool-size"], "without --parts batching",
                  "batching" not in parts),
            *idle("--batching-steps", "with --quick (60 steps)", "batching" in parts and args.quick),
            *idle("--grad-norm-steps", "without --parts grad_norms", "grad_norms" not in parts),
            *idle("--grad-norm-steps", "with --quick (40 steps)",
                  "grad_norms" in parts and args.quick)]


def check_args(args):
    """An existing ``--out`` is a result file whose other parts are kept: a JSON object."""
    from tformer.runs.flags import json_object_file
    json_object_file("--out", args.out, "a result of `memory`")


def check_flags(args):
    """Lengths MIN ≤ MAX ≤ ``MAX_BATCHING_LENGTH``; distinct seeds and modes."""
    lo, hi = args.batching_lengths
    if lo > hi or hi > MAX_BATCHING_LENGTH:
        raise ValueError(f"--batching-lengths: expected MIN ≤ MAX ≤ {MAX_BATCHING_LENGTH}, got "
                         f"{lo} {hi}")
    for flag, values in (("--seeds", args.seeds), ("--modes", args.modes), ("--parts", args.parts)):
        if len(set(values)) != len(values):
            raise ValueError(f"{flag}: expected distinct values, got {' '.join(map(str, values))}")


def files(args):
    """What the command reads and writes (``tformer.runs.declare``): ``--out``, whose entries of
    the parts not run are kept (read if it exists)."""
    from tformer.runs.declare import updates
    return [updates("--out", args.out)]


def setup(T, L, k, B=8, d_model=128, n_heads=4, vocab_size=256, seed=0):
    """``(model, step)``: a TinyGPT of L blocks (checkpointing in segments of k; k = 0: off) and one
    training step on fixed random tokens ``(B, T)``."""
    import numpy as np

    from tformer.nn import functional as F
    from tformer.models.tinygpt import TinyGPT
    model = TinyGPT(d_model=d_model, n_heads=n_heads, n_layers=L, max_len=T, vocab_size=vocab_size,
                    seed=seed, gradient_checkpointing=k > 0, blocks_per_segment=max(k, 1))
    tokens = np.random.default_rng(seed).integers(0, vocab_size, (B, T + 1))
    x, y = np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])

    def step():
        model.zero_grad()
        loss, dlogits = F.cross_entropy(model.forward(x), y)
        model.backward(dlogits)
        return loss
    np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)   # BLAS's own buffers, before
    return model, step


def probe_traced(T, L, k, **shape):
    """In this (fresh) process: the tracemalloc peak of the first step, and its loss and gradient."""
    import tracemalloc
    model, step = setup(T, L, k, **shape)
    tracemalloc.start()
    loss = step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"peak_bytes": int(peak), "loss": float(loss),
            "grad_sum": float(model.flat_buffers()[1].astype("float64").sum())}


def probe_rss(T, L, k, reps=3, **shape):
    """In this (fresh) process: the peak resident-set growth of the first step, then the seconds
    of ``reps`` more steps."""
    _, step = setup(T, L, k, **shape)
    reset = reset_peak()
    before = status_bytes("VmRSS")
    step()
    hwm = status_bytes("VmHWM")
    seconds = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t)
    rss = hwm - before if reset and hwm is not None and before is not None else None
    return {"rss_peak_bytes": rss, "seconds": seconds}


def probe_overhead(T, L, reps=5, **shape):
    """In this (fresh) process: wall and CPU seconds of steps without and with checkpointing
    (k = 1), alternated after one warm-up step of each."""
    steps = {"off": setup(T, L, 0, **shape)[1], "on": setup(T, L, 1, **shape)[1]}
    for step in steps.values():
        step()
    out = {f"{kind}_{name}": [] for kind in ("wall", "cpu") for name in steps}
    for _ in range(reps):
        for name, step in steps.items():
            w, c = time.perf_counter(), time.process_time()
            step()
            out[f"cpu_{name}"].append(time.process_time() - c)
            out[f"wall_{name}"].append(time.perf_counter() - w)
    return out


def overhead_part(args):
    pairs = [(128, 2)] if args.quick else [(256, 4), (1024, 4), (512, 8)]
    rows, t0 = [], time.perf_counter()
    for T, L in pairs:
        r = dict(T=T, L=L, **SHAPE, **fresh("probe_overhead", T=T, L=L, reps=args.reps, **SHAPE))
        med = {k: sorted(v)[len(v) // 2] for k, v in r.items() if isinstance(v, list)}
        r["cpu_ratio"] = med["cpu_on"] / med["cpu_off"]
        r["wall_ratio"] = med["wall_on"] / med["wall_off"]
        rows.append(r)
        print(f"T={T:5d} L={L}: checkpointed step / plain step = {r['cpu_ratio']:.2f} in CPU time, "
              f"{r['wall_ratio']:.2f} by the wall clock", flush=True)
    return {"config": dict(SHAPE, dtype="float32", attention="plain", reps=args.reps, k=1),
            "results": rows, "seconds": time.perf_counter() - t0}


def fresh(probe_name, **cfg):
    """``probe_name(**cfg)`` of this module in a fresh Python process (``tformer.experiments.fresh``)."""
    return run_fresh(__name__, probe_name, **cfg)


def measure(T, L, k, reps=3, **shape):
    """Both probes of one configuration, each in its own fresh process."""
    shape = dict(SHAPE, **shape)
    row = dict(T=T, L=L, k=k, **shape)
    row.update(fresh("probe_traced", T=T, L=L, k=k, **shape))
    row.update(fresh("probe_rss", T=T, L=L, k=k, reps=reps, **shape))
    row["median_seconds"] = sorted(row["seconds"])[len(row["seconds"]) // 2]
    return row


def context():
    """What every part records (``tformer.core.provenance``): the command, the commit, the machine,
    the date, the load, the cores."""
    return dict(record("memory"), cpus=os.cpu_count())


def memory_part(args):
    sweep = [(128, 2, 0), (128, 2, 1), (256, 2, 0), (256, 2, 1)] if args.quick else SWEEP
    rows, t0 = [], time.perf_counter()
    for T, L, k in sweep:
        r = measure(T, L, k, args.reps)
        rows.append(r)
        rss = r["rss_peak_bytes"]
        print(f"T={T:5d} L={L} k={k}: tracemalloc peak {r['peak_bytes'] / 2**20:8.1f} MiB, "
              f"RSS peak {'n/a' if rss is None else f'{rss / 2**20:8.1f} MiB'}, "
              f"step {r['median_seconds']:.3f} s", flush=True)
    return {"config": dict(SHAPE, dtype="float32", attention="plain", reps=args.reps,
                           sweep=[list(s) for s in sweep]),
            "results": rows, "seconds": time.perf_counter() - t0}


def main(args):
    if args.reps < 1:
        raise SystemExit(f"--reps: expected at least 1, got {args.reps}")
    if args.chunk < 1:
        raise SystemExit(f"--chunk: expected at least 1, got {args.chunk}")
    result = {}
    if "memory" in args.parts:
        result["memory"] = dict(context(), **memory_part(args))
    if "overhead" in args.parts:
        result["overhead"] = dict(context(), **overhead_part(args))
    if "batching" in args.parts or "grad_norms" in args.parts:
        from tformer.experiments.memory_batching import batching_key, batching_part, grad_norms_part
        if "batching" in args.parts:
            result[batching_key(args)] = dict(context(), **batching_part(args))
        if "grad_norms" in args.parts:
            result["grad_norms"] = dict(context(), **grad_norms_part(args))
    if os.path.exists(args.out):             # read at the end: runs of other parts may have
        with open(args.out) as f:            # written it meanwhile; their entries are kept
            result = dict(json.load(f), **result)
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0
