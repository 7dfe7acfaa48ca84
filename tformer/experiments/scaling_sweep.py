"""``python -m tformer scaling-sweep``: IsoFLOP profiles of TinyGPT on all 38 plays (JSON).

    f(s)  = 6·N_mm(s) + 12·L·T·C          FLOPs per training token of shape s (tformer.bench.flops)
    N_mm  = L·(4C² + 2C·4C) + C·V         the weights that enter a matrix product (LM head included)
    D_ij  = C_i / f(s_j)                   tokens of shape s_j at compute budget C_i
    steps = round(D_ij / (B·T)),   loss = nats per character of the eight plays' validation text

For each compute budget ``C_i`` (``--budgets``, FLOPs) and each of ``--sizes`` shapes spread over
tokens per weight (below), one TinyGPT is trained from scratch for the tokens the budget
buys, with its learning rate on a cosine that ends at its own last step (Hoffmann et al. 2022:
a schedule longer than the run overstates the loss of the short runs). FLOPs are counted as the
Performance chapter counts them (``train_step_flops``: forward and backward, every matrix product,
attention's T² included, elementwise work left out); the seconds of every run are measured too, so
that the count can be held against the clock (FLOP/s per shape).

**Which shapes.** ``SHAPES`` is a ladder of (layers, width), heads of width about 32, each 1.2 to 2×
the last in N_mm. A budget takes the ``--sizes`` rungs whose tokens per weight D/N_mm come nearest
to targets spread evenly in log from 60 down to 0.6 (``TOKENS_PER_WEIGHT``): Chinchilla's 20 lies
inside, and the profile reaches far enough either side that the fit, not a guess, finds the
minimum.

**Resumable.** Every finished run is appended to ``--out`` at once (``tformer.core.atomic``: whole file
or old file, never half). A run is named by its ``key`` (vocabulary, context, batch, shape,
budget, seed, learning rate); a new start reads the file, checks that the corpus, tokenizer and
recipe are the ones it holds (else it stops, naming the difference) and skips every key there.

``--plan-only`` measures a few steps of every shape (seconds per step), prints the plan with its
expected time and exits.
"""
import argparse
import math
import os
import time

import numpy as np

from tformer.nn import functional as F
from tformer.core import parallel
from tformer.core.atomic import write_json
from tformer.bench.flops import train_step_flops
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW
from tformer.core.progress import progress
from tformer.runs.flag_groups import Flag, add_data_flags, add_output_flags, add_training_flags
from tformer.runs.flags import UsageError, flops, idle, positive_int, positive_learning_rate
from tformer.runs.declare import updates
from tformer.training.schedules import cosine_with_warmup
from tformer.training.train import train
from tformer.core.provenance import load_average, now, record
from tformer.experiments.scaling_corpus import prepare

DEFAULT_OUT = "book/data/scaling_sweep.json"
MAX_VOCAB = 65536
# (n_layers, d_model): heads of width about 32 (C/32 of them, rounded, at least one), N_mm growing
# by 1.1-2× a rung (at V = 8192 the LM head, C·V, is most of N_mm on the lower rungs).
SHAPES = ((2, 16), (2, 32), (2, 48), (2, 64), (2, 96), (3, 96), (3, 128), (4, 128), (4, 160),
          (5, 192), (6, 192), (6, 224), (6, 256), (8, 256))
HEAD_WIDTH = 32
# The range of tokens per weight each profile spans: Chinchilla's 20 inside it, and room on both
# sides (in the vocabulary probe, 4x128 at D/N ≈ 0.4 and 2x32 at D/N ≈ 5 came within 0.03).
TOKENS_PER_WEIGHT = (0.6, 60.0)
# The chapter "TinyGPT learns Shakespeare"'s recipe (nanoGPT's CPU run: T = 64, B = 12, AdamW
# with lr 1e-3 → 1e-4 on a cosine, β2 = 0.99, decay 0.1, clip 1), its warm-up 5 % of each run.
RECIPE = dict(block_size=64, batch_size=12, lr=1e-3, min_lr_ratio=0.1, warmup_fraction=0.05,
              beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, clip=1.0, dropout=0.0)
