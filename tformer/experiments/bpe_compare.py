"""``python -m tformer bpe-compare --out FILE``: TinyGPT on bytes against TinyGPT on BPE tokens (JSON).

The chapter "Tokens: byte-pair encoding by hand" reads the file. On the Shakespeare corpus
(``tformer.data.shakespeare``, or ``--text FILE``), split as ``run tinygpt`` splits any corpus
(the last ``--val-fraction`` of each document held out), for every ``--vocab-sizes`` entry V:

- a byte-level BPE tokenizer (``tformer.data.bpe``) is trained on the *training* split only (V = 256:
  no merge, the bytes themselves), its training time measured; both splits are encoded and the
  bytes per token of each recorded;
- TinyGPT with ``vocab_size=V`` is trained once per ``--seeds`` entry at equal compute: the same
  width, depth, heads, context of ``--max-len`` tokens, batch and steps for every V (only the
  embedding and the LM head grow with V), the seed setting both the initialisation and the
  batches;
- its loss is measured in bits per *byte* of the same validation text for every V
  (``TokenData.bits_per_byte``: N·L / (n·ln 2)), on ``--eval-windows`` fixed windows every
  ``--eval-every`` steps and on the whole validation split at the end.

The file holds the configuration, the command line, the commit, the machine, the load average, the
dates and the wall time; it is rewritten (atomically) after every run.
"""
import argparse
import hashlib
import json
import math
import os
import platform
import time
from datetime import datetime, timezone

import numpy as np

from tformer.nn import functional as F
from tformer.core.atomic import write_json
from tformer.data.bpe import BPETokenizer, most_tokens
from tformer.data.text import TextData
from tformer.data.tokens import TokenData
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW
from tformer.core.parallel import get_num_threads
from tformer.core.progress import progress
from tformer.core.provenance import record
from tformer.training.schedules import cosine_with_warmup
from tformer.runs.fits import check_fits
from tformer.runs.flag_groups import (Flag, add_data_flags, add_model_flags, add_output_flags,
                                      add_training_flags)
from tformer.runs.flags import UsageError, heads_divide, probability, text_file
from tformer.runs.declare import reads, writes
from tformer.training.train import train

DEFAULT_OUT = "book/data/bpe.json"
CONFIG_KEYS = ("vocab_sizes", "seeds", "d_model", "n_heads", "n_layers", "max_len", "batch_size",
               "steps", "lr", "min_lr", "warmup", "beta2", "weight_decay", "clip", "eval_every",
               "eval_windows", "val_fraction", "text")


def add_arguments(p):
    add_output_flags(p, out=DEFAULT_OUT)
    add_data_flags(p, text=Flag(None, "use this file (one document) instead of the Shakespeare "
                                      "corpus"),
                   vocab_sizes=[256, 512, 1024, 2048])
    add_training_flags(p, seeds=Flag([0, 1, 2], "one run per seed and V"))
    add_model_flags(p, d_model=128, n_heads=4, n_layers=4,
                    max_len=Flag(64, "context length T, in tokens"))
    add_training_flags(p, batch_size=12, steps=Flag(1000, "optimizer steps of every run"), lr=1e-3,
                       min_lr=Flag(1e-4, "learning rate at the last step"), warmup=100)
    p.add_argument("--beta2", type=probability, default=0.99, help="AdamW's β₂ (β₁ = 0.9)")
    add_training_flags(p, weight_decay=0.1, clip=Flag(1.0, "global gradient-norm clip"),
                       eval_every=Flag(250, "validation every this many steps"),
                       eval_windows=Flag(64, "windows of those evaluations"))
    add_data_flags(p, val_fraction=0.1)
    add_output_flags(p, no_progress=False)


def files(args):
    """What the command reads and writes (``tformer.runs.declare``)."""
    return [reads("--text", args.text), writes("--out", args.out)]


