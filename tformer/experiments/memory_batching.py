"""The two training parts of ``python -m tformer memory`` (the chapter "Fitting in memory"),
on the complete Transformer's padded task.

- ``batching_part``: ``run transformer``'s model and schedule on reversal with lengths spread
  from 1 to 32, trained with each kind of batch (``--modes``) and each seed (``--seeds``):
  ``fixed`` (B rows padded to 2·32 + 2), ``bucketed`` (a pool sorted by length and cut under a
  budget of B·(2·32 + 2) positions) and ``sorted`` (each fixed batch sorted by length and cut into
  micro-batches under an eighth of that budget; the same gradient as fixed). The runs advance in
  turn, ``--chunk`` steps at a time, in one process, so that the machine's load falls on all of
  them alike. Recorded: the share of padded positions, real tokens per second of training by the
  wall clock and per CPU second (evaluation excluded), the loss, and greedy exact match per length
  on the same held-out sequences; then, from those, whether each mode reaches fixed's accuracy.
- ``grad_norms_part``: the default task (lengths 1 to 8) with warm-up and clipping on or off;
  the global gradient norm before clipping, the clip ratio and the loss of every step.
"""
import os
import time

import numpy as np

from tformer.data.batching import BucketedTask, SortedTask, counting, default_budget
from tformer.data.sequences import PAD, SequenceTask
from tformer.models.transformer import Transformer
from tformer.training.optim import Adam, cosine_with_warmup
from tformer.training.train import train

MODEL = dict(d_model=64, n_heads=4, n_layers=2, d_ff=256, dropout=0.1)
SAME_ACCURACY = 0.03        # |mean exact match − fixed's| at most this, or the larger seed spread


def make_source(task, batching, batch_size, max_tokens=None, pool_size=1024, seed=0):
    """``(step -> batch, budget)`` of the kind ``batching``: fixed, bucketed or sorted."""
    budget = default_budget(batching, batch_size, task.seq_len) if max_tokens is None else max_tokens
    if batching == "bucketed":
        return BucketedTask(task, budget, pool_size, seed=seed).batch, budget
    if batching == "sorted":
        return SortedTask(task, batch_size, budget).batch, budget
    if batching == "fixed":
        return (lambda i: task.batch(i, batch_size)), budget
    raise ValueError(f"batching: expected 'fixed', 'bucketed' or 'sorted', got {batching!r}")


def fit(task, batching, steps, batch_size=64, lr=2e-3, warmup=150, clip=1.0, seed=0,
        max_tokens=None, eval_size=500, eval_every=0, stop=None, pool_size=1024):
    """Train the complete Transformer on ``task`` (a schedule of ``steps`` steps, stopped after
    ``stop`` if given); returns a dict of the measurements and the history."""
    model = Transformer(vocab_size=task.vocab_size, max_len=task.seq_len, seed=seed, **MODEL)
    opt = Adam(model, lr=lr, betas=(0.9, 0.98), eps=1e-9)
    source, _ = make_source(task, batching, batch_size, max_tokens, pool_size, seed)
    count = {"real": 0, "positions": 0, "rows": 0, "batches": 0, "eval_s": 0.0}
    batch = counting(source, count, PAD)
    heldout = task.heldout(eval_size)

    def evaluate(m):
        t = time.perf_counter()
        out = {"greedy": task.exact_match(m, heldout, "greedy")}
        count["eval_s"] += time.perf_counter() - t
        return out

    warmup = min(warmup, steps - 1)                      # short smoke runs: shorter warm-up

    def schedule(step):
        return cosine_with_warmup(step, lr, warmup, steps, 0.05 * lr)
    hist = train(model, opt, batch, task.forward_loss, stop or steps, clip_norm=clip or None,
                 lr_schedule=schedule, evaluate=evaluate, eval_every=eval_every, desc=batching)
    seconds = hist["time"][-1] - count["eval_s"]
    return {"batching": batching, "steps": steps, "padding_share": 1 - count["real"] / count["positions"],
            "rows_per_batch": count["rows"] / count["batches"],
            "tokens_per_s": count["real"] / seconds, "positions_per_s": count["positions"] / seconds,
            "train_seconds": seconds, "sequences": count["rows"],
            "final_loss": float(np.mean(hist["loss"][-50:])),
            "exact_match": hist["eval"][-1][1]["greedy"], "eval": hist["eval"],
            "heldout": sum(len(y) for _, y in heldout.values()),
            "history": {k: hist[k] for k in ("step", "loss", "grad_norm", "clip_ratio", "lr")}}


def exact_match_by_length(task, model, heldout):
    """``{n: [right, total]}``: greedy exact match of the held-out sequences of each length n."""
    return {int(n): [int(task.correct(task.decode(model, x), y).sum()), len(y)]
            for n, (x, y) in heldout.items()}


