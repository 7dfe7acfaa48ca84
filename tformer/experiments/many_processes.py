"""``python -m tformer many-processes``: the measurements of the chapter "Many processes" (JSON).

It launches ``mpiexec -n 2`` jobs on this host (``tformer.training.mpi.launch``; one BLAS thread and
one tformer thread per rank) and writes one JSON file with the configuration, the git commit and:

- ``allreduce``: the median time of an in-place Allreduce of a float32 buffer of N numbers, for
  several N, between 2 processes (shared memory), and the fit t = a + b·N;
- ``speed``: seconds per TinyGPT training step at two sizes with 1 process, 2 processes and
  2 processes with ZeRO-1 (median over the timed steps), the part of a step spent in the
  gradient's collectives (the all-reduce; with ZeRO-1 the reduce-scatter and the all-gather), and
  the part spent waiting, before them, for the other rank to finish its backward pass;
- ``curves``: the loss of every step, and the final validation bits/byte, of one short TinyGPT
  run with 1 and with 2 processes and the same global batch.

``--worker`` runs one job's body (one rank of it); the driver launches it and reads its JSON.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from tformer.nn import functional as F
from tformer.core.atomic import write_json
from tformer.data.text import TextData, bits_per_byte, evaluate_loss
from tformer.training.mpi import DataParallel, get_world, launch, local_slice
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW, cosine_with_warmup
from tformer.core.provenance import record
from tformer.training.train import train

DEFAULT_OUT = "book/data/many_processes.json"
SIZES = {"small": dict(d_model=128, n_heads=4, n_layers=3),          # the default run's model
         "large": dict(d_model=256, n_heads=4, n_layers=4)}
CURVE = dict(d_model=64, n_heads=4, n_layers=2, max_len=64, batch_size=32, steps=150, lr=3e-3,
             warmup=15, seed=0)


# The largest all-reduce buffer: float32 numbers, 120 MB, ten times the book's largest (3,000,000);
# each of the two ranks holds it and its sum.
MAX_BUFFER = 30_000_000


def _buffer_sizes(text):
    """``--lengths``: comma-separated buffer sizes from 1 to ``MAX_BUFFER``, at least two distinct
    (the fit t = a + b·N needs two); returned as given (the record keeps the text)."""
    import argparse
    what = (f"comma-separated integers from 1 to {MAX_BUFFER:,}, at least two distinct (the fit "
            f"t = a + b·N)")
    try:
        sizes = [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if len(set(sizes)) < 2 or not all(1 <= n <= MAX_BUFFER for n in sizes):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return text


def add_arguments(p):
    from tformer.runs.flag_groups import Flag, add_output_flags, add_timing_flags
    from tformer.runs.flags import positive_int
    add_output_flags(p, out=DEFAULT_OUT)
    p.add_argument("--lengths", type=_buffer_sizes,
                   default="1000,10000,100000,300000,1000000,3000000",
                   help="buffer sizes N (float32 numbers) of the all-reduce timings")
    add_timing_flags(p, reps=Flag(30, "timed all-reduces per size (after 3 untimed)"))
    p.add_argument("--speed-steps", type=positive_int, default=20,
                   help="timed training steps per speed run")
    p.add_argument("--speed-batch", type=positive_int, default=64,
                   help="global batch of the speed runs (even: two ranks share it)")
    add_timing_flags(p, repeats=Flag(2, "rounds of the speed runs (interleaved)"))
    p.add_argument("--curve-steps", type=positive_int, default=CURVE["steps"],
                   help=f"steps of the loss curves (more than their {CURVE['warmup']} warm-up "
                        f"steps)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def unused_flags(args):
    """A rank of a job (``--worker``, started by the command itself) reads its spec alone."""
    from tformer.runs.flags import idle
    return idle(["--out", "--lengths", "--reps", "--speed-steps", "--speed-batch", "--repeats",
                 "--curve-steps"], "with --worker (one rank of a job reads its JSON spec)",
                args.worker is not None)


def check_flags(args):
    """The global batch splits over two ranks, the curves outlast their warm-up, and every speed
    run fits in memory (``tformer.runs.fits``)."""
    if args.worker is not None:
        return
    from tformer.runs.fits import check_fits
    if args.speed_batch % 2:
        raise ValueError(f"--speed-batch: expected an even global batch (two ranks share it), "
                         f"got {args.speed_batch}")
    if args.curve_steps <= CURVE["warmup"]:
        raise ValueError(f"--curve-steps: expected more than the {CURVE['warmup']} warm-up steps, "
                         f"got {args.curve_steps}")
    try:
        for size in SIZES.values():                      # each model of the speed runs
            check_fits(argparse.Namespace(**size, max_len=64, batch_size=args.speed_batch,
                                          d_ff=None, attention="plain",
                                          gradient_checkpointing=False, blocks_per_segment=1))
    except ValueError as e:
        why = str(e).removeprefix("--max-len, --batch-size: ").replace("--batch-size", "--speed-batch")
        raise ValueError(f"--speed-batch: {why}") from None


def files(args):
    """What the command writes (``tformer.runs.declare``): ``--out``; one rank of a job
    (``--worker SPEC``) writes its result to the spec's ``out`` instead."""
    from tformer.runs.declare import writes
    if args.worker is None:
        return [writes("--out", args.out)]
    try:
        spec = json.loads(args.worker)
        out = spec["out"]
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"--worker: expected a job's JSON spec with its 'out', got "
                         f"{args.worker[:60]!r} ({type(e).__name__}: {e})") from None
    return [writes("--worker", out)]


