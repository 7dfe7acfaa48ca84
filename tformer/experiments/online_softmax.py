"""``python -m tformer online-softmax``: the measurements of the chapter "Attention that
never stores T × T" (JSON).

One layer's causal attention, the kernel pair on ``q, k, v: (B, H, T, D)`` with B = 4, H = 4,
D = C / H = 32 (TinyGPT's C = 128), float32, forward then backward with a fixed upstream gradient:

- ``tiles``: seconds of the online-softmax kernel for each pair of tile sizes (query tile × key
  tile) at one T, all in one process and interleaved (round r times every pair once), the median
  over the rounds; the smallest gives the kernel's ``BLOCK_Q`` and ``BLOCK_K``.
- ``sweep``: for each T and each kernel (``plain``: ``attention_forward(is_causal=True)``, which
  stores P; ``flash``: ``flash_attention_forward``), in a fresh Python process: the tracemalloc
  peak of the first forward + backward (counted from just before it; q, k, v and dY are allocated
  earlier and not counted), then the seconds of ``--reps`` more. The plain kernel is skipped, with
  the reason, where its two (B, H, T, T) arrays would not fit in the memory available.

``--parts`` chooses what to run; the parts not run are kept from an existing ``--out`` file. Each
part records the command, the git commit and its configuration.
"""
import json
import os
import time

from tformer.core.atomic import write_json
from tformer.core.provenance import machine, record  # noqa: F401 (machine: where earlier code imported it)
from tformer.training.step_memory import available_bytes as mem_available    # MemAvailable of /proc/meminfo
from tformer.experiments.fresh import run_fresh
from tformer.core.timing import interleaved

DEFAULT_OUT = "book/data/online_softmax.json"
SHAPE = dict(B=4, H=4, D=32)
TILE_SIZES = (32, 64, 128, 256, 512)


# The longest T the command takes: the flash kernel holds O(T) (q, k, v, dY and their gradients,
# B·H·T·D float32 each: 16 KiB per position at B = H = 4, D = 32), and its time grows as T²: at
# 65,536, 16 times the book's largest T of 16,384 and about 1 GiB.
MAX_T = 65536


def _length(text):
    from tformer.runs.flags import _number
    return _number(text, int, f"an integer ≥ 1 and at most {MAX_T:,} (flash's time grows as T²)",
                   lambda v: 1 <= v <= MAX_T)


def add_arguments(p):
    from tformer.runs.flag_groups import Flag, add_output_flags, add_timing_flags
    from tformer.runs.flags import positive_int
    add_output_flags(p, out=Flag(DEFAULT_OUT, "the JSON file to write (parts not run are kept)"),
                     parts=Flag(["tiles", "sweep"], "tiles: the tile-size sweep; sweep: plain "
                                                    "against flash over --lengths"))
    p.add_argument("--lengths", type=_length, nargs="+",
                   default=[256, 512, 1024, 2048, 4096, 8192, 16384],
                   help="sequence lengths T of the sweep")
    add_timing_flags(p, reps=Flag(3, "timed forward + backward passes per measurement"))
    p.add_argument("--tile-T", type=_length, default=2048, help="T of the tile-size sweep")
    p.add_argument("--tile-sizes", type=positive_int, nargs="+", default=list(TILE_SIZES),
                   help="query and key tile sizes tried (every pair), each at most --tile-T")
    p.add_argument("--tile-rounds", type=positive_int, default=5,
                   help="interleaved rounds of the tile sweep")


def unused_flags(args):
    """The flags of the part ``--parts`` leaves out."""
    from tformer.runs.flags import idle
    return [*idle(["--tile-T", "--tile-sizes", "--tile-rounds"],
                  "without the tile sweep (--parts tiles)", "tiles" not in args.parts),
            *idle(["--lengths", "--reps"], "without the sweep over lengths (--parts sweep)",
                  "sweep" not in args.parts)]


def check_args(args):
    """An existing ``--out`` is a result file whose other parts are kept: a JSON object."""
    from tformer.runs.flags import json_object_file
    json_object_file("--out", args.out, "a result of `online-softmax`")


def check_flags(args):
    """A tile holds at most the ``--tile-T`` rows it tiles."""
    if "tiles" in args.parts and max(args.tile_sizes) > args.tile_T:
        raise ValueError(f"--tile-sizes: expected tiles of at most --tile-T = {args.tile_T} rows, "
                         f"got {max(args.tile_sizes)}")


def files(args):
    """What the command reads and writes (``tformer.runs.declare``): ``--out``, whose entries of
    the parts not run are kept (read if it exists)."""
    from tformer.runs.declare import updates
    return [updates("--out", args.out)]


