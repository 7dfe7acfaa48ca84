"""``python -m tformer rl``: GRPO learns from the judge directly, against DPO and best-of-n at matched KL.

**The model and the prompts** are the Preference chapter's (``tformer.experiments.preference``): the
long run's TinyGPT with its int8 weights back in float32 is the reference π_ref and the start of
every policy; the policies learn on the same ``PAIR_PROMPTS`` prompts of the 38 plays' training text
(``default_rng(0)``) that DPO's pairs came from, the first tenth held out (as DPO's held-out pairs:
the pilot measures on them); every model is measured on the same ``EVAL_PROMPTS`` prompts of the
eight plays' validation text (``default_rng(1)``), ``EVAL_SAMPLES`` lines each with the same draws
(seed 3), as the Preference chapter measures, so the numbers compare.

**The methods.**
GRPO (``tformer.tuning.grpo_train``): ``GROUP`` lines per prompt at temperature 1, ``PROMPTS_PER_STEP``
prompts a step, the reward 1 if the line scans under the *lenient* judge ``meter.scans`` (the judge
of DPO's pairs), else 0, the group advantage, the clipped objective with β k3 (β = ``BETA``), LoRA
r = 8 on every linear layer (as ``dpo-lora``), ``--steps`` steps of the one training loop. Its
peak rate is picked by a pilot (part ``pilot``): each rate of ``LR_GRID`` for ``PILOT_STEPS`` steps
on a pilot seed, measured on the held-out prompts; the smallest whose KL per line reaches half the
KL of the Preference chapter's chosen ``dpo-lora`` (``book/data/preference.json``) is taken (a run
is three times as long as the pilot), so that GRPO's frontier runs from KL 0 past DPO's (the
largest if none does). The points are taken densely early (``EVAL_FRACTIONS``): at such a rate
most of the KL is spent in the first steps.
DPO: the Preference chapter's chosen configurations ``dpo-lora`` and ``dpo-full`` (their rate from
``preference.json``), run again here through ``preference.make_data`` and ``tune`` with the
chapter's β, pairs and batches, to judge their lines by both judges and take their KL.
Best-of-n (n = 1, 2, 4, 8): the base writes ``BON_SAMPLES`` lines per evaluation prompt (seed 2); a
judge picks a line that scans under it. Its rate is the unbiased estimate of
P(one of n scans) = 1 − C(m − k, n)/C(m, n) from k of m lines (Chen et al. 2021's pass@n). Its KL per
line is exact for a yes/no judge: the line it returns is a draw of π given the verdict, so
KL(π_bon ‖ π) = KL(Bernoulli(q) ‖ Bernoulli(p)) with p the prompt's chance of a line that scans
and q = 1 − (1 − p)^n (``fast.losses.bernoulli_kl``). It is estimated by plugging in p̂ = k/m,
which is biased: f(p) = KL is not linear in p, so E f(p̂) ≠ f(p). f is 0 at p = 0 and 1 and
concave for n = 2, so there the estimate is low; for n = 4 and 8 it is concave below p ≈ 0.85 and
0.51 and convex above, and the sign depends on p. The bias at p = p̂, Σ_j Bin(j; m, p̂) f(j/m) −
f(p̂) (the binomial's expectation, exact: a parametric bootstrap's), is reported beside the
estimate (``kl_bias``), the prompts' mean.

**Each run is measured at several steps** (``EVAL_FRACTIONS`` of ``--steps``; step 0 is the base):
the share of lines that scan under both judges (the lenient ``meter.scans`` and the strict
``strict_meter.scans_strict``), the KL(π ‖ π_ref) per line exact over the vocabulary
(``preference.kl_per_line``), the validation loss on the yardstick (nats/char), the mean length. The
points along a run trace its frontier: the rate against KL per line.

**Intervals.** A point's rate and KL are pooled over seeds; their 95 % intervals come from a
bootstrap that resamples the prompts (each prompt's lines, under every seed, one cluster: lines of
one prompt are not independent) and the seeds, ``BOOTSTRAP`` replicates; the seeds' own Student-t
interval is kept too (``seeds_t``). **Matched KL**: GRPO's rate read off its frontier (linear in
KL between measured points, never past the last) at the KL of each DPO run and of best-of-n, and the
difference, its interval from the same bootstrap (the prompts drawn once for both methods, the
seeds of each drawn apart). A difference whose interval is missing means GRPO's frontier did not
reach that KL in some replicates (``reached`` says in what share); beside it, GRPO's best point
within that KL (``grpo_best_within_minus_other``: a KL budget, always defined).

The measurements (both judges, KL, best-of-n) are ``tformer.experiments.rl_judged``'s, the
frontiers and their bootstrap ``tformer.experiments.rl_frontier``'s.

Resumable: ``--out`` is rewritten after every part and run; ``--resume`` keeps the finished ones of
an ``--out`` made with the same configuration and runs the rest. ``--quick``: every part at small
sizes (a smoke run, not the chapter's numbers).
"""
import json
import math
import os
import time

