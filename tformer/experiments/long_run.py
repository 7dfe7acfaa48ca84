"""``python -m tformer long-run``: the scaling law chooses a model, predicts its loss, then it trains.

    D' = U + U·R*·(1 − e^(−R/R*)),   R = D/U − 1           effective tokens of D drawn from U unique
    L̂(N, D') = E + A/N^α + B/D'^β                         fitted to the sweep (``scaling_fit``)
    s* = argmin_s L̂(N_mm(s), D'(C / f(s)))                  the ladder's best shape at budget C

**Two steps, two commits.** ``long-run --predict`` reads the sweep (``book/data/scaling_sweep.json``),
fits the law, bootstraps it over the runs, chooses the shape for ``--budget`` (a budget at least
10× the sweep's largest: ``MIN_FACTOR``), and writes the plan with the predicted nats per character
and its 95 % interval to ``--out``; that file is committed before the run. ``long-run`` then reads
the plan, trains it, and adds what it measured to the same file (every key of the prediction is
kept as it was, which the command checks).

**Repeated data.** The training split of the 38 plays is U = 1.25 M tokens; a budget ten times the
sweep's buys tens of epochs of it, where a repeated token teaches less than a fresh one. Muennighoff
et al. (2023, "Scaling data-constrained language models", eq. 5) measured how much less: D repeated
tokens are worth D' fresh ones, the value of a repetition decaying with constant R* = 15.4. The law
is fitted on D' (the sweep's runs see 0.3 to 7 epochs), and the choice of s* weighs D' too, so
the fit does not count the thirtieth epoch as new text. The law without the correction is fitted
and reported beside it. The recipe is the sweep's, unchanged (weight decay 0.1, no dropout), so
that the law describes the run it predicts.

**The run.** A progress bar; every ``--eval-every`` steps the nats per character of the yardstick
(the eight plays' validation text, ``scaling_corpus``) and of a fixed sample of the training split
(a gap between them is the repetition showing); a checkpoint every ``--checkpoint-every`` steps
from which ``--resume`` continues bit for bit (``tformer.training.train``: batches are a function of the
step); samples at ``TEMPERATURES`` at the end, with the share of their words that are words of
the plays (``tformer.data.words``). The trained model is shipped with int8 weights
(``tformer.decoding.quantize``, ``w8``) beside its tokenizer, when the file is at most
``SHIP_BYTES``: a reader samples from it without training (``load_shipped``).
"""
import json
import os
import time

import numpy as np

from tformer.core import parallel
from tformer.core.atomic import write_json
from tformer.data.bpe import BPETokenizer
from tformer.training.checkpoint import load_checkpoint
from tformer.data.all_plays import all_plays_documents
from tformer.data.words import corpus_words, share
from tformer.decoding.generate import sample
from tformer.runs.declare import beside, reads, updates, writes
from tformer.runs.files import MALFORMED, read_checkpoint_file
from tformer.runs.flag_groups import (Flag, add_checkpoint_flags, add_output_flags,
                                      add_training_flags)
from tformer.runs.flags import UsageError, positive_float, positive_int
from tformer.training.train import train
from tformer.experiments import scaling_fit as sf
from tformer.core.provenance import load_average, now, record
from tformer.experiments.scaling_corpus import prepare
from tformer.experiments.scaling_sweep import (RECIPE, SHAPES, build, flops_per_token, forward_loss, heads,
                            model_config, schedule, shape_name, token_data, weights)

