"""No slower: A/B timing of two trees of tformer (issue 52: main before the refactor vs this tree).

    python tools/ab_bench.py --a /tmp/base_tree --b . --rounds 8 [--out FILE.json] [--quick]

Each tree is a folder holding a ``tformer/`` package, in either layout (the flat one before the
refactor, ``tformer.optim``, or the folders after it, ``tformer.training.optim``: names are looked
up through ``HOMES`` and ``NAMES`` below, the same kind of table as ``tools/same_numbers.py``'s).

**What is timed.** Training: AdamW steps of a float32 TinyGPT through the one training loop
(``train``: zero_grad, forward, cross-entropy, backward, clip to norm 1, update), at three sizes
(``TRAIN``: a small one, the book's default ``run tinygpt`` model and a wider one); a step's
time is the difference of ``train``'s history clock between consecutive steps. Generation:
greedy decoding with the KV cache, ``NEW`` tokens after a ``PROMPT``-token prompt, at B = 1 and
B = 8 (``GEN``). Each measurement is a fresh Python (``--worker``) whose ``PYTHONPATH`` is its
tree alone, so the two packages never meet in one process, with the environment pinned (``PINNED``:
one BLAS thread, a fixed hash seed) and ``TFORMER_NUM_THREADS`` = 1, and 2 unless ``--threads
1``. It runs ``warmup`` steps untimed, then times ``steps``; its value is their median.

**Rounds, interleaved.** Round after round, every workload runs on A then on B
(``tformer.core.timing.interleaved``), so a drift of the machine's speed over minutes is shared
by both sides. Per workload the report gives each side's median over rounds, the ratio
B/A of the medians, and the noise: A's own spread (interquartile range / median over its
rounds) and the distribution-free interval of the median of the paired ratios B_i / A_i (order
statistics r_(k) .. r_(n+1-k), the sign test's interval; its coverage is printed, 99 % at 8
rounds). "within noise" means that interval holds 1.

**Python calls per step.** In the first round's workers, after their timed steps: every Python
function call (``sys.setprofile``'s "call" events) and those of functions in the tree's
``tformer/`` ("package calls"), per training step (the count of 3 ``train`` steps minus that of
1, halved) and per generated token (greedy 1 + k tokens minus 1 token, divided by k), at one
thread.

``--out FILE.json``: every round's value, the statistics, the calls and the provenance
(``tformer.core.provenance.record``, plus each tree's path and git commit). ``--quick``: tiny
sizes, 2 rounds, one thread (for the test). Timing needs a quiet machine; the numbers of a busy
one only say that the tool runs.
"""
import argparse
import importlib
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # the checkout holding tools/
PINNED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
          "TFORMER_PROGRESS": "0", "PYTHONHASHSEED": "0"}

# Where each name lives: module paths tried in order, the refactor's folders first, the flat
# layout last (as tools/same_numbers.py; extend both when a name moves).
HOMES = {
    "models":     ["tformer.models.tinygpt", "tformer.models"],
    "functional": ["tformer.nn.functional", "tformer.functional", "tformer.fast.losses"],
    "optim":      ["tformer.training.optim", "tformer.optim"],
    "train":      ["tformer.training.train", "tformer.training", "tformer.train"],
    "threads":    ["tformer.core.parallel", "tformer.parallel"],
    "generate":   ["tformer.decoding.generate", "tformer.generate"],
    "timing":     ["tformer.core.timing", "tformer.experiments.timing"],
    "provenance": ["tformer.core.provenance", "tformer.experiments.provenance"],
}
NAMES = {
    "TinyGPT": ("models", "TinyGPT"), "cross_entropy": ("functional", "cross_entropy"),
    "AdamW": ("optim", "AdamW"), "train": ("train", "train"),
    "get_num_threads": ("threads", "get_num_threads"), "greedy": ("generate", "greedy"),
    "interleaved": ("timing", "interleaved"), "provenance": ("provenance", None),
}


def locate(what):
    """``(module path, object)`` of ``what`` in the ``tformer`` this process imports: the first
    module of its home that exists and has the name (``None``: the module itself)."""
    home, name = NAMES[what]
    for path in HOMES[home]:
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as e:
            if e.name and (path == e.name or path.startswith(e.name + ".")):
                continue                          # no such module in this layout
            raise
        if name is None or hasattr(module, name):
            return path, module if name is None else getattr(module, name)
    raise LookupError(f"{what}: not found in {HOMES[home]} (extend HOMES in tools/ab_bench.py)")


