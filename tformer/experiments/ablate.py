"""``python -m tformer ablate --out FILE``: the ablation of the modern block (JSON), for the
chapter "Ablating the modern block".

TinyGPT trained on the same text (the standard-library corpus of ``python -m tformer run tinygpt``,
or ``--text FILE``), for the same steps with the same batches, from TinyGPT's own block changed one
piece at a time, and with every piece at once:

- ``components`` (at ``--lr``): ``baseline`` (TinyGPT's block: LayerNorm, learned positions, GELU,
  multi-head, untied, pre-norm), ``rmsnorm``, ``rope``, ``swiglu`` (hidden width
  ``swiglu_hidden(4C)``, the weights of the 4C GELU network), ``gqa`` (``--n-kv-heads``), ``tied``,
  and ``modern`` (all five).
- ``norm_position``: post-norm at ``--lr``, and pre-norm against post-norm at ``--high-lr``
  (pre-norm at ``--lr`` is the baseline).

Each configuration is trained once per ``--seeds`` entry; the seed sets both the initialisation and
the batches, so for one seed every configuration sees the same batches in the same order (a paired
comparison). Recorded per run: the training loss of every step and the validation loss every
``--eval-every`` steps (on ``--eval-windows`` fixed windows), both in bits per byte, and the final
validation loss on the whole validation split; a run whose loss stops being finite is recorded as
diverged, with the step. The file holds the command line, the commit, the machine, the load
average, the dates and the wall time, and is rewritten (atomically) after every run, so
``--resume`` continues an interrupted ablation with the same configuration (the sessions that made
the runs it keeps are listed under ``earlier_sessions``).
"""
import json
import math
import os
import platform
import time
from datetime import datetime, timezone

import numpy as np

from tformer.nn import functional as F
from tformer.core.atomic import write_json
from tformer.data.text import TextData, bits_per_byte, evaluate_loss, stdlib_documents
from tformer.models.tinygpt import TinyGPT
from tformer.nn.modern_layers import swiglu_hidden
from tformer.training.optim import AdamW, cosine_with_warmup
from tformer.core.progress import progress
from tformer.core.provenance import record
from tformer.training.train import NonFiniteLossError, train

DEFAULT_OUT = "book/data/modern_ablation.json"
SESSION_KEYS = ("command", "commit", "dirty", "machine", "python", "numpy", "blas_threads", "load_average_start",
                "load_average_end", "started", "finished", "wall_seconds")
CONFIG_KEYS = ("d_model", "n_heads", "n_layers", "max_len", "batch_size", "steps", "lr", "high_lr",
               "min_lr_ratio", "warmup", "weight_decay", "clip", "eval_every", "eval_windows",
               "n_kv_heads", "seeds", "text")


def add_arguments(p):
    from tformer.runs.flag_groups import (Flag, add_checkpoint_flags, add_data_flags,
                                          add_model_flags, add_output_flags, add_training_flags)
    from tformer.runs.flags import learning_rate, positive_int
    add_output_flags(p, out=DEFAULT_OUT)
    add_data_flags(p, text=Flag(None, "train on this file instead of the standard-library corpus"))
    add_model_flags(p, d_model=64, n_heads=4, n_layers=2, max_len=64)
    add_training_flags(p, batch_size=32, steps=Flag(500, "optimizer steps of every run"),
                       lr=Flag(3e-3, "peak learning rate (run tinygpt's)"))
    p.add_argument("--high-lr", type=learning_rate, default=3e-2,
                   help="peak learning rate of the pre/post study")
    p.add_argument("--min-lr-ratio", type=_ratio, default=0.1,
                   help="final learning rate / peak, in [0, 1]")
    add_training_flags(p, warmup=50, weight_decay=0.1, clip=1.0,
                       eval_every=Flag(50, "validation loss every this many steps",
                                       type=positive_int),
                       eval_windows=Flag(64, "windows of the intermediate evaluations"))
    add_model_flags(p, n_kv_heads=Flag(None, "key/value heads of gqa (default H/2)"))
    add_training_flags(p, seeds=[0, 1, 2])
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run only these configurations (names as in the file)")
    add_checkpoint_flags(p, resume=Flag(False, "keep the runs of an existing --out made with the "
                                               "same configuration"))
    add_output_flags(p, no_progress=False)