DEFAULT_SWEEP = "book/data/scaling_sweep.json"
DEFAULT_OUT = "book/data/long_run.json"
DEFAULT_CHECKPOINT = "checkpoints/long_run.npz"
SHIPPED_MODEL = "book/data/long_run_w8.npz"
SHIPPED_TOKENIZER = "book/data/long_run_tokenizer.json"
SHIP_BYTES = 8_000_000
R_STAR = 15.39                 # Muennighoff et al. (2023), the fitted R*_D of their eq. 5
MIN_FACTOR = 10.0              # the long run's budget: at least this many times the sweep's largest
DEFAULT_BUDGET = 2.5e14
MAX_BUDGET = 1e19              # FLOPs: years of one CPU; a larger plan is no run
N_BOOT = 200
TEMPERATURES = (0.5, 0.8, 1.0)
SAMPLE_SEEDS, SAMPLE_TOKENS = 8, 160
TRAIN_EVAL_WINDOWS = 512
PREDICTION_KEYS = ("budget", "plan", "predicted_nats_per_char", "predicted_interval", "fit",
                   "without_repetition", "chinchilla", "candidates", "sweep", "prediction_provenance")


def effective_tokens(D, U, r_star=R_STAR):
    """D' = U + U·R*·(1 − exp(−R/R*)), R = max(D/U − 1, 0): ``D`` tokens drawn from ``U`` unique
    ones are worth ``D'`` fresh ones (``D' = D`` up to one epoch; D' → U·(1 + R*) as D → ∞)."""
    D = np.asarray(D, dtype=np.float64)
    R = np.maximum(D / U - 1.0, 0.0)
    return np.where(D <= U, D, U + U * r_star * (1.0 - np.exp(-R / r_star)))


def _fit_report(thetas, theta):
    """The constants of ``theta`` with the 95 % intervals of the bootstrap ``thetas``."""
    c = sf.constants(theta)
    boot = [sf.constants(t) for t in thetas]
    out = {}
    for k in c:
        lo, hi = sf.interval(np.array([b[k] for b in boot]))
        out[k] = dict(value=c[k], interval=[float(lo), float(hi)])
    return out


def candidates(theta, budget, vocab_size, U, shapes=SHAPES, recipe=RECIPE, repeat=True):
    """Every shape of the ladder at ``budget``: its N_mm, tokens, epochs and L̂, best first."""
    T, B = recipe["block_size"], recipe["batch_size"]
    rows = []
    for s in shapes:
        f = flops_per_token(s, vocab_size, T)
        steps = max(1, round(budget / (f * B * T)))
        D = steps * B * T
        Dx = effective_tokens(D, U) if repeat else D
        rows.append(dict(shape=list(s), n_weights=weights(s, vocab_size), steps=steps, tokens=D,
                         epochs=D / U, effective_tokens=float(Dx), flops=steps * B * T * f,
                         predicted=float(sf.predict(theta, weights(s, vocab_size), Dx))))
    return sorted(rows, key=lambda r: r["predicted"])