class Run:
    """One training run of the comparison, advanced a chunk of steps at a time (``advance``)."""

    KEYS = ("step", "loss", "grad_norm", "clip_ratio", "lr")

    def __init__(self, task, mode, seed, steps, batch_size=64, lr=2e-3, warmup=150, clip=1.0,
                 max_tokens=None, pool_size=1024, dropout_stream=0):
        self.task, self.mode, self.seed, self.steps, self.clip = task, mode, seed, steps, clip
        self.model = Transformer(vocab_size=task.vocab_size, max_len=task.seq_len, seed=seed,
                                 **MODEL)
        if dropout_stream:         # the same initial weights, other dropout masks (a control)
            self.model.rng.bit_generator.state = \
                np.random.default_rng([seed, dropout_stream]).bit_generator.state
        self.opt = Adam(self.model, lr=lr, betas=(0.9, 0.98), eps=1e-9)
        source, self.budget = make_source(task, mode, batch_size, max_tokens, pool_size, seed)
        self.count = {"real": 0, "positions": 0, "rows": 0, "batches": 0}
        self.batch = counting(source, self.count, PAD)
        warmup = min(warmup, steps - 1)
        self.schedule = lambda s: cosine_with_warmup(s, lr, warmup, steps, 0.05 * lr)  # noqa: E731
        self.hist = {k: [] for k in self.KEYS}
        self.done, self.chunk_wall, self.chunk_cpu, self.evals = 0, [], [], []

    def advance(self, to):
        """Train steps ``done + 1 … to``; their wall-clock and CPU seconds are kept apart."""
        w, c = time.perf_counter(), time.process_time()
        h = train(self.model, self.opt, self.batch, self.task.forward_loss, to,
                  start_step=self.done, clip_norm=self.clip or None, lr_schedule=self.schedule,
                  progress_bar=False)
        self.chunk_cpu.append(time.process_time() - c)
        self.chunk_wall.append(time.perf_counter() - w)
        for k in self.KEYS:
            self.hist[k] += h[k]
        self.done = to

    def evaluate(self, heldout):
        """Per-length greedy exact match now (eval mode), kept with the step."""
        self.model.eval()
        by_len = exact_match_by_length(self.task, self.model, heldout)
        self.model.train()
        right, total = (sum(v[i] for v in by_len.values()) for i in (0, 1))
        self.evals.append({"step": self.done, "exact_match": right / total, "by_length": by_len})
        return right / total

    def result(self):
        c, wall, cpu = self.count, sum(self.chunk_wall), sum(self.chunk_cpu)
        return {"batching": self.mode, "seed": self.seed, "max_tokens": self.budget,
                "padding_share": 1 - c["real"] / c["positions"],
                "rows_per_batch": c["rows"] / c["batches"], "batches_per_step": c["batches"] / self.done,
                "real_tokens": c["real"], "positions": c["positions"],
                "train_seconds": wall, "cpu_seconds": cpu, "tokens_per_s": c["real"] / wall,
                "tokens_per_cpu_s": c["real"] / cpu, "positions_per_s": c["positions"] / wall,
                "chunk_wall": self.chunk_wall, "chunk_cpu": self.chunk_cpu,
                "final_loss": float(np.mean(self.hist["loss"][-50:])),
                "exact_match": self.evals[-1]["exact_match"],
                "by_length": self.evals[-1]["by_length"], "eval": self.evals,
                "history": {k: v[::10] for k, v in self.hist.items()}}        # every 10th step


def verdict(runs, tolerance=SAME_ACCURACY):
    """Each mode against fixed, over the seeds: mean exact match and padding share, the seed
    spread (max − min), and whether it holds the Done-when of issue 12: padding at most half of
    fixed's, and |mean − fixed's mean| ≤ max(tolerance, either mode's seed spread)."""
    by_mode = {}
    for r in runs:
        by_mode.setdefault(r["batching"], []).append(r)
    summary = {}
    for mode, rs in by_mode.items():
        em = [r["exact_match"] for r in rs]
        summary[mode] = {"seeds": [r["seed"] for r in rs], "exact_match": em,
                         "exact_match_mean": float(np.mean(em)), "spread": max(em) - min(em),
                         "padding_share": float(np.mean([r["padding_share"] for r in rs])),
                         "tokens_per_s": float(np.mean([r["tokens_per_s"] for r in rs])),
                         "tokens_per_cpu_s": float(np.mean([r["tokens_per_cpu_s"] for r in rs]))}
    fixed = summary.get("fixed")
    for mode, s in summary.items():
        if fixed is None or mode == "fixed":
            continue
        s["difference"] = s["exact_match_mean"] - fixed["exact_match_mean"]
        s["tolerance"] = max(tolerance, s["spread"], fixed["spread"])
        s["same_accuracy"] = bool(abs(s["difference"]) <= s["tolerance"])
        s["padding_halved"] = bool(s["padding_share"] <= fixed["padding_share"] / 2)
        s["tokens_per_s_ratio"] = s["tokens_per_s"] / fixed["tokens_per_s"]
        s["tokens_per_cpu_s_ratio"] = s["tokens_per_cpu_s"] / fixed["tokens_per_cpu_s"]
    return summary