import numpy as np

from tformer.core.atomic import write_json
from tformer.core.provenance import load_average, record
from tformer.data.meter import scans
from tformer.experiments import preference as PF
from tformer.experiments.rl_frontier import analyse
from tformer.experiments.rl_judged import best_of, evaluate
from tformer.nn.lora import Adapters
from tformer.runs.declare import reads, updates, writes
from tformer.runs.flags import UsageError
from tformer.tuning import pairs as PR
from tformer.tuning.grpo_train import grpo_tune, line_reward
from tformer.tuning.tune import tune

DEFAULT_OUT = "book/data/rl.json"
PREFERENCE = PF.DEFAULT_OUT
PARTS = ["best-of", "pilot", "grpo", "dpo"]
DPO_METHODS = ("dpo-lora", "dpo-full")
LORA = PF.LORA                              # r = 8 on every linear layer, as dpo-lora
GROUP = 8
PROMPTS_PER_STEP = 8
BETA = 0.01            # β of the k3 term: DeepSeekMath's 0.04 held GRPO's KL below DPO's (a pilot)
EPSILON = 0.2
LOSS_TYPE = "grpo"
LR_GRID = (3e-4, 1e-3, 3e-3)
PILOT_STEPS = 50
PILOT_SEED = 100
EVAL_FRACTIONS = (1 / 30, 1 / 15, 1 / 10, 2 / 15, 1 / 5, 4 / 15, 1 / 2, 1)   # 5 10 15 20 30 40 75 150
BON_SAMPLES = 16
BOOTSTRAP = 2000
SIZES = {"full": {"eval_prompts": PF.EVAL_PROMPTS, "eval_samples": PF.EVAL_SAMPLES,
                  "bon_samples": BON_SAMPLES, "pilot_steps": PILOT_STEPS, "lr_grid": LR_GRID,
                  "eval_fractions": EVAL_FRACTIONS, "bootstrap": BOOTSTRAP},
         "quick": {"eval_prompts": 12, "eval_samples": 2, "bon_samples": 4, "pilot_steps": 4,
                   "lr_grid": LR_GRID[1:2], "eval_fractions": (1 / 2, 1), "bootstrap": 200}}


def add_arguments(p):
    from tformer.runs.flag_groups import (Flag, add_checkpoint_flags, add_experiment_flags,
                                          add_output_flags, add_training_flags)
    from tformer.runs.flags import tuning_steps
    add_output_flags(p, out=DEFAULT_OUT,
                     parts=Flag(PARTS, "the parts to run (grpo needs the pilot's rate, from this "
                                       "run or --out)"))
    add_training_flags(p, steps=Flag(PF.DEFAULT_STEPS, "training steps of every GRPO and DPO run",
                                     type=tuning_steps),
                       seeds=Flag([1, 2, 3], "training seeds of each method (order of the "
                                             "prompts or pairs, adapters' start, GRPO's draws)"))
    add_checkpoint_flags(p, resume=Flag(False, "keep the finished parts and runs of an existing "
                                               "--out made with the same configuration"))
    add_experiment_flags(p, quick=False)
    add_output_flags(p, no_progress=False)