def check_args(args):
    """Flags that cannot run: a ValueError naming the flag (the usage error of the command)."""
    for name in ("d_model", "n_heads", "n_layers", "max_len", "batch_size", "steps", "eval_every",
                 "eval_windows"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected an integer ≥ 1, "
                             f"got {getattr(args, name)}")
    bad = [v for v in args.vocab_sizes if v < 256]
    if bad:
        raise ValueError(f"--vocab-sizes: expected sizes ≥ 256 (the 256 bytes), got {bad}")
    for name in ("vocab_sizes", "seeds"):
        values = getattr(args, name)
        if len(set(values)) != len(values):
            raise ValueError(f"--{name.replace('_', '-')}: expected distinct values, got {values}")
    if not (math.isfinite(args.lr) and args.lr > 0 and 0 <= args.min_lr <= args.lr):
        raise ValueError(f"--lr, --min-lr: expected 0 ≤ min-lr ≤ lr and lr > 0, "
                         f"got {args.lr}, {args.min_lr}")
    if not 0.0 < args.val_fraction < 1.0:
        raise ValueError(f"--val-fraction: expected a value in (0, 1), got {args.val_fraction}")
    if args.warmup >= args.steps:
        raise ValueError(f"--warmup: expected fewer steps than --steps {args.steps}, got {args.warmup}")
    heads_divide(args.d_model, args.n_heads)
    if args.text:
        text_file(args.text, args.max_len, args.val_fraction)
        with open(args.text, "rb") as f:
            most = most_tokens(f.read())
        if max(args.vocab_sizes) > most:
            raise ValueError(f"--vocab-sizes: expected sizes of at most {most:,} (the 256 bytes "
                             f"and the {most - 256:,} merges --text allows), got "
                             f"{max(args.vocab_sizes):,}")
    check_fits(argparse.Namespace(**vars(args), d_ff=None, gradient_checkpointing=False,
                                  blocks_per_segment=1, attention="plain"),
               vocab_size=max(args.vocab_sizes))


def documents(config):
    """``[(name, bytes)]``: the Shakespeare plays, or ``config["text"]``'s file."""
    if config["text"]:
        with open(config["text"], "rb") as f:
            return [(os.path.basename(config["text"]), f.read())]
    from tformer.data.shakespeare import shakespeare_documents
    return shakespeare_documents()


def merges_fingerprint(tokenizer):
    """The first 12 hex digits of the SHA-256 of the merges as JSON: equal prints, equal merges."""
    return hashlib.sha256(json.dumps(tokenizer.merges).encode()).hexdigest()[:12]


def prepare(config, docs=None):
    """The byte splits and, for each V, its tokenizer (trained on the training split) and the
    ``TokenData`` of seed 0: ``(text_data, {V: (tokenizer, token_data, seconds to train)})``."""
    text_data = TextData(docs if docs is not None else documents(config), config["max_len"],
                         config["batch_size"], config["val_fraction"], 0)
    out = {}
    most = most_tokens(text_data.train.tobytes())
    if max(config["vocab_sizes"]) > most:
        raise UsageError(f"--vocab-sizes: expected sizes of at most {most:,} (the 256 bytes and "
                         f"the {most - 256:,} merges the training split allows), got "
                         f"{max(config['vocab_sizes']):,}")
    for V in config["vocab_sizes"]:
        t0 = time.perf_counter()
        tokenizer = BPETokenizer.train(text_data.train.tobytes(), V)
        seconds = time.perf_counter() - t0
        try:
            out[V] = (tokenizer, TokenData.encode(text_data, tokenizer), seconds)
        except ValueError as e:
            raise UsageError(f"--max-len: expected a window of {config['max_len']} + 2 tokens in "
                             f"each split at V = {V}, got fewer ({e})") from None
    return text_data, out


def build_model(config, vocab_size, seed):
    return TinyGPT(d_model=config["d_model"], n_heads=config["n_heads"], n_layers=config["n_layers"],
                   max_len=config["max_len"], vocab_size=vocab_size, seed=seed)


def train_run(config, data, seed, stop=None, on_step=None):
    """Train TinyGPT (``vocab_size`` = the data's) on ``data`` with batches of ``seed``.

    Returns the record: per-step training loss (nats per token), validation bits/byte every
    ``eval_every`` steps and, unless ``stop`` ends the run early, on the whole validation split.
    """
    data = TokenData(data.train, data.val, data.token_lengths, config["max_len"],
                     config["batch_size"], seed, data.names)
    model = build_model(config, data.vocab_size, seed)
    opt = AdamW(model, lr=config["lr"], betas=(0.9, config["beta2"]), eps=1e-8,
                weight_decay=config["weight_decay"])

    def schedule(step):
        return cosine_with_warmup(step, config["lr"], config["warmup"], config["steps"],
                                  config["min_lr"])

    def batch(i):
        if on_step is not None:
            on_step()
        return data.batch(i)

    def evaluate(m):
        return {"val_bpb": data.bits_per_byte(m, "val", config["eval_windows"])}

    t0 = time.perf_counter()
    hist = train(model, opt, batch, lambda m, b: F.cross_entropy(m.forward(b[0]), b[1]),
                 stop or config["steps"], clip_norm=config["clip"], lr_schedule=schedule,
                 evaluate=None if stop else evaluate, eval_every=config["eval_every"],
                 progress_bar=False)
    record = {"seed": seed, "parameters": model.num_parameters(),
              "train_loss": [round(float(v), 6) for v in hist["loss"]],
              "val_curve": [[s, round(m["val_bpb"], 6)] for s, m in hist["eval"]]}
    record["final_val_bpb"] = None if stop else data.bits_per_byte(model.eval(), "val")
    record["seconds"] = time.perf_counter() - t0
    return record