def batching_part(args):
    """The kinds of batches ``--modes`` × ``--seeds`` on reversal of ``--batching-lengths``
    symbols, ``--batching-steps`` each, advanced in turn by ``--chunk`` steps."""
    steps = 60 if args.quick else args.batching_steps
    chunk = min(args.chunk, steps)
    lo, hi = args.batching_lengths
    heldout = SequenceTask("reverse", 10, lo, hi, seed=0).heldout(100 if args.quick else 1000)
    runs = [Run(SequenceTask("reverse", 10, lo, hi, seed=seed), mode, seed, steps,
                pool_size=args.pool_size, dropout_stream=args.dropout_stream)
            for seed in args.seeds for mode in args.modes]
    evals = {steps} | set(range(max(1, steps // 3), steps, max(1, steps // 3)))
    load, t0 = [os.getloadavg()[0]], time.perf_counter()
    prev = 0
    for k, end in enumerate(range(chunk, steps + chunk, chunk)):
        end = min(end, steps)
        for run in runs[k % len(runs):] + runs[:k % len(runs)]:         # a new first run each round
            run.advance(end)
        if any(prev < e <= end for e in evals):
            load.append(os.getloadavg()[0])
            print(f"step {end:5d} ({time.perf_counter() - t0:.0f} s, load {load[-1]:.1f}): " + ", ".join(
                f"{r.mode} {r.seed} {r.evaluate(heldout):.3f}" for r in runs), flush=True)
        prev = end
    results = [r.result() for r in runs]
    summary = verdict(results)
    for r in results:
        print(f"{r['batching']:8s} seed {r['seed']}: {100 * r['padding_share']:.1f}% padding, "
              f"{r['batches_per_step']:.2f} batches per step, {r['tokens_per_s']:,.0f} real tokens/s "
              f"({r['tokens_per_cpu_s']:,.0f} per CPU s), loss {r['final_loss']:.4f}, exact match "
              f"{r['exact_match']:.3f} ({r['train_seconds']:.0f} s)", flush=True)
    for mode, s in summary.items():
        if "difference" in s:
            print(f"{mode} against fixed: padding {100 * s['padding_share']:.1f}% vs "
                  f"{100 * summary['fixed']['padding_share']:.1f}% (halved: {s['padding_halved']}); "
                  f"exact match {s['exact_match_mean']:.3f} vs {summary['fixed']['exact_match_mean']:.3f}, "
                  f"difference {s['difference']:+.3f}, tolerance {s['tolerance']:.3f} (same: "
                  f"{s['same_accuracy']}); real tokens/s ×{s['tokens_per_s_ratio']:.2f} (wall), "
                  f"×{s['tokens_per_cpu_s_ratio']:.2f} (CPU)", flush=True)
    return {"config": dict(MODEL, task="reverse", n_symbols=10, min_len=lo, max_len=hi, steps=steps,
                           batch_size=64, lr=2e-3, warmup=150, clip=1.0, pool_size=args.pool_size,
                           modes=list(args.modes), seeds=list(args.seeds), chunk=chunk,
                           max_tokens={r.mode: r.budget for r in runs},
                           heldout=sum(len(y) for _, y in heldout.values()),
                           dropout_stream=args.dropout_stream,
                           same_accuracy="|mean - fixed mean| <= max(%g, larger seed spread)"
                                         % SAME_ACCURACY),
            "load_during": load, "summary": summary, "runs": results}


def batching_key(args):
    """The JSON entry of a batching comparison: ``batching`` for lengths 1 … 32, else
    ``batching_<min>_<max>``; ``_dropout<N>`` added for ``--dropout-stream N``."""
    lo, hi = args.batching_lengths
    key = "batching" if (lo, hi) == (1, 32) else f"batching_{lo}_{hi}"
    return key + (f"_dropout{args.dropout_stream}" if args.dropout_stream else "")


def grad_norms_part(args):
    """Warm-up (150 steps) and clipping (at 1) on or off: the gradient norm of every step."""
    steps = 40 if args.quick else args.grad_norm_steps
    task = SequenceTask("reverse", 10, 1, 8, seed=0)
    runs = {}
    for warmup, clip in ((150, 1.0), (0, 1.0), (150, 0.0), (0, 0.0)):
        name = f"warmup {warmup}, clip {clip:g}" if clip else f"warmup {warmup}, no clip"
        r = fit(task, "fixed", steps, lr=2e-3, warmup=warmup, clip=clip, eval_size=200)
        runs[name] = {k: r[k] for k in ("final_loss", "exact_match", "history")}
        runs[name].update(warmup=warmup, clip=clip)
        g = np.asarray(r["history"]["grad_norm"])
        print(f"{name:22s}: largest grad norm {g.max():.3g} (step {int(g.argmax()) + 1}), "
              f"median {np.median(g):.3g}, loss {r['final_loss']:.4f}, exact match "
              f"{r['exact_match']:.3f}", flush=True)
    return {"config": dict(MODEL, task="reverse", n_symbols=10, min_len=1, max_len=8, steps=steps,
                           batch_size=64, lr=2e-3), "results": runs}
