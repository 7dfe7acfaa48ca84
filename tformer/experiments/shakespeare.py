"""``python -m tformer shakespeare``: TinyGPT learns Shakespeare with nanoGPT's CPU recipe (JSON).

    L = −(1/N) Σ_n ln p(x_{n+1} | x_{≤n})  nats/char,   bits/char = L / ln 2,   perplexity = e^L

nanoGPT's README trains its character-level Shakespeare model on a CPU with
``python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
--log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0``, and the config file sets the rest:
learning rate 1e-3 with 100 warm-up steps and a cosine down to 1e-4, AdamW with β2 = 0.99,
weight decay 0.1 (``train.py``'s default) and the gradient norm clipped to 1.0. ``RECIPE`` holds
those numbers; here they train TinyGPT (the book's byte-level decoder, as it is:
biases, an untied LM head, decay on every parameter) on the plays of
``tformer.data.shakespeare`` as bytes. The text is ASCII, so a byte is a character and the loss is
in nats per character.

For each seed (``--seeds``): the training loss of every step, the loss on fixed, evenly spaced
windows of both splits every ``EVAL_EVERY`` steps (``EVAL_WINDOWS`` windows of 64 characters, about
the size of nanoGPT's 20 batches of 12), the final loss on the whole validation split, and samples
at several temperatures. Then the same recipe once in PyTorch (``tformer.bench.torch_gpt``: the
twin, with seed 0's initial weights copied, the same batches and schedule, ``torch.optim.AdamW``
and ``clip_grad_norm_``), on as many threads as tformer: wall time and loss side by side. The
file records the configuration, the corpus's fingerprint, the commit, the machine and the command
line (``provenance``). The notebook ``notebooks/30_shakespeare.ipynb`` reads it and re-trains the
first ``EVAL_EVERY``-multiples of seed 0's run live (``train_tformer(0, steps=...)``).
"""
import math
import platform
import time

import numpy as np

from tformer.core import parallel
from tformer.core.atomic import write_json
from tformer.data.shakespeare import PLAYS, fingerprint, shakespeare_data, shakespeare_text
from tformer.data.text import decode, encode, evaluate_loss
from tformer.decoding.generate import sample
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW, cosine_with_warmup
from tformer.core.progress import progress
from tformer.runs.flag_groups import Flag, add_output_flags, add_training_flags
from tformer.runs.tinygpt import forward_loss
from tformer.training.train import train
from tformer.core.provenance import load_average, record

# nanoGPT's CPU run (README) on config/train_shakespeare_char.py, in tformer's names.
RECIPE = dict(n_layers=4, n_heads=4, d_model=128, block_size=64, batch_size=12, steps=2000,
              lr=1e-3, min_lr=1e-4, warmup=100, beta1=0.9, beta2=0.99, eps=1e-8,
              weight_decay=0.1, clip=1.0, dropout=0.0, val_fraction=0.1)
EVAL_EVERY, EVAL_WINDOWS = 100, 200
TEMPERATURES, PROMPT, SAMPLE_CHARS = (0.5, 0.8, 1.0), "\n", 400
# nanoGPT README: "this still runs in about ~3 minutes, but gets us a loss of only 1.88" (it does
# not say on which split; its script estimates both on 20 random batches; 65 characters).
NANOGPT = dict(reported_loss=1.88, vocab_size=65, eval_iters=20, minutes=3,
               source="https://github.com/karpathy/nanoGPT README, 'I only have a macbook'")
DEFAULT_OUT = "book/data/shakespeare.json"


def add_arguments(p):
    """The command's flags."""
    add_output_flags(p, out=DEFAULT_OUT)
    add_training_flags(p, seeds=Flag([0, 1, 2], "seeds of the initial weights and of the batches, "
                                                "one run each"),
                       steps=Flag(RECIPE["steps"], "optimizer steps (the recipe's 2000; fewer for "
                                                   "a quick try)"))
    add_output_flags(p, no_torch=Flag(False, "skip the PyTorch twin's run"))


def files(args):
    """What the command writes (``tformer.runs.declare``): ``--out``."""
    from tformer.runs.declare import writes
    return [writes("--out", args.out)]


def check_args(args):
    """``--steps`` longer than the warm-up, ``--seeds`` distinct (ValueError naming the flag)."""
    if args.steps <= RECIPE["warmup"]:
        raise ValueError(f"--steps: expected more than the {RECIPE['warmup']} warm-up steps, "
                         f"got {args.steps}")
    if len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds: expected distinct seeds, got {args.seeds}")


