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

from .. import functional as F
from ..atomic import write_json
from ..data.text import TextData, bits_per_byte, evaluate_loss, stdlib_documents
from ..models.tinygpt import TinyGPT
from ..modern_layers import swiglu_hidden
from ..optim import AdamW, cosine_with_warmup
from ..progress import progress
from .provenance import record
from ..train import NonFiniteLossError, train

DEFAULT_OUT = "book/data/modern_ablation.json"
SESSION_KEYS = ("command", "commit", "dirty", "machine", "python", "numpy", "blas_threads", "load_average_start",
                "load_average_end", "started", "finished", "wall_seconds")
CONFIG_KEYS = ("d_model", "n_heads", "n_layers", "max_len", "batch_size", "steps", "lr", "high_lr",
               "min_lr_ratio", "warmup", "weight_decay", "clip", "eval_every", "eval_windows",
               "n_kv_heads", "seeds", "text")


def add_arguments(p):
    p.add_argument("--out", default=DEFAULT_OUT, help="the JSON file to write")
    p.add_argument("--text", metavar="FILE", default=None,
                   help="train on this file instead of the standard-library corpus")
    p.add_argument("--d-model", type=int, default=64, help="width C")
    p.add_argument("--n-heads", type=int, default=4, help="attention heads H")
    p.add_argument("--n-layers", type=int, default=2, help="blocks")
    p.add_argument("--max-len", type=int, default=64, help="context length T")
    p.add_argument("--batch-size", type=int, default=32, help="windows per step B")
    p.add_argument("--steps", type=int, default=500, help="optimizer steps of every run")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (run tinygpt's)")
    p.add_argument("--high-lr", type=float, default=3e-2, help="peak learning rate of the pre/post study")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final learning rate / peak")
    p.add_argument("--warmup", type=int, default=50, help="linear warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1, help="λ of AdamW's decoupled decay")
    p.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip")
    p.add_argument("--eval-every", type=int, default=50, help="validation loss every this many steps")
    p.add_argument("--eval-windows", type=int, default=64, help="windows of the intermediate evaluations")
    p.add_argument("--n-kv-heads", type=int, default=None, help="key/value heads of gqa (default H/2)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run only these configurations (names as in the file)")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs of an existing --out made with the same configuration")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def files(args):
    """What the command reads and writes (``tformer.runs.declare``): ``--text``; ``--out``
    (read first with ``--resume``)."""
    from ..runs.declare import reads, updates, writes
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
    for name in ("d_model", "n_heads", "n_layers", "max_len", "batch_size", "steps", "eval_every",
                 "eval_windows"):
        value = getattr(args, name)
        if value < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: expected an integer ≥ 1, got {value}")
    for name in ("lr", "high_lr"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise SystemExit(f"--{name.replace('_', '-')}: expected a positive number, got {value}")
    if not 0.0 <= args.min_lr_ratio <= 1.0:
        raise SystemExit(f"--min-lr-ratio: expected a value in [0, 1], got {args.min_lr_ratio}")
    if len(set(args.seeds)) != len(args.seeds):
        raise SystemExit(f"--seeds: expected distinct seeds, got {args.seeds}")


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