# The smallest vocabulary within 0.02 nats/char of the best the probe measured (4x128 at 8e12
# FLOPs: 1.480 at 4096, 1.434 at 8192, 1.424 at 16384; book/data/scaling_vocab.json).
DEFAULT_VOCAB = 8192
DEFAULT_BUDGETS = (2.5e12, 6.3e12, 1.6e13, 4e13)


def shape_name(shape):
    return f"{shape[0]}x{shape[1]}"


def model_config(shape, vocab_size, block_size):
    """TinyGPT's keywords for ``shape = (n_layers, d_model)``: round(C/32) heads, d_ff = 4C."""
    L, C = shape
    return dict(n_layers=L, d_model=C, n_heads=heads(C), d_ff=4 * C,
                vocab_size=vocab_size, max_len=block_size)


def heads(d_model):
    """round(C / ``HEAD_WIDTH``) heads, at least one."""
    return max(1, round(d_model / HEAD_WIDTH))


def weights(shape, vocab_size):
    """N_mm = L·(4C² + 2C·4C) + C·V: the weights of the matrix products (the N of 6·N·D)."""
    L, C = shape
    return L * 12 * C * C + C * vocab_size


def flops_per_token(shape, vocab_size, block_size):
    """f = 6·N_mm + 12·L·T·C: one training step's FLOPs (``train_step_flops``) per token."""
    cfg = model_config(shape, vocab_size, block_size)
    return train_step_flops(cfg, 1, block_size) / block_size


def shapes_for(budget, vocab_size, block_size, sizes, shapes=SHAPES):
    """``sizes`` rungs of ``shapes`` whose tokens per weight D/N_mm are nearest ``sizes`` targets
    spaced evenly in log over ``TOKENS_PER_WEIGHT`` (each rung once), smallest N first."""
    ratio = np.array([budget / flops_per_token(s, vocab_size, block_size) / weights(s, vocab_size)
                      for s in shapes])
    lo, hi = TOKENS_PER_WEIGHT
    chosen = []
    for target in np.geomspace(hi, lo, sizes):
        free = [i for i in range(len(shapes)) if i not in chosen]
        chosen.append(min(free, key=lambda i: abs(math.log(ratio[i] / target))))
    return [shapes[i] for i in sorted(chosen)]


def run_key(run):
    """The name of a run: everything that changes what it computes."""
    L, C = run["shape"]
    return (f"V{run['vocab_size']}-T{run['block_size']}-B{run['batch_size']}-L{L}-C{C}"
            f"-budget{run['budget']:.4g}-seed{run['seed']}-lr{run['lr']:g}")


def plan(budgets, vocab_sizes, seeds, sizes, recipe=RECIPE, shapes=SHAPES, lr=None):
    """Every run of the sweep, smallest budget first: ``[dict(key, shape, budget, steps, ...)]``.

    ``steps = max(1, round(C / (f·B·T)))``; ``flops = steps·B·T·f``, the count actually spent."""
    T, B = recipe["block_size"], recipe["batch_size"]
    runs = []
    for budget in sorted(budgets):
        for V in vocab_sizes:
            for shape in shapes_for(budget, V, T, sizes, shapes):
                f = flops_per_token(shape, V, T)
                steps = max(1, round(budget / (f * B * T)))
                for seed in seeds:
                    run = dict(shape=list(shape), vocab_size=V, block_size=T, batch_size=B,
                               budget=float(budget), seed=seed, lr=lr or recipe["lr"],
                               n_weights=weights(shape, V), flops_per_token=f, steps=steps,
                               tokens=steps * B * T, flops=steps * B * T * f)
                    run["key"] = run_key(run)
                    runs.append(run)
    return runs


def build(run, recipe=RECIPE):
    """``(model, optimizer)`` of a run, initial weights from its seed."""
    model = TinyGPT(**model_config(run["shape"], run["vocab_size"], run["block_size"]),
                    dropout=recipe["dropout"], seed=run["seed"])
    opt = AdamW(model, lr=run["lr"], betas=(recipe["beta1"], recipe["beta2"]), eps=recipe["eps"],
                weight_decay=recipe["weight_decay"])
    return model, opt