def predict_plan(sweep, budget, n_boot=N_BOOT, seed=0):
    """The prediction: the fits (with and without the repetition correction), the chosen plan and
    its predicted loss with the bootstrap's 95 % interval. ``sweep`` is the sweep's JSON."""
    runs = sweep["runs"]
    if len(runs) < 5:
        raise UsageError(f"--sweep: expected at least 5 finished runs to fit five constants, got {len(runs)}")
    V = {r["vocab_size"] for r in runs}
    if len(V) != 1:
        raise UsageError(f"--sweep: expected runs of one vocabulary, got {sorted(V)}")
    V = V.pop()
    U = sweep["corpora"][str(V)]["train_tokens"]
    largest = max(r["budget"] for r in runs)
    if budget < MIN_FACTOR * largest * (1 - 1e-9):
        raise UsageError(f"--budget: expected at least {MIN_FACTOR:g}× the sweep's largest budget "
                         f"({MIN_FACTOR * largest:.3g} FLOPs), got {budget:.3g}")
    N, D, L = sf.arrays(runs)
    out = {}
    for name, Dx in (("with", effective_tokens(D, U)), ("without", D)):
        theta, value = sf.fit(N, Dx, L)
        thetas = sf.bootstrap(N, Dx, L, n_boot=n_boot, seed=seed)
        rows = candidates(theta, budget, V, U, repeat=name == "with")
        best = rows[0]
        Nb, Db = best["n_weights"], best["effective_tokens"]
        boot = sf.predict_samples(thetas, Nb, Db)
        lo, hi = sf.interval(boot)
        n_opt, d_opt = sf.compute_optimal(theta, budget)
        c = sf.constants(theta)
        logres = np.log(sf.predict(theta, N, Dx)) - np.log(L)
        out[name] = dict(theta=theta.tolist(), objective=value, constants=_fit_report(thetas, theta),
                         bootstrap=thetas.tolist(), bootstrap_seed=seed,
                         residual_rms=float(np.sqrt(np.mean(logres ** 2))),
                         best=best, predicted=float(best["predicted"]), interval=[float(lo), float(hi)],
                         compute_optimal=dict(N=float(n_opt), D=float(d_opt),
                                              tokens_per_weight=float(d_opt / n_opt),
                                              a=c["beta"] / (c["alpha"] + c["beta"]),
                                              b=c["alpha"] / (c["alpha"] + c["beta"])),
                         candidates=rows)
    best = out["with"]["best"]
    plan = dict(shape=best["shape"], vocab_size=V, block_size=RECIPE["block_size"],
                batch_size=RECIPE["batch_size"], budget=float(budget), seed=0, lr=RECIPE["lr"],
                steps=best["steps"], tokens=best["tokens"], epochs=best["epochs"],
                flops=best["flops"], n_weights=best["n_weights"], recipe=RECIPE,
                heads=heads(best["shape"][1]))
    nc = sf.CHINCHILLA
    return dict(
        budget=float(budget), plan=plan,
        predicted_nats_per_char=out["with"]["predicted"],
        predicted_interval=out["with"]["interval"],
        fit={k: v for k, v in out["with"].items() if k not in ("candidates", "best")},
        without_repetition={k: v for k, v in out["without"].items() if k != "candidates"},
        chinchilla=dict(nc, a=nc["beta"] / (nc["alpha"] + nc["beta"]),
                        b=nc["alpha"] / (nc["alpha"] + nc["beta"]), tokens_per_weight=20.0),
        candidates=out["with"]["candidates"],
        sweep=dict(runs=len(runs), budgets=sorted({r["budget"] for r in runs}),
                   unique_tokens=U, r_star=R_STAR,
                   seconds=float(sum(r["seconds"] for r in runs)),
                   cpu_seconds=float(sum(r["cpu_seconds"] for r in runs))))


def add_arguments(p):
    """The command's flags."""
    p.add_argument("--predict", action="store_true",
                   help="fit the sweep, choose the model for --budget and write the prediction "
                        "to --out (commit it before the run)")
    p.add_argument("--sweep", default=None,
                   help=f"with --predict: the sweep's JSON (None: {DEFAULT_SWEEP})")
    p.add_argument("--budget", type=positive_float, default=None,
                   help=f"with --predict: FLOPs, at least {MIN_FACTOR:g}× the sweep's largest budget "
                        f"and at most {MAX_BUDGET:g} (None: {DEFAULT_BUDGET:g})")
    add_output_flags(p, out=Flag(DEFAULT_OUT, "the prediction, and then the result"))
    add_checkpoint_flags(p, checkpoint=Flag(DEFAULT_CHECKPOINT, "where the run saves itself"),
                         checkpoint_every=Flag(500, type=positive_int))
    add_training_flags(p, eval_every=Flag(1000, "measure nats/char of the yardstick and the "
                                                "training split this often", type=positive_int))
    add_checkpoint_flags(p, resume=Flag(False, "continue from --checkpoint"))
    p.add_argument("--ship", default=SHIPPED_MODEL,
                   help=f"where to write the int8 (w8) model for readers ('' : do not); its "
                        f"tokenizer is written beside it, as {os.path.basename(SHIPPED_TOKENIZER)}")
    add_output_flags(p, no_progress=False)


def ship_tokenizer(ship_path):
    """Where ``ship`` writes the tokenizer of the model shipped to ``ship_path``: beside it."""
    return beside(ship_path, os.path.basename(SHIPPED_TOKENIZER))