def tokenizer_record(tokenizer, data, seconds, config):
    bpt = data.bytes_per_token("train")
    return {"vocab_size": tokenizer.vocab_size, "merges": len(tokenizer.merges),
            "merges_fingerprint": merges_fingerprint(tokenizer), "train_seconds": seconds,
            "train_tokens": int(data.train.size), "val_tokens": int(data.val.size),
            "bytes_per_token_train": bpt, "bytes_per_token_val": data.bytes_per_token("val"),
            "context_bytes": config["max_len"] * bpt,
            "tokens_per_step": config["batch_size"] * config["max_len"],
            "bytes_per_step": config["batch_size"] * config["max_len"] * bpt,
            "epochs": config["steps"] * config["batch_size"] * config["max_len"] / data.train.size}


def summarize(runs, vocab_sizes):
    """Per V: final validation bits/byte over the seeds (mean, sample std, n) and the paired
    difference to the smallest V (bytes, when 256 is in the list) of the same seed."""
    base_v = min(vocab_sizes)
    base = {r["seed"]: r["final_val_bpb"] for r in runs.get(str(base_v), [])}
    out = {}
    for V in vocab_sizes:
        done = [r["final_val_bpb"] for r in runs.get(str(V), [])]
        diff = [r["final_val_bpb"] - base[r["seed"]] for r in runs.get(str(V), []) if r["seed"] in base]
        out[str(V)] = {"n": len(done), "mean": float(np.mean(done)) if done else None,
                       "std": float(np.std(done, ddof=1)) if len(done) > 1 else None,
                       "diff_mean": float(np.mean(diff)) if diff else None,
                       "diff_std": float(np.std(diff, ddof=1)) if len(diff) > 1 else None,
                       "versus": base_v}
    return out


def main(args):
    check_args(args)
    config = {k: getattr(args, k) for k in CONFIG_KEYS}
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rec = record("bpe-compare")
    meta = {"command": rec["command"], "commit": rec["commit"], "dirty": rec["dirty"],
            "machine": dict(rec["machine"], cores=os.cpu_count()),
            "python": platform.python_version(), "numpy": np.__version__,
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "tformer_threads": get_num_threads(),
            "load_average_start": list(os.getloadavg()), "started": started}
    text_data, prepared = prepare(config)
    tokenizers = {str(V): tokenizer_record(tok, data, sec, config)
                  for V, (tok, data, sec) in prepared.items()}
    print(f"corpus {text_data.fingerprint()}: train {text_data.train.size:,} bytes, "
          f"val {text_data.val.size:,} bytes")
    for V, rec in tokenizers.items():
        print(f"V={V:>5s}: {rec['bytes_per_token_train']:.3f} bytes/token, trained in "
              f"{rec['train_seconds']:.2f} s, context {rec['context_bytes']:.0f} bytes")
    runs, t0 = {}, time.perf_counter()
    todo = [(V, s) for V in config["vocab_sizes"] for s in config["seeds"]]
    bar = progress(total=len(todo) * config["steps"], enabled=False if args.no_progress else None,
                   desc="bpe-compare")
    for V, seed in todo:
        bar.set_description(f"V={V} seed {seed}")
        rec = train_run(config, prepared[V][1], seed, on_step=lambda: bar.update(1))
        runs.setdefault(str(V), []).append(rec)
        bar.write(f"V={V:5d} seed {seed}: val {rec['final_val_bpb']:.4f} bits/byte "
                  f"({rec['seconds']:.0f} s)")
        write_json(args.out, dict(
            meta, config=config, corpus_fingerprint=text_data.fingerprint(),
            corpus_bytes={"train": int(text_data.train.size), "val": int(text_data.val.size)},
            tokenizers=tokenizers, runs=runs, summary=summarize(runs, config["vocab_sizes"]),
            wall_seconds=time.perf_counter() - t0, load_average_end=list(os.getloadavg()),
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds")))
    bar.close()
    summary = summarize(runs, config["vocab_sizes"])
    print(f"{'V':>5s}  bytes/token  val bits/byte (mean ± std, n)   vs V={min(config['vocab_sizes'])}")
    for V in config["vocab_sizes"]:
        s = summary[str(V)]
        std = f"{s['std']:.4f}" if s["std"] is not None else "  –   "
        dstd = f" ± {s['diff_std']:.4f}" if s["diff_std"] is not None else ""
        print(f"{V:5d}  {tokenizers[str(V)]['bytes_per_token_train']:11.3f}  {s['mean']:.4f} ± "
              f"{std} (n={s['n']})   {s['diff_mean']:+.4f}{dstd}")
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0