def schedule(run, recipe=RECIPE):
    """lr(step): linear warm-up over 5 % of the run, cosine to a tenth of the peak at its end."""
    steps = run["steps"]
    warmup = max(1, round(recipe["warmup_fraction"] * steps))
    return lambda s: cosine_with_warmup(s, run["lr"], warmup, max(steps, warmup + 1),
                                        run["lr"] * recipe["min_lr_ratio"])


def forward_loss(model, batch):
    return F.cross_entropy(model.forward(batch[0]), batch[1])


def token_data(run, corpus):
    """The batches of a run: ``TokenData`` of the corpus's splits at the run's T, B and seed."""
    from tformer.data.tokens import TokenData
    c = corpus.tokens
    return TokenData(c.train, c.val, c.token_lengths, run["block_size"], run["batch_size"],
                     run["seed"])


def train_model(run, corpus, recipe=RECIPE, on_step=None):
    """Train one run from its seed: ``(model, history, seconds, cpu_seconds)``."""
    data = token_data(run, corpus)
    model, opt = build(run, recipe)

    def batch(i):
        if on_step is not None:
            on_step()
        return data.batch(i)

    t0, cpu0 = time.perf_counter(), time.process_time()
    hist = train(model, opt, batch, forward_loss, run["steps"], clip_norm=recipe["clip"],
                 lr_schedule=schedule(run, recipe), progress_bar=False)
    return model, hist, time.perf_counter() - t0, time.process_time() - cpu0