def files(args):
    """What the command reads and writes (``tformer.runs.declare``). ``--predict``: the sweep,
    and ``--out`` (new). The run: ``--out`` (its plan, completed), ``--checkpoint`` (read first
    with ``--resume``), ``--ship`` and the tokenizer written beside it."""
    if args.predict:
        return [reads("--sweep", args.sweep or DEFAULT_SWEEP), writes("--out", args.out)]
    return [updates("--out", args.out, required=True,
                    what="a long-run prediction (long-run --predict writes it)"),
            updates("--checkpoint", args.checkpoint, required=True,
                    what="a checkpoint to continue (--resume)") if args.resume
            else writes("--checkpoint", args.checkpoint),
            writes("--ship", args.ship or None),
            writes("--ship's tokenizer", ship_tokenizer(args.ship) if args.ship else None)]


def unused_flags(args):
    """``--predict`` makes a plan: the flags of the run do nothing with it (``--no-progress``,
    which only silences, is taken anywhere, as ``--threads`` is)."""
    from tformer.runs.flags import idle
    return idle(["--checkpoint", "--checkpoint-every", "--eval-every", "--ship"],
                "with --predict (it writes the plan; the run, without --predict, trains)",
                args.predict)


def check_flags(args):
    """Flags of the other mode are usage errors (``--budget``, ``--sweep`` without ``--predict``;
    ``--resume`` with it); a budget gives finite work (at most ``MAX_BUDGET``)."""
    if args.predict:
        if args.resume:
            raise ValueError("--resume: continues a run; --predict makes a plan, expected one "
                             "of the two, got both")
        if args.budget is not None and args.budget > MAX_BUDGET:
            raise ValueError(f"--budget: expected at most {MAX_BUDGET:g} FLOPs (years of a CPU), "
                             f"got {args.budget:g}")
        args.budget = DEFAULT_BUDGET if args.budget is None else args.budget
        args.sweep = args.sweep or DEFAULT_SWEEP
        return
    for flag, value in (("--budget", args.budget), ("--sweep", args.sweep)):
        if value is not None:
            raise ValueError(f"{flag}: applies to the prediction; expected --predict with it "
                             f"(a run reads its plan from --out)")


def _number(x, ok=lambda v: True):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) and ok(x)


def _count(x, low, high):
    return isinstance(x, int) and not isinstance(x, bool) and low <= x <= high


def check_plan(pred, path):
    """UsageError naming ``--out`` unless ``pred`` holds a plan the run can train (sizes in range,
    heads that divide the width, a vocabulary BPE can make) and a prediction of numbers."""
    def bad(what):
        return UsageError(f"--out: expected a long-run prediction in {path!r} (long-run --predict), "
                          f"got {what}")
    missing = [k for k in ("plan", "predicted_nats_per_char", "predicted_interval") if k not in pred]
    if missing:
        raise bad(f"one missing {missing}")
    plan = pred["plan"]
    if not isinstance(plan, dict):
        raise bad(f"a plan of type {type(plan).__name__}")
    shape = plan.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2 and _count(shape[0], 1, 64)
            and _count(shape[1], 1, 4096)):
        raise bad(f"the shape {shape!r} (expected [layers 1..64, width 1..4096])")
    if shape[1] % heads(shape[1]):
        raise bad(f"the width {shape[1]}, which its {heads(shape[1])} heads do not divide")
    limits = dict(vocab_size=(256, 65536), block_size=(1, 4096), batch_size=(1, 4096),
                  seed=(0, 2 ** 32 - 1), steps=(1, 10 ** 8))
    for key, (low, high) in limits.items():
        if not _count(plan.get(key), low, high):
            raise bad(f"plan {key} {plan.get(key)!r} (expected an integer from {low} to {high:,})")
    if not _number(plan.get("lr"), lambda v: 0 < v <= 1):
        raise bad(f"plan lr {plan.get('lr')!r} (expected a number in (0, 1])")
    if not _number(plan.get("flops"), lambda v: v > 0):
        raise bad(f"plan flops {plan.get('flops')!r} (expected a number > 0)")
    interval = pred["predicted_interval"]
    if not _number(pred["predicted_nats_per_char"]) or not (
            isinstance(interval, list) and len(interval) == 2 and all(map(_number, interval))
            and interval[0] <= interval[1]):
        raise bad(f"the prediction {pred['predicted_nats_per_char']!r} with interval "
                  f"{interval!r} (expected a number and [low, high])")