# -- the bodies of the jobs (one rank each) ----------------------------------------------------

def allreduce_times(world, lengths, reps):
    """Median seconds of ``Allreduce(IN_PLACE)`` of float32 buffers of each length (rank 0's clock;
    a barrier before each call, so every call starts together)."""
    out = []
    for n in lengths:
        buf = np.ones(n, np.float32)
        times = []
        for i in range(reps + 3):
            world.barrier()
            t = time.perf_counter()
            world.allreduce_sum(buf)
            if i >= 3:
                times.append(time.perf_counter() - t)
        out.append(float(np.median(times)))
    return out


def train_job(world, model_kw, T, B, steps, lr, warmup, seed, zero=False, evaluate=False, stop=None):
    """TinyGPT trained for ``steps`` on the standard-library corpus, data parallel over ``world``
    (``stop``: only the first ``stop`` steps of that run, the same learning rates).

    Returns the loss of every step, each step's seconds, each step's seconds in the collectives of
    the gradient (and parameters), and, if ``evaluate``, the final validation bits/byte."""
    data = TextData.from_stdlib(T, B, 0.1, seed)
    model = TinyGPT(max_len=T, seed=seed, **model_kw)
    dp = DataParallel(model, world, zero=zero) if world.size > 1 or zero else None

    def make(m):
        return AdamW(m, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = dp.optimizer(make) if dp is not None else make(model)
    comm = [0.0] * ((stop or steps) + 1)
    wait = [0.0] * ((stop or steps) + 1)
    step_of = {"i": 0}
    if dp is not None:
        def timed(fn):
            def wrapper(*a):
                t = time.perf_counter()
                r = fn(*a)
                comm[step_of["i"]] += time.perf_counter() - t
                return r
            return wrapper
        reduce = timed(dp.reduce_gradients)

        def reduce_and_count(m, loss):
            # a barrier first, timed apart: the time a rank waits for the slower one to finish its
            # backward pass is not the collective's
            step_of["i"] += 1
            t = time.perf_counter()
            world.barrier()
            wait[step_of["i"]] += time.perf_counter() - t
            return reduce(m, loss)
        dp.reduce_gradients = reduce_and_count
        if zero:
            opt.gather_parameters = timed(opt.gather_parameters)

    def forward_loss(m, batch):
        x, y = batch
        return F.cross_entropy(m.forward(x), y)

    batch = data.batch if dp is None else (lambda i: local_slice(data.batch(i), world))
    hist = train(model, opt, batch, forward_loss, stop or steps, clip_norm=1.0, progress_bar=False,
                 lr_schedule=lambda s: cosine_with_warmup(s, lr, min(warmup, steps - 1), steps, 0.1 * lr),
                 data_parallel=dp)
    result = {"loss": hist["loss"], "step_seconds": np.diff([0.0] + hist["time"]).tolist(),
              "comm_seconds": comm[1:], "wait_seconds": wait[1:], "parameters": model.num_parameters()}
    if evaluate:
        x, y = data.windows("val", 128)
        result["val_bpb"] = bits_per_byte(evaluate_loss(model.eval(), x, y))
    return result


def worker(spec):
    """One rank of a job described by ``spec`` (a dict); rank 0 writes its result to spec["out"]."""
    world = get_world()
    if spec["kind"] == "allreduce":
        result = {"seconds": allreduce_times(world, spec["lengths"], spec["reps"])}
    else:
        result = train_job(world, **spec["train"])
    result["world_size"] = world.size
    if world.is_root:
        with open(spec["out"], "w") as f:
            json.dump(result, f)
    return 0


# -- the driver --------------------------------------------------------------------------------

def run_job(spec, n):
    """Run ``worker(spec)`` with ``n`` processes (1: a plain process, no MPI); its result dict."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        spec = dict(spec, out=path)
        argv = ["-m", "tformer", "many-processes", "--worker", json.dumps(spec)]
        env = dict(os.environ, TFORMER_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        if n == 1:
            r = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                               timeout=3600)
        else:
            r = launch(n, argv, timeout=3600, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"the job {spec['kind']} with {n} processes failed:\n{r.stderr}")
        with open(path) as f:
            return json.load(f)
    finally:
        os.remove(path)


def fit_line(lengths, seconds):
    """``(a, b)`` of t = a + b·N, least squares on the *relative* residuals (weights 1/t), so that
    the microsecond latencies of small buffers count as much as the milliseconds of large ones."""
    t = np.asarray(seconds, float)
    b, a = np.polyfit(np.asarray(lengths, float), t, 1, w=1.0 / t)
    return float(a), float(b)


def speed_summary(runs, warm=3):
    """Median seconds per step and per step in the collectives, the first ``warm`` steps left out."""
    step = [s for r in runs for s in r["step_seconds"][warm:]]
    comm = [s for r in runs for s in r["comm_seconds"][warm:]]
    wait = [s for r in runs for s in r["wait_seconds"][warm:]]
    return {"seconds_per_step": float(np.median(step)), "comm_seconds_per_step": float(np.median(comm)),
            "wait_seconds_per_step": float(np.median(wait)), "parameters": runs[0]["parameters"]}


def main(args):
    if args.worker is not None:
        return worker(json.loads(args.worker))
    t0, provenance = time.perf_counter(), record("many-processes")
    lengths = [int(n) for n in args.lengths.split(",")]
    ar = run_job({"kind": "allreduce", "lengths": lengths, "reps": args.reps}, 2)["seconds"]
    a, b = fit_line(lengths, ar)
    print("all-reduce, 2 processes: " + ", ".join(f"N={n:,}: {t * 1e6:.0f} µs" for n, t in zip(lengths, ar)))
    print(f"fit t = a + b·N: a = {a * 1e6:.1f} µs, b = {b * 1e9:.3f} ns per float32 number")
    speed = {}
    for name, kw in SIZES.items():
        job = {"kind": "train", "train": dict(model_kw=kw, T=64, B=args.speed_batch,
                                              steps=args.speed_steps + 3, lr=3e-3, warmup=3, seed=0)}
        runs = {"1": [], "2": [], "2-zero1": []}
        for _ in range(args.repeats):                     # interleaved: the load changes slowly
            runs["1"].append(run_job(job, 1))
            runs["2"].append(run_job(job, 2))
            runs["2-zero1"].append(run_job(dict(job, train=dict(job["train"], zero=True)), 2))
        speed[name] = {"model": kw, **{k: speed_summary(v) for k, v in runs.items()}}
        s = speed[name]
        print(f"{name} ({s['1']['parameters']:,} parameters): "
              + ", ".join(f"{k} processes {1 / v['seconds_per_step']:.2f} steps/s "
                          f"({100 * v['comm_seconds_per_step'] / v['seconds_per_step']:.0f}% in collectives)"
                          for k, v in s.items() if k != "model"))
    curve_job = {"kind": "train", "train": dict(
        model_kw={k: CURVE[k] for k in ("d_model", "n_heads", "n_layers")}, T=CURVE["max_len"],
        B=CURVE["batch_size"], steps=args.curve_steps, lr=CURVE["lr"], warmup=CURVE["warmup"],
        seed=CURVE["seed"], evaluate=True)}
    curves = {str(n): run_job(curve_job, n) for n in (1, 2)}
    for n, c in curves.items():
        print(f"loss curve, {n} process(es): final loss {c['loss'][-1]:.4f}, val {c['val_bpb']:.4f} bits/byte")
    result = {
        **provenance,
        "config": {k: v for k, v in vars(args).items() if k not in ("func", "worker")},
        "threads_per_process": 1, "curve_config": dict(CURVE, steps=args.curve_steps),
        "allreduce": {"processes": 2, "dtype": "float32", "lengths": lengths, "seconds": ar,
                      "fit": {"a_seconds": a, "b_seconds_per_number": b}},
        "speed": speed, "speed_config": {"T": 64, "batch_size": args.speed_batch, "timed_steps": args.speed_steps},
        "curves": {n: {"loss": c["loss"], "val_bpb": c["val_bpb"]} for n, c in curves.items()},
        "seconds": time.perf_counter() - t0,
    }
    write_json(args.out, result)
    print(f"wrote {args.out} ({result['seconds']:.0f} s)")
    return 0