def files(args):
    """What the command reads and writes (``tformer.runs.declare``): the long run's shipped model,
    its tokenizer and its plan, the Preference chapter's result (DPO's chosen rates), and
    ``--out`` (read first with ``--resume``)."""
    from tformer.experiments.long_run import DEFAULT_OUT as PLAN, SHIPPED_MODEL, SHIPPED_TOKENIZER
    return [reads("the long run's model", SHIPPED_MODEL), reads("its tokenizer", SHIPPED_TOKENIZER),
            reads("its plan", PLAN),
            reads("the Preference chapter's result", PREFERENCE,
                  "the result of `python -m tformer preference`"),
            (updates if args.resume else writes)("--out", args.out)]


def check_args(args):
    """``--steps`` and ``--seeds`` as the experiment needs them, ``preference.json`` holding DPO's
    chosen rates, and ``--resume``'s ``--out`` a JSON object."""
    from tformer.runs.flags import json_object_file
    least = 2 if args.quick else 10
    if args.steps < least:
        raise ValueError(f"--steps: expected at least {least} (a tenth is the warm-up, and a run is "
                         f"measured along the way), got {args.steps}")
    if len(args.seeds) < 2 or len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds: expected at least two different seeds, got {args.seeds}")
    if set(args.seeds) & {PILOT_SEED}:
        raise ValueError(f"--seeds: expected seeds other than the pilot's {PILOT_SEED}, got "
                         f"{args.seeds}")
    dpo_rates(PREFERENCE)
    if args.resume:
        json_object_file("--out", args.out, "a result of `rl` to --resume")
    if "grpo" in args.parts and "pilot" not in args.parts and not _pilot_lr(args):
        raise ValueError("--parts: grpo takes the pilot's learning rate; expected pilot among "
                         "--parts too, or --resume with an --out that holds the pilot")


def _pilot_lr(args):
    """The pilot's learning rate in ``--resume``'s ``--out``, or None."""
    if not (args.resume and os.path.exists(args.out)):
        return None
    with open(args.out, encoding="utf-8") as f:
        pilot = json.load(f).get("pilot")
    return pilot.get("lr") if isinstance(pilot, dict) else None


def dpo_rates(path):
    """``({method: chosen lr}, dpo-lora's KL per line)`` from the Preference chapter's result; a
    ValueError naming the file if it does not hold them."""
    try:
        with open(path, encoding="utf-8") as f:
            methods = json.load(f)["methods"]
        lrs = {m: float(methods[m]["lr"]) for m in DPO_METHODS}
        kl = float(methods["dpo-lora"]["kl_per_line"][0])
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError,
            IndexError) as e:
        raise ValueError(f"the Preference chapter's result: expected {path!r} to hold the chosen "
                         f"lr and KL of {', '.join(DPO_METHODS)} (`python -m tformer preference` "
                         f"writes it), got {type(e).__name__}: {' '.join(str(e).split())[:100]}") \
            from None
    if not all(math.isfinite(v) and v > 0 for v in (*lrs.values(), kl)):
        raise ValueError(f"the Preference chapter's result: expected positive rates and KL in "
                         f"{path!r}, got {lrs}, KL {kl}")
    return lrs, kl


# --- the model --------------------------------------------------------------------------------------

def load_base():
    """``(π_ref, tokenizer)``: the long run's model, its int8 weights back in float32."""
    from tformer.decoding.quantize import dequantized
    from tformer.experiments.long_run import load_shipped_model
    qmodel, tokenizer = load_shipped_model("rl")
    return dequantized(qmodel), tokenizer


# --- the runs ---------------------------------------------------------------------------------------

def eval_steps(steps, fractions):
    return sorted({max(1, round(f * steps)) for f in fractions} | {steps})


def grpo_run(ref, tokenizer, prompts, steps, seed, lr, measure, at, progress):
    """One GRPO run: ``(points, hist)``, ``measure(model, step)`` at the steps ``at``."""
    model, hist = grpo_tune(ref, prompts, line_reward(tokenizer, scans), PR.newline_tokens(tokenizer),
                            steps, seed, lr, BETA, group=GROUP, prompts_per_step=PROMPTS_PER_STEP,
                            lora=LORA, loss_type=LOSS_TYPE, epsilon=EPSILON, evaluate=measure,
                            eval_steps=at, progress_bar=progress, desc=f"grpo seed {seed}")
    return [e for _, e in hist["eval"]], {k: [round(v, 5) for v in hist[k]]
                                          for k in ("loss", "reward", "kl_k3", "length", "time")}