def inputs(T, B, H, D, seed=0):
    """q, k, v, dY: (B, H, T, D) float32, seeded."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, T, D), dtype=np.float32) for _ in range(4))


def step_fn(kernel, q, k, v, dy, block_q=None, block_k=None):
    """One forward + backward pass of causal attention with ``kernel`` ("plain" or "flash")."""
    from tformer.nn import functional as F

    def step():
        if kernel == "plain":
            _, cache = F.attention_forward(q, k, v, is_causal=True)
            F.attention_backward(dy, cache)
        else:
            _, cache = F.flash_attention_forward(q, k, v, is_causal=True, block_q=block_q, block_k=block_k)
            F.flash_attention_backward(dy, cache)
    return step


def probe(kernel, T, B, H, D, reps, block_q=None, block_k=None):
    """In this (fresh) process: ``{"peak_bytes", "seconds"}``, the tracemalloc peak of the first
    forward + backward and the seconds of ``reps`` more."""
    import tracemalloc

    import numpy as np
    q, k, v, dy = inputs(T, B, H, D)
    np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)   # BLAS's own buffers, before
    step = step_fn(kernel, q, k, v, dy, block_q, block_k)
    tracemalloc.start()
    step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    seconds = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t)
    return {"peak_bytes": int(peak), "seconds": seconds}


def probe_tinygpt(attention, T, B, d_model=128, n_heads=4, n_layers=3, seed=0):
    """In this (fresh) process: ``{"peak_bytes", "seconds", "loss"}`` of one TinyGPT training step
    (forward, cross-entropy, backward; float32) on random tokens, with ``attention`` ("plain" or
    "flash"), the tracemalloc peak counted from just before the step."""
    import tracemalloc

    import numpy as np

    from tformer.nn import functional as F
    from tformer.models.tinygpt import TinyGPT
    model = TinyGPT(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=T, seed=seed,
                    attention=attention)
    tokens = np.random.default_rng(seed).integers(0, 256, (B, T + 1))
    x, y = np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])
    np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)   # BLAS's own buffers, before
    tracemalloc.start()
    t = time.perf_counter()
    loss, dlogits = F.cross_entropy(model.forward(x), y)
    model.backward(dlogits)
    seconds = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"peak_bytes": int(peak), "seconds": seconds, "loss": float(loss)}


def fresh(probe_name, **cfg):
    """``probe_name(**cfg)`` of this module in a fresh Python process (``tformer.experiments.fresh``),
    its result with ``cfg``."""
    return dict(cfg, **run_fresh(__name__, probe_name, **cfg))


def measure(kernel, T, B=4, H=4, D=32, reps=3, block_q=None, block_k=None):
    """``probe`` in a fresh Python process."""
    return fresh("probe", kernel=kernel, T=T, B=B, H=H, D=D, reps=reps, block_q=block_q, block_k=block_k)


def plain_bytes(T, B, H):
    """The two (B, H, T, T) float32 arrays the plain kernel holds at its peak: P and the backward's dS."""
    return 2 * B * H * T * T * 4


def tile_sweep(T, sizes, rounds, B, H, D):
    """Median seconds of forward + backward for every (block_q, block_k), interleaved rounds."""
    pairs = [(bq, bk) for bq in sizes for bk in sizes]
    q, k, v, dy = inputs(T, B, H, D)
    steps = {p: step_fn("flash", q, k, v, dy, *p) for p in pairs}
    for step in steps.values():
        step()                                                   # warm up every pair once
    times = interleaved(steps, rounds)
    import numpy as np
    rows = [{"block_q": bq, "block_k": bk, "seconds": times[(bq, bk)],
             "median_seconds": float(np.median(times[(bq, bk)]))} for bq, bk in pairs]
    best = min(rows, key=lambda r: r["median_seconds"])
    return rows, [best["block_q"], best["block_k"]]


def main(args):
    for name in ("lengths", "tile_sizes"):
        if min(getattr(args, name)) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: expected positive integers, "
                             f"got {getattr(args, name)}")
    if args.reps < 1 or args.tile_rounds < 1:
        raise SystemExit("--reps and --tile-rounds: expected at least 1")
    result = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            result = json.load(f)
    B, H, D = SHAPE["B"], SHAPE["H"], SHAPE["D"]
    common = record("online-softmax")
    if "tiles" in args.parts:
        t0 = time.perf_counter()
        rows, best = tile_sweep(args.tile_T, args.tile_sizes, args.tile_rounds, B, H, D)
        for r in sorted(rows, key=lambda r: r["median_seconds"]):
            print(f"tiles {r['block_q']:4d} × {r['block_k']:4d}: {r['median_seconds'] * 1e3:8.1f} ms")
        print(f"fastest: {best[0]} × {best[1]}")
        config = dict(T=args.tile_T, B=B, H=H, D=D, dtype="float32", causal=True,
                      sizes=args.tile_sizes, rounds=args.tile_rounds)
        result["tiles"] = dict(common, config=config, results=rows, best=best,
                               seconds=time.perf_counter() - t0)
    if "sweep" in args.parts:
        t0 = time.perf_counter()
        rows = []
        for T in args.lengths:
            for kernel in ("plain", "flash"):
                need, avail = plain_bytes(T, B, H), mem_available()
                if kernel == "plain" and avail is not None and need * 1.25 > avail:
                    r = dict(kernel=kernel, T=T, B=B, H=H, D=D, skipped=(
                        f"needs at least {need / 2**30:.1f} GiB for P and dS; "
                        f"{avail / 2**30:.1f} GiB available"))
                    print(f"T={T:6d} {kernel}: skipped, {r['skipped']}", flush=True)
                else:
                    r = measure(kernel, T, B, H, D, args.reps)
                    r["median_seconds"] = sorted(r["seconds"])[len(r["seconds"]) // 2]
                    print(f"T={T:6d} {kernel}: peak {r['peak_bytes'] / 2**20:10.1f} MiB, "
                          f"forward + backward {r['median_seconds']:8.3f} s", flush=True)
                rows.append(r)
        result["sweep"] = dict(common, config=dict(lengths=args.lengths, B=B, H=H, D=D, dtype="float32",
                                                   causal=True, reps=args.reps,
                                                   mem_total=_mem_total()),
                               results=rows, seconds=time.perf_counter() - t0)
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


def _mem_total():
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration):
        return None