def _read_json(path, flag, what):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"{flag}: expected {what} at {path!r}, but there is no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise UsageError(f"{flag}: expected {what} in {path!r}, got a file that does not read as "
                         f"JSON ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{flag}: expected {what} (a JSON object) in {path!r}, got {type(data).__name__}")
    return data


def predict_main(args):
    if os.path.exists(args.out):
        raise UsageError(f"--out: {args.out} already holds a prediction; a prediction is made once, "
                         f"before its run (move the file to predict anew)")
    args.sweep, args.budget = args.sweep or DEFAULT_SWEEP, args.budget or DEFAULT_BUDGET
    sweep = _read_json(args.sweep, "--sweep", "a scaling-sweep result")
    if not isinstance(sweep.get("runs"), list) or not isinstance(sweep.get("corpora"), dict):
        raise UsageError(f"--sweep: expected a scaling-sweep result in {args.sweep!r}, got JSON of another kind")
    t0 = time.perf_counter()
    try:
        pred = predict_plan(sweep, args.budget)
    except UsageError:
        raise
    except MALFORMED as e:                               # the file's content: data from outside
        raise UsageError(f"--sweep: expected a scaling-sweep result in {args.sweep!r}, got one "
                         f"that cannot be fitted ({type(e).__name__}: {e})") from None
    pred["prediction_provenance"] = dict(record("long-run"), seconds=time.perf_counter() - t0)
    write_json(args.out, pred)
    p, f = pred["plan"], pred["fit"]["constants"]
    print(f"fit on {pred['sweep']['runs']} runs: E = {f['E']['value']:.3f}, α = {f['alpha']['value']:.3f}, "
          f"β = {f['beta']['value']:.3f}")
    print(f"budget {args.budget:.3g} FLOPs: {shape_name(p['shape'])} ({p['n_weights']:,} weights), "
          f"{p['steps']:,} steps, {p['tokens']:,} tokens ({p['epochs']:.1f} epochs)")
    lo, hi = pred["predicted_interval"]
    print(f"predicted: {pred['predicted_nats_per_char']:.4f} nats/char (95 % interval {lo:.4f} – {hi:.4f})"
          f"; written to {args.out}: commit it before the run")
    return 0


def train_windows(corpus, T, n=TRAIN_EVAL_WINDOWS):
    """``n`` windows of T tokens evenly spaced over the training split, ``(x, y)`` ``(n, T)``."""
    tr = corpus.tokens.train
    starts = np.linspace(0, tr.size - T - 2, n).astype(np.int64)
    idx = starts[:, None] + np.arange(T + 1)
    w = tr[idx].astype(np.int64)
    return w[:, :-1], w[:, 1:]


def write_samples(model, tokenizer, temperatures=TEMPERATURES, seeds=SAMPLE_SEEDS, tokens=SAMPLE_TOKENS):
    """``{temperature: [text, …]}``: ``seeds`` samples of ``tokens`` tokens after a newline."""
    prompt = np.tile(tokenizer.encode(b"\n").astype(np.int64)[None, :], (seeds, 1))
    out = {}
    for t in temperatures:
        rows = sample(model, prompt, tokens, temperature=t, seed=0)
        out[f"{t:g}"] = [tokenizer.decode(r[prompt.shape[1]:].tolist()) for r in rows]
    return out


def word_shares(samples, vocab):
    """``{temperature: {known, total, share}}`` of the samples' words among ``vocab``."""
    out = {}
    for t, texts in samples.items():
        k = n = 0
        for text in texts:
            a, b = share(text, vocab)
            k, n = k + a, n + b
        out[t] = dict(known=k, total=n, share=k / max(n, 1))
    return out