def dpo_run(ref, pairs, name, lr, steps, seed, measure, at, progress):
    """One run of the Preference chapter's ``name`` at its chosen ``lr`` (``preference.run``'s
    arguments), measured at the steps ``at``: ``(points, losses)``."""
    method = PF.METHODS[name]
    every = math.gcd(*at)
    calls = []

    def judge(params):
        calls.append(1)
        step = min(len(calls) * every, steps)
        model = params.model if isinstance(params, Adapters) else params
        return measure(model, step) if step in at else None
    _, hist = tune(ref, pairs, method["loss"], lr, steps, seed, PF.BETA,
                      PF.LORA if method["kind"] == "lora" else None, PF.BATCH_PAIRS,
                      evaluate=judge, eval_every=every, progress_bar=progress, desc=f"{name} seed {seed}")
    return [e for _, e in hist["eval"] if e is not None], [round(x, 5) for x in hist["loss"]]


def pick_lr(pilot, target_kl):
    """The smallest rate of the pilot whose KL per line reached half ``target_kl`` at one of its
    points (a run takes three times the pilot's steps: it goes past), else the largest."""
    lrs = sorted(pilot, key=float)
    return float(next((lr for lr in lrs if max(p["kl_per_line"] for p in pilot[lr]["points"])
                       >= target_kl / 2), lrs[-1]))


# --- the command ------------------------------------------------------------------------------------

def _config(args, sizes):
    return {"steps": args.steps, "seeds": args.seeds, "quick": args.quick, "group": GROUP,
            "prompts_per_step": PROMPTS_PER_STEP, "beta": BETA, "epsilon": EPSILON,
            "loss_type": LOSS_TYPE, "lora": LORA, "temperature": 1.0,
            "prompt_tokens": PR.PROMPT_TOKENS, "response_tokens": PR.RESPONSE_TOKENS,
            "train_prompts": PF.PAIR_PROMPTS, "held_out": PF.HELD_OUT,
            "lr_grid": list(sizes["lr_grid"]), "pilot_steps": sizes["pilot_steps"],
            "pilot_seed": PILOT_SEED, "eval_prompts": sizes["eval_prompts"],
            "eval_samples": sizes["eval_samples"], "bon_samples": sizes["bon_samples"],
            "eval_steps": eval_steps(args.steps, sizes["eval_fractions"]),
            "bootstrap": sizes["bootstrap"], "judge_trained_on": "meter.scans",
            "dpo": {"beta": PF.BETA, "batch_pairs": PF.BATCH_PAIRS, "lora": PF.LORA}}


def _start(args, config):
    """The result to complete: ``--out``'s with ``--resume`` and the same configuration, else new."""
    if args.resume and os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("config") == json.loads(json.dumps(config)):
            kept = sum(len(v) for v in old.get("runs", {}).values())
            print(f"--resume: keeping {kept} runs and the parts done in {args.out}", flush=True)
            old.setdefault("earlier_sessions", []).append(old.get("provenance"))
            return old
        print(f"--resume: {args.out} was made with another configuration; starting afresh",
              flush=True)
    return {"config": config, "runs": {}}