VOCAB = 256
# name: (model keywords, B, T, timed steps per worker). "default" is the model and batch of
# `python -m tformer run tinygpt`; one step takes about 35 ms, 250 ms and 500 ms on one core.
TRAIN = {"small": (dict(d_model=64, n_heads=4, n_layers=2), 32, 64, 12),
         "default": (dict(d_model=128, n_heads=4, n_layers=3), 64, 64, 5),
         "wide": (dict(d_model=256, n_heads=8, n_layers=4), 32, 64, 3)}
# generation: the default model's layers with a longer window; timed generations per worker
GEN_MODEL, PROMPT, NEW, GEN_REPS = dict(d_model=128, n_heads=4, n_layers=3, max_len=128), 8, 64, 10
GEN = {"B=1": 1, "B=8": 8}
QUICK_TRAIN = {"small": (dict(d_model=16, n_heads=2, n_layers=1), 4, 8, 2),
               "default": (dict(d_model=16, n_heads=2, n_layers=2), 4, 8, 2),
               "wide": (dict(d_model=32, n_heads=2, n_layers=1), 4, 8, 2)}
QUICK_GEN_MODEL, QUICK_NEW, QUICK_REPS = dict(d_model=16, n_heads=2, n_layers=1, max_len=32), 8, 3


# ------------------------------------------------------------------------------------------------
# the worker: one measurement in a fresh process whose tformer is one tree's

def count_calls(fn, package):
    """``(calls, package calls)`` of Python functions while ``fn()`` runs on this thread; the
    second counts those defined in a file under the folder ``package``."""
    n = [0, 0]

    def hook(frame, event, arg):
        if event == "call":
            n[0] += 1
            n[1] += frame.f_code.co_filename.startswith(package)
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def worker(spec):
    """Seconds of each timed step (``train``) or generation (``gen``) of ``spec``, after its
    warm-up; with ``spec["calls"]``, the calls per step or per generated token too."""
    import numpy as np
    # An editable install (pip install -e) puts a finder on sys.meta_path that maps any tformer.*
    # name to its checkout: a module the tree lacks (tformer.training in the flat layout) would
    # be imported from there. Only the tree's own modules may load.
    sys.meta_path[:] = [f for f in sys.meta_path if not f.__module__.startswith("__editable__")]
    import tformer
    package = os.path.dirname(os.path.abspath(tformer.__file__)) + os.sep
    assert package == os.path.join(os.path.realpath(spec["tree"]), "tformer", ""), package
    TinyGPT, train, greedy = (locate(n)[1] for n in ("TinyGPT", "train", "greedy"))
    out = {"threads": locate("get_num_threads")[1](), "package": package,
           "located": {n: locate(n)[0] for n in ("TinyGPT", "cross_entropy", "AdamW", "train",
                                                  "greedy")}}
    if spec["kind"] == "train":
        model = TinyGPT(**spec["model"], max_len=spec["T"], vocab_size=VOCAB, seed=0)
        opt = locate("AdamW")[1](model, lr=3e-3, weight_decay=0.1)
        tok = np.random.default_rng(1).integers(0, VOCAB, (spec["B"], spec["T"] + 1))
        xy = (tok[:, :-1], tok[:, 1:])                                    # (B, T) inputs, targets
        cross_entropy = locate("cross_entropy")[1]

        def forward_loss(m, b):
            return cross_entropy(m.forward(b[0]), b[1])

        def steps(n):
            return train(model, opt, lambda i: xy, forward_loss, n, clip_norm=1.0,
                         progress_bar=False)
        clock = steps(spec["warmup"] + spec["steps"])["time"]            # seconds since the start
        out["seconds"] = np.diff([0.0] + clock)[spec["warmup"]:].tolist()
        if spec["calls"]:
            one = count_calls(lambda: steps(1), package)
            three = count_calls(lambda: steps(3), package)
            out["calls"] = [(c3 - c1) / 2 for c1, c3 in zip(one, three)]
    else:
        model = TinyGPT(**spec["model"], vocab_size=VOCAB, seed=0)
        prompt = np.random.default_rng(2).integers(0, VOCAB, (spec["B"], PROMPT))
        for _ in range(spec["warmup"]):
            greedy(model, prompt, spec["new"])
        out["seconds"] = []
        for _ in range(spec["steps"]):
            t = time.perf_counter()
            greedy(model, prompt, spec["new"])
            out["seconds"].append(time.perf_counter() - t)
        if spec["calls"]:
            k = spec["new"] // 4
            one = count_calls(lambda: greedy(model, prompt, 1), package)
            more = count_calls(lambda: greedy(model, prompt, 1 + k), package)
            out["calls"] = [(cm - c1) / k for c1, cm in zip(one, more)]
    strays = [m.__file__ for n, m in list(sys.modules.items()) if n.split(".")[0] == "tformer"
              and getattr(m, "__file__", None) and not m.__file__.startswith(package)]
    assert not strays, f"modules from outside {package}: {strays}"
    return out