def train_run(run, corpus, recipe=RECIPE, on_step=None):
    """Train one run and measure it: ``run`` plus its losses, seconds and parameters."""
    c = corpus.tokens
    model, hist, seconds, cpu_seconds = train_model(run, corpus, recipe, on_step)
    t1 = time.perf_counter()
    val = corpus.nats_per_char(model.eval(), run["block_size"])
    every = max(1, run["steps"] // 50)
    loss = np.asarray(hist["loss"])
    return dict(run, val_nats_per_char=val, params=model.num_parameters(),
                train_loss_last=float(loss[-max(1, run["steps"] // 20):].mean()),
                train_curve=[[s, round(float(v), 4)] for s, v in zip(hist["step"][::every],
                                                                     loss[::every])],
                epochs=run["tokens"] / c.train.size, seconds=seconds, cpu_seconds=cpu_seconds,
                eval_seconds=time.perf_counter() - t1, gflops_per_s=run["flops"] / seconds / 1e9,
                gflops_per_cpu_s=run["flops"] / cpu_seconds / 1e9,
                threads=parallel.get_num_threads(), load_average_after=load_average(),
                finished=now())


def time_steps(shape, vocab_size, recipe=RECIPE, steps=4, seed=0):
    """Median CPU seconds of one training step of ``shape`` (after one warm-up step): the
    process's CPU time, which other processes on a shared machine do not inflate as they do
    the wall clock."""
    run = dict(shape=list(shape), vocab_size=vocab_size, block_size=recipe["block_size"],
               batch_size=recipe["batch_size"], seed=seed, lr=recipe["lr"], steps=steps + 1)
    model, opt = build(run, recipe)
    rng = np.random.default_rng(seed)
    T, B = recipe["block_size"], recipe["batch_size"]
    x = rng.integers(0, vocab_size, (B, T + 1))
    times = []
    for _ in range(steps + 1):
        t = time.process_time()
        model.zero_grad()
        _, dlogits = forward_loss(model, (x[:, :-1], x[:, 1:]))
        model.backward(dlogits)
        opt.step()
        times.append(time.process_time() - t)
    return float(np.median(times[1:]))


def print_plan(runs, step_seconds):
    """The plan, one line per run, and the expected hours (measured seconds per step × steps)."""
    total = 0.0
    print(f"{'budget':>9s} {'shape':>6s} {'V':>5s} {'N_mm':>9s} {'tokens':>11s} {'D/N':>7s} "
          f"{'steps':>7s} {'s/step':>7s} {'minutes':>8s}")
    for r in runs:
        s = step_seconds[f"{shape_name(r['shape'])}-V{r['vocab_size']}"]
        total += s * r["steps"]
        print(f"{r['budget']:9.3g} {shape_name(r['shape']):>6s} {r['vocab_size']:5d} "
              f"{r['n_weights']:9,d} {r['tokens']:11,d} {r['tokens'] / r['n_weights']:7.1f} "
              f"{r['steps']:7d} {s:7.4f} {s * r['steps'] / 60:8.1f}")
    print(f"{len(runs)} runs, {sum(r['flops'] for r in runs):.3g} FLOPs, expected "
          f"{total / 3600:.2f} h of training at the measured step times "
          f"({parallel.get_num_threads()} thread(s))", flush=True)
    return total


def add_arguments(p):
    """The command's flags."""
    add_output_flags(p, out=Flag(DEFAULT_OUT, "the JSON file to write (and to resume)"))
    p.add_argument("--budgets", type=flops, nargs="+", default=list(DEFAULT_BUDGETS),
                   help="compute budgets C in FLOPs, one IsoFLOP profile each")
    p.add_argument("--sizes", type=positive_int, default=5, help="model shapes per budget")
    add_data_flags(p, vocab_sizes=Flag([DEFAULT_VOCAB], "BPE vocabularies V (256: bytes), each "
                                                       "trained on the training split",
                                       type=positive_int))
    add_training_flags(p, seeds=Flag([0], "seeds, one run per seed"))
    p.add_argument("--shapes", type=parse_shape, nargs="+", default=list(SHAPES),
                   help="the ladder of shapes LAYERSxWIDTH to choose from (e.g. 4x128)")
    add_training_flags(p, lr=Flag(RECIPE["lr"], type=positive_learning_rate))
    p.add_argument("--plan-only", action="store_true",
                   help="time a step of every shape, print the plan and its expected time, exit")
    add_output_flags(p, no_progress=False)


def parse_shape(text):
    """``"4x128"`` -> ``(4, 128)``: layers × width, the width a multiple of the head width."""
    try:
        L, C = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LAYERSxWIDTH such as 4x128, got {text!r}") from None
    if not (1 <= L <= MAX_LAYERS and 1 <= C <= MAX_WIDTH) or C % heads(C):
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_LAYERS} layers and a width C of at "
                                         f"most {MAX_WIDTH} that round(C/{HEAD_WIDTH}) heads "
                                         f"divide, got {text!r}")
    return L, C


# The largest shape of --shapes: 4 times the ladder's deepest and widest (8x256), a step of one
# CPU's seconds, not its hours.
MAX_LAYERS, MAX_WIDTH = 32, 1024


def files(args):
    """What the command reads and writes (``tformer.runs.declare``): ``--out``, whose runs of the
    same setup are kept (read if it exists); nothing with ``--plan-only``."""
    return [] if args.plan_only else [updates("--out", args.out)]


def unused_flags(args):
    """``--plan-only`` prints the plan: no run, no file (``--no-progress``, which only silences,
    is taken anywhere)."""
    return idle(["--out"], "with --plan-only (it prints the plan and exits)",
                args.plan_only)


def check_args(args):
    """Vocabularies ≥ 256, seeds and vocabularies distinct."""
    if min(args.vocab_sizes) < 256 or max(args.vocab_sizes) > MAX_VOCAB:
        raise ValueError(f"--vocab-sizes: expected sizes ≥ 256 (the 256 bytes) and at most "
                         f"{MAX_VOCAB:,} (BPE merges of the plays' text), got {args.vocab_sizes}")
    for name in ("vocab_sizes", "seeds", "budgets"):
        values = getattr(args, name)
        if len(set(values)) != len(values):
            raise ValueError(f"--{name.replace('_', '-')}: expected distinct values, got {values}")
    if args.sizes > len(args.shapes):
        raise ValueError(f"--sizes: expected at most {len(args.shapes)} (the ladder of --shapes), "
                         f"got {args.sizes}")
    from tformer.runs.declare import check
    from tformer.runs.flags import json_object_file
    check(files(args))                   # python -m tformer checked it already; main calls this too
    if not args.plan_only:               # its runs are kept: read before hours of BPE and timing
        json_object_file("--out", args.out, "a scaling-sweep result to resume")


def load_previous(path, setup):
    """The runs already in ``path`` (``{}`` if there is no file); UsageError if its setup differs."""
    if not os.path.exists(path):
        return {}
    import json
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise UsageError(f"--out: expected a scaling-sweep result to resume in {path!r}, got a "
                         f"file that does not read as one ({e})") from None
    if not isinstance(old, dict) or not isinstance(old.get("runs", []), list):
        raise UsageError(f"--out: expected a scaling-sweep result to resume in {path!r}, got JSON "
                         f"of another kind")
    for name, value in setup.items():
        if json.loads(json.dumps(value)) != old.get(name):
            raise UsageError(f"--out: {path} holds runs of another {name} ({old.get(name)!r}, now "
                             f"{value!r}); write to another --out or move the file")
    bad = next((r for r in old.get("runs", []) if not isinstance(r, dict)
                or not isinstance(r.get("key"), str)), None)
    if bad is not None:
        raise UsageError(f"--out: expected a scaling-sweep result to resume in {path!r}, got a run "
                         f"without its key: {str(bad)[:80]}")
    return {r["key"]: r for r in old.get("runs", [])}


def main(args):
    check_args(args)
    t_start = time.perf_counter()
    corpora = {V: prepare(V) for V in args.vocab_sizes}
    setup = {"recipe": RECIPE, "head_width": HEAD_WIDTH,
             "corpora": {str(V): {k: v for k, v in c.info.items() if k != "bpe_seconds"}
                         for V, c in corpora.items()}}      # what the runs depend on, no timing
    for V, c in corpora.items():
        i = c.info
        print(f"V={V}: {i['chars_per_token_train']:.3f} chars/token, {i['train_tokens']:,} training "
              f"tokens, yardstick {i['yardstick_chars']:,} chars = {i['yardstick_tokens']:,} tokens, "
              f"BPE trained in {i['bpe_seconds']:.1f} s", flush=True)
    runs = plan(args.budgets, args.vocab_sizes, args.seeds, args.sizes,
                shapes=[tuple(s) for s in args.shapes], lr=args.lr)
    step_seconds = {f"{shape_name(r['shape'])}-V{r['vocab_size']}": None for r in runs}
    for name in step_seconds:
        shape, V = name.split("-V")
        step_seconds[name] = time_steps(tuple(map(int, shape.split("x"))), int(V))
    expected = print_plan(runs, step_seconds)
    if args.plan_only:
        return 0
    done = load_previous(args.out, setup)
    todo = [r for r in runs if r["key"] not in done]
    print(f"{len(done)} runs already in {args.out}; {len(todo)} to go", flush=True)
    prov = record("scaling-sweep")
    bar = progress(total=sum(r["steps"] for r in todo), enabled=False if args.no_progress else None,
                   desc="scaling-sweep")
    for r in todo:
        bar.set_description(f"C={r['budget']:.3g} {shape_name(r['shape'])} V={r['vocab_size']}")
        rec = train_run(r, corpora[r["vocab_size"]], on_step=lambda: bar.update(1))
        rec["commit"], rec["dirty"] = prov["commit"], prov["dirty"]
        done[rec["key"]] = rec
        bar.write(f"{rec['key']}: {rec['val_nats_per_char']:.4f} nats/char, {rec['seconds']:.0f} s, "
                  f"{rec['gflops_per_s']:.1f} GFLOP/s")
        write_json(args.out, dict(setup, provenance=prov, bpe_seconds={
                                  str(V): c.info["bpe_seconds"] for V, c in corpora.items()}, plan={"budgets": sorted(args.budgets),
                                  "sizes": args.sizes, "vocab_sizes": args.vocab_sizes,
                                  "shapes": [list(s) for s in args.shapes], "lr": args.lr,
                                  "seeds": args.seeds, "expected_seconds": expected,
                                  "step_seconds": step_seconds},
                                  runs=sorted(done.values(), key=lambda x: (x["budget"], x["key"])),
                                  updated=now()))
    bar.close()
    print(f"{len(done)} runs in {args.out}; {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0
