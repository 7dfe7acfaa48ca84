"""The two training parts of ``python -m tformer memory`` (chapter 21), on seed 002's padded task.

- ``batching_part``: ``run transformer``'s model and schedule on reversal with lengths spread
  from 1 to 32, trained once with fixed batches (B rows padded to 2·32 + 2) and once with
  length-bucketed batches under the same budget of B·(2·32 + 2) padded positions. Recorded: the
  share of padded positions, real tokens and positions per second of training (evaluation time
  excluded), rows per batch, the loss, and greedy exact match on the same held-out sequences.
- ``grad_norms_part``: the default task (lengths 1 to 8) with warm-up and clipping on or off;
  the global gradient norm before clipping, the clip ratio and the loss of every step.
"""
import time

import numpy as np

from ..data.batching import BucketedTask, counting
from ..data.sequences import PAD, SequenceTask
from ..models.transformer import Transformer
from ..optim import Adam, cosine_with_warmup
from ..train import train

MODEL = dict(d_model=64, n_heads=4, n_layers=2, d_ff=256, dropout=0.1)


def fit(task, batching, steps, batch_size=64, lr=2e-3, warmup=150, clip=1.0, seed=0,
        max_tokens=None, eval_size=500, eval_every=0, stop=None, pool_size=1024):
    """Train seed 002's Transformer on ``task`` (a schedule of ``steps`` steps, stopped after
    ``stop`` if given); returns a dict of the measurements and the history."""
    model = Transformer(vocab_size=task.vocab_size, max_len=task.seq_len, seed=seed, **MODEL)
    opt = Adam(model, lr=lr, betas=(0.9, 0.98), eps=1e-9)
    if batching == "bucketed":
        budget = batch_size * task.seq_len if max_tokens is None else max_tokens
        source = BucketedTask(task, budget, pool_size, seed=seed).batch
    else:
        source = lambda i: task.batch(i, batch_size)                          # noqa: E731
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


def batching_part(args):
    """Fixed against bucketed batches on reversal of ``--batching-lengths`` symbols
    (``--batching-steps`` each); ``--modes`` chooses which of the two run."""
    steps = 60 if args.quick else args.batching_steps
    lo, hi = args.batching_lengths
    task = SequenceTask("reverse", 10, lo, hi, seed=0)
    runs = {}
    for mode in args.modes:
        r = fit(task, mode, steps, eval_size=100 if args.quick else 500,
                eval_every=0 if args.quick else max(1, steps // 3), pool_size=args.pool_size)
        r["history"] = {k: v[::10] for k, v in r["history"].items()}      # every 10th step
        runs[mode] = r
        print(f"{mode:8s}: {100 * r['padding_share']:.1f}% padding, {r['rows_per_batch']:.1f} rows "
              f"per batch, {r['tokens_per_s']:,.0f} real tokens/s, loss {r['final_loss']:.4f}, "
              f"exact match {r['exact_match']:.3f} ({r['train_seconds']:.0f} s)", flush=True)
    return {"config": dict(MODEL, task="reverse", n_symbols=10, min_len=lo, max_len=hi, steps=steps,
                           batch_size=64, max_tokens=64 * task.seq_len, lr=2e-3, warmup=150, clip=1.0,
                           pool_size=args.pool_size),
            "results": runs}


def batching_key(args):
    """The JSON entry of a batching comparison: ``batching`` for lengths 1 … 32, else
    ``batching_<min>_<max>``."""
    lo, hi = args.batching_lengths
    return "batching" if (lo, hi) == (1, 32) else f"batching_{lo}_{hi}"


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