def plays_vocabulary():
    """The words of all 38 plays (whole text, both splits)."""
    return corpus_words(raw for _, raw in all_plays_documents())


def run_main(args):
    if args.resume and not os.path.exists(args.checkpoint):
        raise UsageError(f"--resume: expected a checkpoint to continue at {args.checkpoint!r}, "
                         f"but there is no such file")
    pred = _read_json(args.out, "--out", "a long-run prediction (long-run --predict)")
    check_plan(pred, args.out)
    if "val_nats_per_char" in pred:
        raise UsageError(f"--out: {args.out} already holds the run's result "
                         f"({pred['val_nats_per_char']:.4f} nats/char)")
    if not args.resume and os.path.exists(args.checkpoint):
        raise UsageError(f"--checkpoint: {args.checkpoint} exists; pass --resume to continue it, "
                         f"or another path")
    if args.resume:                                  # its kind, before the corpus is prepared
        read_checkpoint_file("--checkpoint", args.checkpoint, "a checkpoint of this plan's run to "
                             "--resume (saved by long-run)")
    plan = pred["plan"]
    run = dict(shape=plan["shape"], vocab_size=plan["vocab_size"], block_size=plan["block_size"],
               batch_size=plan["batch_size"], seed=plan["seed"], lr=plan["lr"], steps=plan["steps"])
    corpus = prepare(plan["vocab_size"])
    if corpus.tokenizer.vocab_size != plan["vocab_size"]:
        raise UsageError(f"--out: expected a plan whose vocab_size BPE can make of the plays, got "
                         f"{plan['vocab_size']} ({corpus.tokenizer.vocab_size} at most)")
    model, opt = build(run)
    start, extra = 0, dict(evals=[], seconds=0.0)
    if args.resume:
        try:
            meta = load_checkpoint(args.checkpoint, model, opt, config=model.config)
        except MALFORMED as e:
            raise UsageError(f"--checkpoint: expected a checkpoint of this plan's run to --resume, "
                             f"got {args.checkpoint!r}: {str(e).removeprefix('path: ')}") from None
        start = int(meta["step"])
        extra = dict(evals=list(meta["extra"].get("evals", [])),
                     seconds=float(meta["extra"].get("seconds", 0.0)))
        print(f"resumed from {args.checkpoint} at step {start:,} of {plan['steps']:,}", flush=True)
    data = token_data(run, corpus)
    val_x, val_y = corpus.windows(plan["block_size"])
    tr_x, tr_y = train_windows(corpus, plan["block_size"])
    base, t0, now_step = extra["seconds"], time.perf_counter(), [start]

    def batch(i):                       # i = step − 1; the clock is saved with every checkpoint
        now_step[0] = i + 1
        extra["seconds"] = base + time.perf_counter() - t0
        return data.batch(i)

    def evaluate(m):
        v = corpus.windows_nats_per_char(m, val_x, val_y)
        t = corpus.windows_nats_per_char(m, tr_x, tr_y)
        extra["evals"].append([now_step[0], round(v, 5), round(t, 5)])
        return dict(val=v, train=t)

    hist = train(model, opt, batch, forward_loss, plan["steps"], start_step=start,
                 clip_norm=RECIPE["clip"], lr_schedule=schedule(run), evaluate=evaluate,
                 eval_every=args.eval_every, checkpoint_path=args.checkpoint,
                 checkpoint_every=args.checkpoint_every, config=model.config,
                 progress_bar=False if args.no_progress else None, desc="long-run",
                 log_every=50, checkpoint_extra=extra)
    seconds = base + time.perf_counter() - t0
    return finish(args, pred, model, corpus, extra["evals"], seconds, hist)


