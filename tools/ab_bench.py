"""Interleaved A/B timing of two trees of tformer on one machine, in one run.

    python tools/ab_bench.py --a /tmp/base --b . --rounds 5

Each round times, for tree A then tree B (B then A on odd rounds, so that neither side always runs
second), tformer's training step at the benchmark's three sizes and greedy generation with the
KV cache at batch 1 and 8: the same workers ``python -m tformer bench`` runs
(``tformer.bench.run --worker``), each in a fresh Python whose ``PYTHONPATH`` is that tree, with each
library on its default threads. A machine shared with other work moves single measurements by tens
of percent; measuring the two sides alternately, many times, is what makes them comparable. The
report gives, per workload, the best and the median over rounds of each side and B/A for both.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

WORKLOADS = ([("train", dict(size=s)) for s in ("small", "medium", "large")]
             + [("gen", dict(B=b)) for b in (1, 8)])


def spec(kind, args, steps, reps):
    if kind == "train":
        return {"kind": "train-tformer", "args": dict(args, warmup=2, steps=steps, threads=None,
                                                      profile=False, min_time=1.0)}
    return {"kind": "gen-tformer", "args": dict(args, prompt=16, new=128, reps=reps, cache=True,
                                                threads=None)}


def run(tree, s):
    """One worker of tree ``tree``: seconds per training step (median) or per generation."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.update(PYTHONPATH=os.path.abspath(tree), TFORMER_PROGRESS="0")
    out = subprocess.run([sys.executable, "-m", "tformer.bench.run", "--worker", json.dumps(s)],
                         env=env, cwd=os.path.abspath(tree), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: worker failed:\n{out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return statistics.median(res["times"]) if s["kind"] == "train-tformer" else res["seconds"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="tree A (e.g. a worktree of main)")
    p.add_argument("--b", default=".", help="tree B (default: this one)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated workloads, e.g. train:small,gen:1")
    p.add_argument("--out", default="", help="also write the results here as JSON")
    a = p.parse_args(argv)
    names = [f"{k}:{next(iter(v.values()))}" for k, v in WORKLOADS]
    chosen = [w for w, n in zip(WORKLOADS, names) if not a.only or n in a.only.split(",")]
    times = {n: {"A": [], "B": []} for n in names}
    for r in range(a.rounds):
        for kind, args in chosen:
            name = f"{kind}:{next(iter(args.values()))}"
            for side in ("AB" if r % 2 == 0 else "BA"):
                t = run(a.a if side == "A" else a.b, spec(kind, args, a.steps, a.reps))
                times[name][side].append(t)
                print(f"round {r + 1} {name:12s} {side} {t * 1e3:9.2f} ms", flush=True)
    print(f"\n{'workload':12s} {'A best':>9s} {'B best':>9s} {'B/A':>6s}   {'A median':>9s} {'B median':>9s} {'B/A':>6s}")
    report = {}
    for name, t in times.items():
        if not t["A"]:
            continue
        ba, bb = min(t["A"]), min(t["B"])
        ma, mb = statistics.median(t["A"]), statistics.median(t["B"])
        report[name] = dict(A=t["A"], B=t["B"], best_ratio=bb / ba, median_ratio=mb / ma)
        print(f"{name:12s} {ba * 1e3:9.2f} {bb * 1e3:9.2f} {bb / ba:6.3f}   {ma * 1e3:9.2f} {mb * 1e3:9.2f} {mb / ma:6.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(a=os.path.abspath(a.a), b=os.path.abspath(a.b), rounds=a.rounds,
                           results=report), f, indent=1)


if __name__ == "__main__":
    main()