def run_worker(tree, spec, threads):
    """``worker(spec)`` in a fresh Python whose only tformer is ``tree``'s, environment pinned."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PINNED, TFORMER_NUM_THREADS=str(threads), PYTHONPATH=tree)
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                          json.dumps(dict(spec, tree=tree))],
                         env=env, cwd=tree, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"worker in {tree} failed: {spec}\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["threads"] == threads, (out["threads"], threads)
    return out


# ------------------------------------------------------------------------------------------------
# statistics of the rounds

LEVEL = 0.95            # the coverage asked of the paired ratios' interval (6 rounds reach it)


def quartile_spread(xs):
    """Interquartile range over the median: the relative spread of one side's rounds."""
    if len(xs) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(xs)


def median_interval(ratios, level=LEVEL):
    """``(low, high, coverage)``: the order statistics r_(k), r_(n+1-k) of the paired ratios with
    the largest k whose coverage 1 − 2 P(Binomial(n, ½) < k) is at least ``level`` (the sign
    test's interval for the median; k = 1, the extremes, when n is too small for ``level``)."""
    r, n = sorted(ratios), len(ratios)

    def coverage(k):
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    k = max([k for k in range(1, n // 2 + 1) if coverage(k) >= level] or [1])
    return r[k - 1], r[n - k], coverage(k)


def summary(a, b):
    """The statistics of one workload from A's and B's per-round seconds (paired by round)."""
    ratios = [y / x for x, y in zip(a, b)]
    low, high, cov = median_interval(ratios)

    def side(xs):
        return {"rounds": xs, "median": statistics.median(xs),
                "iqr_over_median": quartile_spread(xs)}
    return {"A": side(a), "B": side(b), "ratio": statistics.median(b) / statistics.median(a),
            "paired": {"median": statistics.median(ratios), "low": low, "high": high,
                       "coverage": cov, "B_slower_rounds": sum(r > 1 for r in ratios)},
            "verdict": ("too few rounds" if cov < LEVEL else "within noise" if low <= 1 <= high
                        else "B slower" if low > 1 else "B faster")}


# ------------------------------------------------------------------------------------------------
# the driver

def workloads(quick, threads):
    """``{name: (spec, threads)}`` of every measurement, training sizes first."""
    train, gen_model, new, reps = ((QUICK_TRAIN, QUICK_GEN_MODEL, QUICK_NEW, QUICK_REPS) if quick
                                   else (TRAIN, GEN_MODEL, NEW, GEN_REPS))
    warmup = 1 if quick else 2
    out = {}
    for n in threads:
        for name, (model, B, T, steps) in train.items():
            out[f"train {name} {n}t"] = (dict(kind="train", model=model, B=B, T=T, warmup=warmup,
                                              steps=steps), n)
        for name, B in GEN.items():
            out[f"gen {name} {n}t"] = (dict(kind="gen", model=gen_model, B=B, new=new, warmup=1,
                                            steps=reps), n)
    return out


def measure(trees, work, rounds):
    """Every workload on every tree for ``rounds`` interleaved rounds: ``{(name, side): [per-round
    median seconds]}``, ``{(name, side): calls}`` of the first round and ``{side: where each
    name was found}``."""
    interleaved = locate("interleaved")[1]
    values, calls, found = {}, {}, {}

    def job(name, side):
        spec, n = work[name]
        first = (name, side) not in calls
        out = run_worker(trees[side], dict(spec, calls=first and n == 1), n)
        values.setdefault((name, side), []).append(statistics.median(out["seconds"]))
        if first:
            calls[(name, side)] = out.get("calls")
        if side not in found:
            found[side] = out["located"]
            print(f"  {side}: tformer from {out['package']}", flush=True)
    interleaved({(name, side): (lambda name=name, side=side: job(name, side))
                 for name in work for side in trees}, rounds)
    return values, calls, found


def report(work, values, calls):
    """The table (printed) and its rows (returned)."""
    rows = {}
    print(f"\n{'workload':18s} {'A ms':>9s} {'B ms':>9s} {'B/A':>6s} {'A IQR/med':>9s} "
          f"{'paired B/A [interval] coverage':>34s}  verdict   (gen: ms per generation)")
    for name in work:
        s = summary(values[(name, "A")], values[(name, "B")])
        p = s["paired"]
        print(f"{name:18s} {s['A']['median'] * 1e3:9.2f} {s['B']['median'] * 1e3:9.2f} "
              f"{s['ratio']:6.3f} {s['A']['iqr_over_median']:9.1%} "
              f"{p['median']:8.3f} [{p['low']:.3f}, {p['high']:.3f}] {p['coverage']:5.1%}  "
              f"{s['verdict']}")
        rows[name] = s
    print(f"\n{'Python calls per step (1t)':30s} {'A all':>8s} {'B all':>8s} {'A package':>10s} "
          f"{'B package':>10s}   (gen: per generated token)")
    for name in work:
        a, b = calls.get((name, "A")), calls.get((name, "B"))
        if a and b:
            print(f"{name:30s} {a[0]:8.0f} {b[0]:8.0f} {a[1]:10.0f} {b[1]:10.0f}")
            rows[name]["calls"] = {side: {"all": c[0], "package": c[1]}
                                   for side, c in (("A", a), ("B", b))}
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", help="tree A: a folder holding tformer/ (main before)")
    p.add_argument("--b", default=ROOT, help="tree B (default: this checkout)")
    p.add_argument("--rounds", type=int, default=8,
                   help="interleaved rounds (6 or more give a verdict)")
    p.add_argument("--threads", default="1,2", help="TFORMER_NUM_THREADS values, e.g. 1 or 1,2")
    p.add_argument("--out", default=None, help="also write the results and provenance as JSON here")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds, 1 thread (a test)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:                     # a measurement: this process's tformer is one tree's
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if not args.a:
        p.error("--a is required")
    sys.path.insert(0, ROOT)            # the driver's tformer (timing, provenance): this checkout's
    trees = {"A": os.path.realpath(args.a), "B": os.path.realpath(args.b)}
    for side, tree in trees.items():
        if not os.path.isfile(os.path.join(tree, "tformer", "__init__.py")):
            p.error(f"--{side.lower()} {tree}: no tformer/ package there")
    threads = [1] if args.quick else [int(t) for t in args.threads.split(",")]
    rounds = 2 if args.quick else args.rounds
    work = workloads(args.quick, threads)
    provenance = locate("provenance")[1]
    load_before, t0 = provenance.load_average(), time.perf_counter()
    print(f"{rounds} rounds of {len(work)} workloads, A = {trees['A']}, B = {trees['B']}",
          flush=True)
    values, calls, found = measure(trees, work, rounds)
    rows = report(work, values, calls)
    if args.out:
        rec = provenance.record("ab_bench")
        rec["command"] = "python " + shlex.join(sys.argv)
        rec["trees"] = {side: dict(zip(("path", "commit", "dirty", "commit_note"),
                                       (tree, *provenance.git_commit(root=tree))))
                        for side, tree in trees.items()}
        rec["load_average_before"] = load_before
        with open(args.out, "w") as f:
            json.dump({"provenance": rec, "rounds": rounds, "threads": threads, "quick": args.quick,
                       "seconds": round(time.perf_counter() - t0, 1),
                       "found": found, "workloads": {name: dict(rows[name], spec=work[name][0],
                                                                threads=work[name][1])
                                                       for name in work}}, f, indent=1)


if __name__ == "__main__":
    main()