def _ratio(text):
    from tformer.runs.flags import _number
    return _number(text, float, "a ratio in [0, 1]", lambda v: 0 <= v <= 1)


# The configurations that the pre/post study's --high-lr and gqa's --n-kv-heads reach.
HIGH_LR_RUNS = ("pre-norm, high lr", "post-norm, high lr")
KV_RUNS = ("gqa", "modern")


def unused_flags(args):
    """``--only`` leaving out every run that reads ``--high-lr`` (or ``--n-kv-heads``)."""
    from tformer.runs.flags import idle
    only = set(args.only or ())
    return [*idle("--high-lr", f"with --only {' '.join(map(repr, args.only or ()))} (it sets the "
                               f"runs {', '.join(map(repr, HIGH_LR_RUNS))})",
                  bool(only) and not only & set(HIGH_LR_RUNS)),
            *idle("--n-kv-heads", f"with --only {' '.join(map(repr, args.only or ()))} (it sets "
                                  f"the runs {', '.join(map(repr, KV_RUNS))})",
                  bool(only) and not only & set(KV_RUNS))]


def check_flags(args):
    """The flags that must agree, before any file is read: ``--n-heads`` divides ``--d-model``
    (and ``--n-kv-heads`` the heads), the learning rates are > 0, the seeds distinct, ``--only``
    names configurations, and the largest run fits in memory (``tformer.runs.fits``)."""
    import argparse

    from tformer.runs.fits import check_fits
    from tformer.runs.flags import heads_divide
    heads_divide(args.d_model, args.n_heads)
    kv = args.n_kv_heads or max(1, args.n_heads // 2)
    if args.n_heads % kv:
        raise ValueError(f"--n-kv-heads: must divide --n-heads = {args.n_heads}, got {kv}")
    for flag, value in (("--lr", args.lr), ("--high-lr", args.high_lr)):
        if value <= 0:
            raise ValueError(f"{flag}: expected a positive number (a run that learns), got {value:g}")
    if len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds: expected distinct seeds, got {args.seeds}")
    names = [c[0] for c in configurations({k: getattr(args, k) for k in CONFIG_KEYS})]
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        raise ValueError(f"--only: unknown configurations {unknown}; expected some of {names}")
    check_fits(argparse.Namespace(d_model=args.d_model, n_heads=args.n_heads,
                                  n_layers=args.n_layers, max_len=args.max_len,
                                  batch_size=args.batch_size, d_ff=None, attention="plain",
                                  gradient_checkpointing=False, blocks_per_segment=1))


def check_args(args):
    """``--text`` holds a window of ``--max-len`` in each split; ``--resume``'s ``--out``, if
    there, is a JSON object."""
    from tformer.runs.flags import json_object_file, text_file
    if args.text:
        text_file(args.text, args.max_len, 0.1)
    if args.resume:
        json_object_file("--out", args.out, "a result of `ablate` to --resume")


def files(args):
    """What the command reads and writes (``tformer.runs.declare``): ``--text``; ``--out``
    (read first with ``--resume``)."""
    from tformer.runs.declare import reads, updates, writes
    return [reads("--text", args.text), (updates if args.resume else writes)("--out", args.out)]


def configurations(config):
    """``[(name, group, lr, TinyGPT keywords)]``: the runs of one seed, in order."""
    C, H = config["d_model"], config["n_heads"]
    kv = config["n_kv_heads"] or max(1, H // 2)
    parts = {"rmsnorm": dict(norm="rmsnorm"), "rope": dict(positions="rope"),
             "swiglu": dict(mlp="swiglu", d_ff=swiglu_hidden(4 * C)), "gqa": dict(n_kv_heads=kv),
             "tied": dict(tie_embeddings=True)}
    modern = {k: v for part in parts.values() for k, v in part.items()}
    lr, hi = config["lr"], config["high_lr"]
    out = [("baseline", "components", lr, {})]
    out += [(name, "components", lr, kw) for name, kw in parts.items()]
    out += [("modern", "components", lr, modern),
            ("post-norm", "norm_position", lr, dict(norm_position="post")),
            ("pre-norm, high lr", "norm_position", hi, {}),
            ("post-norm, high lr", "norm_position", hi, dict(norm_position="post"))]
    return out


def load_data(config, seed, documents=None):
    """The corpus split as ``run tinygpt`` splits it, batches seeded by ``seed``."""
    T, B = config["max_len"], config["batch_size"]
    if config["text"]:
        return TextData.from_file(config["text"], T, B, 0.1, seed)
    return TextData(documents if documents is not None else stdlib_documents(), T, B, 0.1, seed)


def build_model(config, kwargs, seed):
    """TinyGPT of the ablation's size with the configuration's keywords (float32)."""
    return TinyGPT(d_model=config["d_model"], n_heads=config["n_heads"], n_layers=config["n_layers"],
                   max_len=config["max_len"], seed=seed, **kwargs)


def train_run(config, kwargs, lr, seed, data, stop=None, on_step=None):
    """Train one configuration; returns the run's record (see the module docstring).

    ``stop``: end after that many steps of the same schedule (the learning rate still decays over
    ``config["steps"]``), for a short check against the first steps of a recorded run; no final
    evaluation then. ``on_step()`` is called once per step (the progress bar).
    """
    steps = config["steps"]
    model = build_model(config, kwargs, seed)
    opt = AdamW(model, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=config["weight_decay"])
    warmup = max(0, min(config["warmup"], steps - 1))
    val_x, val_y = data.windows("val", config["eval_windows"])

    def schedule(step):
        return cosine_with_warmup(step, lr, warmup, steps, lr * config["min_lr_ratio"])

    def batch(i):
        if on_step is not None:
            on_step()
        return data.batch(i)

    def forward_loss(m, b):
        try:
            return F.cross_entropy(m.forward(b[0]), b[1])
        except ValueError as e:      # a kernel refusing inf/NaN input: the activations overflowed
            if "NaN" in str(e) or "inf" in str(e):
                raise FloatingPointError(f"the forward pass overflowed ({e})") from e
            raise

    def evaluate(m):
        return {"val_bpb": bits_per_byte(evaluate_loss(m, val_x, val_y))}

    record = {"seed": seed, "parameters": model.num_parameters(), "diverged": None}
    t0 = time.perf_counter()
    losses = []
    try:
        hist = train(model, opt, batch, forward_loss, stop or steps, clip_norm=config["clip"],
                     lr_schedule=schedule, evaluate=None if stop else evaluate,
                     eval_every=config["eval_every"], progress_bar=False)
        losses = hist["loss"]
        record["val_curve"] = [[s, round(m["val_bpb"], 6)] for s, m in hist["eval"]]
    except NonFiniteLossError as e:
        record["diverged"] = str(e)
        record["val_curve"] = []
    record["train_bpb"] = [round(bits_per_byte(v), 6) for v in losses]
    if stop is None and record["diverged"] is None:
        x, y = data.windows("val")                                   # the whole validation split
        record["final_val_bpb"] = bits_per_byte(evaluate_loss(model.eval(), x, y))
    else:
        record["final_val_bpb"] = None
    record["seconds"] = time.perf_counter() - t0
    return record


def summarize(runs, names):
    """Per configuration: final validation bits/byte over the seeds (mean, sample std, n), and the
    paired difference to the baseline of the same seed (mean, sample std)."""
    base = {r["seed"]: r["final_val_bpb"] for r in runs.get("baseline", []) if r["final_val_bpb"] is not None}
    out = {}
    for name in names:
        rs = runs.get(name, [])
        done = [r["final_val_bpb"] for r in rs if r["final_val_bpb"] is not None]
        diff = [r["final_val_bpb"] - base[r["seed"]] for r in rs
                if r["final_val_bpb"] is not None and r["seed"] in base]
        out[name] = {
            "n": len(done), "diverged": sum(r["diverged"] is not None for r in rs),
            "mean": float(np.mean(done)) if done else None,
            "std": float(np.std(done, ddof=1)) if len(done) > 1 else None,
            "diff_mean": float(np.mean(diff)) if diff else None,
            "diff_std": float(np.std(diff, ddof=1)) if len(diff) > 1 else None,
            "parameters": rs[0]["parameters"] if rs else None}
    return out


def _check(args):
    """``check_flags`` for a caller of ``main`` other than ``python -m tformer``."""
    try:
        check_flags(args)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def main(args):
    _check(args)
    config = {k: getattr(args, k) for k in CONFIG_KEYS}
    plan = configurations(config)
    names = [p[0] for p in plan]
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            raise SystemExit(f"--only: unknown configurations {unknown}; expected some of {names}")
        plan = [p for p in plan if p[0] in args.only]
    runs, earlier = {}, []
    if args.resume and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        if old.get("config") == json.loads(json.dumps(config)):
            runs = {name: [r for r in rs if r["seed"] in args.seeds] for name, rs in old["runs"].items()}
            print(f"resuming: {sum(map(len, runs.values()))} runs kept from {args.out}")
            earlier = old.get("earlier_sessions", []) + [   # who made the kept runs, and when
                {k: old[k] for k in SESSION_KEYS if k in old}]
        else:
            print(f"--resume: {args.out} was made with another configuration; starting afresh")
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rec = record("ablate")
    meta = {"command": rec["command"], "commit": rec["commit"], "dirty": rec["dirty"],
            "machine": dict(rec["machine"], cores=os.cpu_count()), "python": platform.python_version(),
            "numpy": np.__version__, "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "load_average_start": list(os.getloadavg()), "started": started}
    documents = None if config["text"] else stdlib_documents()
    datasets = {s: load_data(config, s, documents) for s in args.seeds}
    fingerprint = datasets[args.seeds[0]].fingerprint()
    todo = [(p, s) for p in plan for s in args.seeds
            if not any(r["seed"] == s for r in runs.get(p[0], []))]
    print(f"ablation: {len(todo)} runs of {config['steps']} steps "
          f"(C={config['d_model']}, H={config['n_heads']}, L={config['n_layers']}, "
          f"T={config['max_len']}, B={config['batch_size']}), corpus {fingerprint}")
    t0 = time.perf_counter()
    bar = progress(total=len(todo) * config["steps"], enabled=False if args.no_progress else None,
                   desc="ablate")
    for (name, group, lr, kwargs), seed in todo:
        bar.set_description(f"{name} seed {seed}")
        rec = train_run(config, kwargs, lr, seed, datasets[seed], on_step=lambda: bar.update(1))
        rec.update(group=group, lr=lr, model=build_model(config, kwargs, seed).config)
        runs.setdefault(name, []).append(rec)
        runs[name].sort(key=lambda r: r["seed"])
        end = "diverged" if rec["diverged"] else f"val {rec['final_val_bpb']:.4f} bits/byte"
        bar.write(f"{name:20s} seed {seed}: {end} ({rec['seconds']:.0f} s)")
        result = dict(meta, config=config, corpus_fingerprint=fingerprint, configurations=[
            {"name": n, "group": g, "lr": l, "keywords": k} for n, g, l, k in configurations(config)],
            runs=runs, summary=summarize(runs, names), wall_seconds=time.perf_counter() - t0,
            load_average_end=list(os.getloadavg()),
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        if earlier:
            result["earlier_sessions"] = earlier
        write_json(args.out, result)
    bar.close()
    summary = summarize(runs, names)
    print(f"{'configuration':20s} {'params':>8s}  final val bits/byte (mean ± std, n)   vs baseline")
    for name in names:
        s = summary[name]
        if not s["n"]:
            print(f"{name:20s} {'':>8s}  {'no finished run' if not s['diverged'] else 'diverged'}")
            continue
        std = f"{s['std']:.4f}" if s["std"] is not None else "  –   "
        diff = f"{s['diff_mean']:+.4f}" if s["diff_mean"] is not None else ""
        dstd = f" ± {s['diff_std']:.4f}" if s["diff_std"] is not None else ""
        print(f"{name:20s} {s['parameters']:8,d}  {s['mean']:.4f} ± {std} (n={s['n']}, "
              f"{s['diverged']} diverged)   {diff}{dstd}")
    if not todo:
        print("nothing to run: every run is in the file")
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0