def main(args):
    t0 = time.perf_counter()
    sizes = SIZES["quick" if args.quick else "full"]
    lrs, dpo_kl = dpo_rates(PREFERENCE)
    ref, tokenizer = load_base()
    train_text, eval_text = PF.texts()
    windows = PF.yardstick_windows(tokenizer, eval_text, ref.max_len)
    config = _config(args, sizes)
    result = _start(args, config)
    if "grpo" in args.parts and "pilot" not in args.parts and "lr" not in result.get("pilot", {}):
        raise UsageError("--parts: grpo takes the pilot's learning rate; expected pilot among "
                         f"--parts too (the pilot of {args.out} was made with another "
                         f"configuration); nothing was written")
    result["provenance"] = record("rl")
    progress = False if args.no_progress else None

    def save():
        result["analysis"] = (analyse(result, sizes["bootstrap"], DPO_METHODS)
                              if "base" in result else {})
        write_json(args.out, result)
    eval_ids, _ = PR.prompts(eval_text, tokenizer, sizes["eval_prompts"], np.random.default_rng(1))
    prompt_ids, _ = PR.prompts(train_text, tokenizer, PF.PAIR_PROMPTS, np.random.default_rng(0))
    n_out = round(PF.HELD_OUT * PF.PAIR_PROMPTS)
    held_out, train_ids = prompt_ids[:n_out], prompt_ids[n_out:]       # DPO's split
    result["shown_prompts"] = [tokenizer.decode(list(p)) for p in eval_ids[:PF.SHOW]]
    samples = sizes["eval_samples"]

    def measure(model, step):
        return evaluate(model, ref, tokenizer, eval_ids, windows, samples, step)
    if "base" not in result:
        print("the base ...", flush=True)
        result["base"] = evaluate(ref, ref, tokenizer, eval_ids, windows, samples, 0, kl=False)
        save()
    if "best-of" in args.parts and "best_of" not in result:
        print(f"best-of-n from {sizes['bon_samples']} lines per prompt ...", flush=True)
        result["best_of"] = best_of(ref, tokenizer, eval_ids, sizes["bon_samples"])
        save()
    at = config["eval_steps"]
    pilot = result.setdefault("pilot", {"target_kl": dpo_kl, "runs": {}})
    if "pilot" in args.parts:
        pilot_at = eval_steps(sizes["pilot_steps"], (1 / 2, 1))
        for lr in sizes["lr_grid"]:
            if str(lr) in pilot["runs"]:
                continue
            print(f"pilot: GRPO at lr {lr:g} ...", flush=True)
            points, hist = grpo_run(
                ref, tokenizer, train_ids, sizes["pilot_steps"], PILOT_SEED, lr,
                lambda m, s: evaluate(m, ref, tokenizer, held_out, windows, samples, s),
                pilot_at, progress)
            pilot["runs"][str(lr)] = {"points": points, "hist": hist}
            print(f"  KL {points[-1]['kl_per_line']:.2f} rate {points[-1]['rate']:.3f} strict "
                  f"{points[-1]['rate_strict']:.3f}", flush=True)
            save()
        pilot["lr"] = pick_lr(pilot["runs"], dpo_kl)
        save()
    runs = result["runs"]
    if "grpo" in args.parts:
        for seed in args.seeds:
            if str(seed) in runs.get("grpo", {}):
                continue
            t1 = time.perf_counter()
            points, hist = grpo_run(ref, tokenizer, train_ids, args.steps, seed, pilot["lr"],
                                    measure, at, progress)
            runs.setdefault("grpo", {})[str(seed)] = {"seed": seed, "lr": pilot["lr"], "beta": BETA,
                                                      "points": points, "hist": hist,
                                                      "seconds": time.perf_counter() - t1}
            _say("grpo", seed, points)
            save()
    if "dpo" in args.parts:
        todo = [(m, s) for m in DPO_METHODS for s in args.seeds if str(s) not in runs.get(m, {})]
        if todo:
            print("the reference writes DPO's pairs ...", flush=True)
            pairs, result["dpo_pairs"], _ = PF.make_data(ref, tokenizer, train_text)
        for name, seed in todo:
            t1 = time.perf_counter()
            points, losses = dpo_run(ref, pairs["train"], name, lrs[name], args.steps, seed,
                                     measure, at, progress)
            runs.setdefault(name, {})[str(seed)] = {"seed": seed, "lr": lrs[name], "points": points,
                                                    "losses": losses,
                                                    "seconds": time.perf_counter() - t1}
            _say(name, seed, points)
            save()
    result["provenance"]["load_average_end"] = load_average()
    result["provenance"]["wall_seconds"] = time.perf_counter() - t0
    save()
    print(f"wrote {args.out} ({result['provenance']['wall_seconds']:.0f} s)")
    return 0


def _say(name, seed, points):
    p = points[-1]
    print(f"  {name} seed {seed}: rate {p['rate']:.3f}, strict {p['rate_strict']:.3f}, KL "
          f"{p['kl_per_line']:.2f}, val {p['val_nats_per_char']:.4f}", flush=True)