def finish(args, pred, model, corpus, evals, seconds, hist=None):
    """Measure the trained model, write its samples and ship it; add the result to ``--out``."""
    model.eval()
    val_x, val_y = corpus.windows(pred["plan"]["block_size"])
    val = corpus.windows_nats_per_char(model, val_x, val_y)
    samples = write_samples(model, corpus.tokenizer)
    shares = word_shares(samples, plays_vocabulary())
    result = dict(val_nats_per_char=val, error=val - pred["predicted_nats_per_char"],
                  inside_interval=bool(pred["predicted_interval"][0] <= val <= pred["predicted_interval"][1]),
                  samples=[texts[0] for texts in samples.values()], samples_by_temperature=samples,
                  temperatures=list(TEMPERATURES), word_share=shares, seconds=seconds,
                  flops=pred["plan"]["flops"], params=model.num_parameters(),
                  evals=[dict(step=s, val=v, train=t) for s, v, t in evals],
                  threads=parallel.get_num_threads(), run_provenance=dict(record("long-run"),
                                                                          load_average=load_average(),
                                                                          finished=now()))
    if hist is not None and hist.get("loss"):
        every = max(1, len(hist["loss"]) // 200)
        result["train_curve"] = [[int(s), round(float(v), 4)] for s, v in
                                 zip(hist["step"][::every], hist["loss"][::every])]
    if args.ship:
        result["shipped"] = ship(model, corpus, args.ship, val_x, val_y)
    out = dict(pred, **result)
    assert all(out[k] == pred[k] for k in pred), "the prediction's keys must stay as they were"
    write_json(args.out, out)
    lo, hi = pred["predicted_interval"]
    print(f"measured {val:.4f} nats/char; predicted {pred['predicted_nats_per_char']:.4f} "
          f"({lo:.4f} – {hi:.4f}); {seconds / 60:.1f} min")
    for t, s in shares.items():
        print(f"T = {t}: {s['known']}/{s['total']} words of the plays ({100 * s['share']:.1f} %)")
    return 0


def ship(model, corpus, path, val_x, val_y):
    """Write the model with int8 weights (w8) and its tokenizer; their sizes and the w8 model's
    nats/char. A file larger than ``SHIP_BYTES`` is not kept."""
    import copy
    from tformer.decoding.quantize import quantize_model, save_quantized
    import shutil
    import tempfile
    from tformer.core.atomic import atomic_open
    q = quantize_model(copy.deepcopy(model), "w8")
    with tempfile.TemporaryDirectory() as scratch:          # measured before ``path`` is touched
        made = save_quantized(os.path.join(scratch, "w8.npz"), q)
        size = os.path.getsize(made)
        if size > SHIP_BYTES:                               # an existing --ship file is kept
            return dict(path=None, bytes=size, reason=f"larger than {SHIP_BYTES:,} bytes")
        with open(made, "rb") as src, atomic_open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    tok_path = ship_tokenizer(path)
    corpus.tokenizer.save(tok_path)
    return dict(path=path, tokenizer=tok_path, bytes=size, scheme="w8",
                val_nats_per_char=corpus.windows_nats_per_char(q, val_x, val_y))


def load_shipped(path=SHIPPED_MODEL, tokenizer=SHIPPED_TOKENIZER, plan_path=DEFAULT_OUT):
    """``(model, tokenizer)``: the long run's int8 model, for sampling in the lab without training."""
    from tformer.models.tinygpt import TinyGPT
    from tformer.decoding.quantize import load_model
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)["plan"]
    model = TinyGPT(**model_config(plan["shape"], plan["vocab_size"], plan["block_size"]), seed=0)
    load_model(path, model)
    return model.eval(), BPETokenizer.load(tokenizer)


def load_shipped_model(command):
    """``load_shipped()`` for a command (``preference``, ``decoding``): a shipped model, plan or
    tokenizer that does not read as the long run's is a ``UsageError`` naming them, not a
    traceback."""
    try:
        return load_shipped()
    except MALFORMED as e:
        raise UsageError(f"the long run's model: expected {SHIPPED_MODEL!r} to be the int8 model of "
                         f"the plan in {DEFAULT_OUT!r}, with its tokenizer {SHIPPED_TOKENIZER!r} "
                         f"(long-run ships them), got {type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]}; {command} reads them") from None


def main(args):
    return predict_main(args) if args.predict else run_main(args)