def build(seed):
    """``(model, optimizer, data)`` of the recipe for ``seed`` (initial weights and batches)."""
    r = RECIPE
    model = TinyGPT(d_model=r["d_model"], n_heads=r["n_heads"], n_layers=r["n_layers"],
                    max_len=r["block_size"], dropout=r["dropout"], seed=seed)
    opt = AdamW(model, lr=r["lr"], betas=(r["beta1"], r["beta2"]), eps=r["eps"],
                weight_decay=r["weight_decay"])
    data = shakespeare_data(r["block_size"], r["batch_size"], r["val_fraction"], seed)
    return model, opt, data


def schedule(step, total=RECIPE["steps"]):
    """nanoGPT's learning rate: linear warm-up over 100 steps, cosine from 1e-3 to 1e-4 at ``total``."""
    return cosine_with_warmup(step, RECIPE["lr"], RECIPE["warmup"], total, RECIPE["min_lr"])


def eval_windows(data, n=EVAL_WINDOWS):
    """``{split: (x, y)}``: ``n`` fixed windows of each split, the same at every evaluation."""
    return {s: data.windows(s, n) for s in ("train", "val")}


class Timed:
    """``fn`` wrapped to add the seconds of each call to ``.seconds`` (an evaluation's share)."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args):
        t = time.perf_counter()
        out = self.fn(*args)
        self.seconds += time.perf_counter() - t
        return out


def train_tformer(seed, steps=RECIPE["steps"], total=RECIPE["steps"], progress_bar=None):
    """The first ``steps`` steps of the ``total``-step recipe; ``(model, data, result)``.

    ``result``: ``loss`` (every step), ``curve`` (``[step, train, val]`` nats/char every
    ``EVAL_EVERY`` steps, step 0 included) and ``seconds`` (total, and the evaluations' share).
    """
    model, opt, data = build(seed)
    windows = eval_windows(data)
    evaluate = Timed(lambda m: {s: evaluate_loss(m, x, y) for s, (x, y) in windows.items()})
    start = evaluate(model.eval())                        # step 0, before the timed run
    evaluate.seconds = 0.0
    t = time.perf_counter()
    hist = train(model.train(), opt, data.batch, forward_loss, steps, clip_norm=RECIPE["clip"],
                 lr_schedule=lambda s: schedule(s, total), evaluate=evaluate,
                 eval_every=EVAL_EVERY, progress_bar=progress_bar, desc=f"tformer seed {seed}")
    seconds = {"total": time.perf_counter() - t, "eval": evaluate.seconds}
    curve = [[0, start["train"], start["val"]]]
    curve += [[s, m["train"], m["val"]] for s, m in hist["eval"]]
    return model.eval(), data, {"loss": hist["loss"], "curve": curve, "seconds": seconds}


def final_metrics(model_loss, data):
    """Loss on every window of both splits (``model_loss(x, y) -> nats``): nats, bits, perplexity."""
    out = {}
    for split in ("train", "val"):
        x, y = data.windows(split, data.windows("val")[0].shape[0])
        out[f"{split}_nats"] = float(model_loss(x, y))
    out["val_bits"] = out["val_nats"] / math.log(2.0)
    out["val_perplexity"] = math.exp(out["val_nats"])
    out["val_chars"] = int(data.windows("val")[1].size)
    return out


def samples(model, seed):
    """``{temperature: text}``: ``SAMPLE_CHARS`` characters after ``PROMPT`` at each temperature."""
    prompt = encode(PROMPT)[None, :]
    return {f"{t:g}": decode(sample(model, prompt, SAMPLE_CHARS, temperature=t, seed=seed)[0])
            for t in TEMPERATURES}


def train_torch(seed, steps, data, total=RECIPE["steps"], progress_bar=None):
    """The twin in PyTorch from seed ``seed``'s initial weights, on the same batches and schedule."""
    import torch
    from tformer.bench.torch_gpt import from_tinygpt
    torch.manual_seed(seed)
    torch.set_num_threads(parallel.get_num_threads())
    tm = from_tinygpt(build(seed)[0])
    r = RECIPE
    opt = torch.optim.AdamW(tm.parameters(), lr=r["lr"], betas=(r["beta1"], r["beta2"]),
                            eps=r["eps"], weight_decay=r["weight_decay"])
    windows = eval_windows(data)

    def loss_of(x, y):
        with torch.no_grad():
            z = tm(torch.from_numpy(x))
            return float(torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]),
                                                           torch.from_numpy(y).reshape(-1)))

    evaluate = Timed(lambda: [loss_of(x, y) for x, y in windows.values()])
    curve, losses = [[0, *evaluate()]], []
    evaluate.seconds, t0 = 0.0, time.perf_counter()
    for step in progress(range(1, steps + 1), enabled=progress_bar, desc=f"PyTorch seed {seed}"):
        for group in opt.param_groups:
            group["lr"] = schedule(step, total)
        x, y = (torch.from_numpy(a) for a in data.batch(step - 1))
        z = tm(x)
        loss = torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), r["clip"])
        opt.step()
        losses.append(loss.item())
        if step % EVAL_EVERY == 0 or step == steps:
            tm.eval()
            curve.append([step, *evaluate()])
            tm.train()
    seconds = {"total": time.perf_counter() - t0, "eval": evaluate.seconds}
    return loss_of, {"loss": losses, "curve": curve, "seconds": seconds,
                     "threads": torch.get_num_threads(), "torch": torch.__version__}


def provenance():
    """What ran, where (``tformer.core.provenance.record``: the command line, the commit of this
    repository, the machine, the date, the load), with the CPU, cores and threads named here."""
    rec = record("shakespeare")
    rec.update(cpu=rec["machine"]["cpu"], cores=parallel.available_cores(),
               threads=parallel.get_num_threads(), python=platform.python_version(),
               numpy=np.__version__)
    return rec


def _round(xs, digits=4):
    return [round(float(x), digits) for x in xs]


def main(args):
    t0 = time.perf_counter()
    text = shakespeare_text()
    result = {"provenance": provenance(), "recipe": RECIPE, "steps": args.steps,
              "eval": {"every": EVAL_EVERY, "windows": EVAL_WINDOWS},
              "samples": {"prompt": PROMPT, "chars": SAMPLE_CHARS, "temperatures": list(TEMPERATURES)},
              "nanogpt": NANOGPT, "seeds": {}}
    for seed in args.seeds:
        model, data, run = train_tformer(seed, args.steps, total=args.steps)
        if "corpus" not in result:
            result["corpus"] = {"plays": [list(p) for p in PLAYS], "chars": len(text),
                                "fingerprint": fingerprint(text), "train_bytes": int(data.train.size),
                                "val_bytes": int(data.val.size), "vocab_size": 256,
                                "distinct_chars": len(set(text))}
        run["final"] = final_metrics(lambda x, y: evaluate_loss(model, x, y), data)
        run["samples"] = samples(model, seed)
        run["loss"] = _round(run["loss"])
        run["load_average_after"] = load_average()
        result["seeds"][str(seed)] = run
        f = run["final"]
        print(f"seed {seed}: val {f['val_nats']:.4f} nats/char ({f['val_bits']:.3f} bits, "
              f"perplexity {f['val_perplexity']:.2f}), {run['seconds']['total']:.0f} s", flush=True)
        write_json(args.out, result)
    vals = np.array([r["final"]["val_nats"] for r in result["seeds"].values()])
    result["summary"] = {"val_nats_mean": float(vals.mean()), "val_nats_std": float(vals.std(ddof=1))
                         if vals.size > 1 else 0.0, "val_nats_min": float(vals.min()),
                         "val_nats_max": float(vals.max()), "seeds": len(vals)}
    if not args.no_torch:
        seed = args.seeds[0]
        data = build(seed)[2]
        loss_of, run = train_torch(seed, args.steps, data, total=args.steps)
        run["seed"] = seed
        run["final"] = final_metrics(loss_of, data)
        run["loss"] = _round(run["loss"])
        run["load_average_after"] = load_average()
        result["torch"] = run
        print(f"torch seed {seed}: val {run['final']['val_nats']:.4f} nats/char, "
              f"{run['seconds']['total']:.0f} s on {run['threads']} threads", flush=True)
    result["seconds"] = time.perf_counter() - t0
    write_json(args.out, result)
    s = result["summary"]
    print(f"val {s['val_nats_mean']:.4f} ± {s['val_nats_std']:.4f} nats/char over {s['seeds']} "
          f"seeds; wrote {args.out} ({result['seconds']:.0f} s)")
    return 0
