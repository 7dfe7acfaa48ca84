"""``python -m tformer speedrun``: how fast TinyGPT reaches the Shakespeare recipe's loss (JSON).

    L* = the recipe's mean validation loss over its three seeds   (book/data/shakespeare.json)
    n_s = the first evaluated step at which seed s's validation loss is ≤ L*
    T_s = n_s · τ(c)          τ(c): seconds per training step of configuration c, two threads

**The target** is the Shakespeare chapter's result, read from its data file: nanoGPT's CPU recipe
(``shakespeare.RECIPE``, 2,000 AdamW steps), the mean over seeds 0, 1, 2 of the loss on the whole
validation split (108,736 characters, windows of 64). Every configuration is scored on those same
windows, whatever context it trains with.

**The stages** (``STAGES``) start from the recipe and add one change at a time to the incumbent:
Muon, the schedule, the learning rate, the batch, pieces of the modern block. A stage fixes its
schedule's length S by a pilot seed (``PILOT_SEED``, not a measured seed): the shortest of its
candidate lengths (``FRACTIONS`` of the incumbent's S) whose pilot ends at least ``MARGIN``
below L*. Then each measured seed trains S
steps, its validation loss measured every S/``CHECKS`` steps once it nears L*, and n_s is read off. A
stage is kept when every seed reaches L* and its times are lower than the incumbent's, Welch's
one-sided t-test p < ``ALPHA`` over seeds; otherwise the incumbent carries on. The recipe's own time
is its 2,000 steps (L* is its seeds' mean, so some of them end just above it).

**The time** τ(c) is not read from the training runs: on a shared machine their clocks measure the
load as much as the code. It is measured separately, every stage's configuration in turn within
each of ``ROUNDS`` rounds (one round: ``STEPS_PER_ROUND`` steps of each), two threads, so that a
change of load hits every configuration alike; τ is the median over rounds. The training runs
themselves are deterministic (one thread; the update is the same on 1, 2, 3 threads to rounding),
so n_s does not depend on the machine; their own wall times are kept too, with the load average.

**Side by side**: the final configuration also trains in PyTorch (``tformer.bench.torch_gpt``: the
twin with the same initial weights, batches and schedule; ``torch.optim.Muon`` for the hidden
matrices, ``torch.optim.AdamW`` for the rest), its validation loss at S and its step time measured
in the same rounds as tformer's.

Resumable: a finished run is kept in ``--out`` and not run again; the runs go two at a time, one
process and one thread each.
"""
import json
import math
import os
import time

import numpy as np

from tformer.core import parallel
from tformer.core.atomic import write_json
from tformer.core.progress import progress
from tformer.core.provenance import load_average, record
from tformer.data.shakespeare import shakespeare_data
from tformer.data.text import evaluate_loss
from tformer.experiments.shakespeare import EVAL_WINDOWS, RECIPE, Timed
from tformer.models.tinygpt import TinyGPT
from tformer.runs.flag_groups import Flag, add_output_flags, add_timing_flags, add_training_flags
from tformer.runs.tinygpt import forward_loss
from tformer.training.muon import MuonAdamW
from tformer.training.optim import AdamW
from tformer.training.schedules import cosine_with_warmup, trapezoid
from tformer.training.train import train

DEFAULT_OUT = "book/data/speedrun.json"
TARGET_FILE = "book/data/shakespeare.json"
SEEDS = (0, 1, 2)
PILOT_SEED = 100
MARGIN = 0.02            # nats/char: a pilot must end this far below L* for its length to be chosen
CHECKS = 20              # an evaluation every S/20 steps
NEAR = 0.1               # the whole split is scored once the curve's windows are this close to L*
FRACTIONS = (1.0, 0.85, 0.7, 0.55, 0.45, 0.35, 0.3, 0.25, 0.2)   # of the incumbent's S
ALPHA = 0.05
ROUNDS, STEPS_PER_ROUND, TIME_THREADS = 7, 20, 2
WORKERS = 2              # training runs at a time, one process and one thread each

# The recipe, in the speedrun's terms: every knob a stage may change.
BASE = dict(RECIPE, optimizer="adamw", schedule="cosine", cooldown=None, muon_lr=0.02,
            muon_weight_decay=0.0, norm="layernorm", positions="learned", mlp="gelu")
BASE.pop("steps")
BASE_STEPS = RECIPE["steps"]

# (name, what changes, why) — each on top of the incumbent, its length S one of FRACTIONS of the
# incumbent's (the pilot picks).
STAGES = (
    ("muon", dict(optimizer="muon"),
     "Muon (lr 0.02, momentum 0.95, Nesterov, 5 Newton–Schulz steps) for the blocks' matrices; "
     "AdamW as before for embeddings, head, gains and biases"),
    ("linear decay", dict(schedule="trapezoid", cooldown=1.0, min_lr=0.0),
     "after the warm-up a straight line from the peak to zero, not a cosine to a tenth"),
    ("higher rates", dict(lr=3e-3, muon_lr=0.04), "AdamW's peak 3e-3, Muon's 0.04"),
    ("batch 24", dict(batch_size=24), "24 windows per step instead of 12"),
    ("rmsnorm", dict(norm="rmsnorm"), "RMSNorm instead of LayerNorm"),
    ("relu²", dict(mlp="relu2"), "ReLU² (max(0, x)², modded-nanogpt's) instead of GELU in the MLP"),
)


def add_arguments(p):
    """The command's flags."""
    add_output_flags(p, out=DEFAULT_OUT, no_progress=False, no_torch=False)
    add_training_flags(p, seeds=Flag(list(SEEDS), "the measured seeds"))
    add_timing_flags(p, rounds=ROUNDS)


def files(args):
    """Reads the recipe's result (``book/data/shakespeare.json``, the target); updates ``--out``."""
    from tformer.runs.declare import reads, updates
    return [reads("the recipe's result", TARGET_FILE, "the Shakespeare chapter's result"),
            updates("--out", args.out)]


def check_args(args):
    """``--seeds`` distinct, at least two (a t-test needs a spread); the target file holds one."""
    if len(set(args.seeds)) != len(args.seeds) or len(args.seeds) < 2:
        raise ValueError(f"--seeds: expected at least two distinct seeds, got {args.seeds}")
    if PILOT_SEED in args.seeds:
        raise ValueError(f"--seeds: the pilot's seed {PILOT_SEED} cannot be a measured seed")
    target()
    if os.path.exists(args.out):
        previous(args.out)


def target(path=TARGET_FILE):
    """L*: the recipe's mean validation loss, nats/char (ValueError if the file lacks it)."""
    try:
        with open(path) as f:
            value = json.load(f)["summary"]["val_nats_mean"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"target: {path} holds no summary.val_nats_mean ({e})") from None
    if not (isinstance(value, float) and 0 < value < 10):
        raise ValueError(f"target: expected a loss in (0, 10) nats/char, got {value!r}")
    return value


def previous(path):
    """The result in ``path`` (to resume), or ValueError naming ``--out``."""
    try:
        with open(path) as f:
            out = json.load(f)
        if not isinstance(out.get("runs", {}), dict):
            raise TypeError("runs is not an object")
        return out
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"--out: {path} is not a speedrun result to resume ({e})") from None


# --- one configuration ----------------------------------------------------------------------------

def key(config, steps, seed):
    """The name under which a run is kept: its whole configuration, its length and seed."""
    return json.dumps({**config, "steps": steps, "seed": seed}, sort_keys=True)


def build(config, seed):
    """``(model, optimizer, data)`` of ``config`` for ``seed``."""
    c = config
    model = TinyGPT(d_model=c["d_model"], n_heads=c["n_heads"], n_layers=c["n_layers"],
                    max_len=c["block_size"], dropout=c["dropout"], seed=seed, norm=c["norm"],
                    positions=c["positions"], mlp=c["mlp"])
    adamw = dict(lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                 weight_decay=c["weight_decay"])
    if c["optimizer"] == "muon":
        opt = MuonAdamW(model, muon={"lr": c["muon_lr"], "weight_decay": c["muon_weight_decay"]},
                        adamw=adamw)
    else:
        opt = AdamW(model, **adamw)
    data = shakespeare_data(c["block_size"], c["batch_size"], c["val_fraction"], seed)
    return model, opt, data


def peak(config):
    """The learning rate the schedule scales: Muon's (AdamW's follows in proportion) or AdamW's."""
    return config["muon_lr"] if config["optimizer"] == "muon" else config["lr"]


def schedule(config, steps):
    """``step -> lr`` of ``config`` over ``steps``: the recipe's cosine to a tenth, or the
    trapezoid (warm-up, constant, a linear cool-down to 0 over ``cooldown`` of the steps after the
    warm-up; 1.0 is a straight line from the peak)."""
    top, warmup = peak(config), config["warmup"]
    if config["schedule"] == "cosine":
        low = top * config["min_lr"] / config["lr"]
        return lambda s: cosine_with_warmup(s, top, warmup, steps, low)
    cool = max(1, round(config["cooldown"] * (steps - warmup)))
    return lambda s: trapezoid(s, top, warmup, steps, cool)


def val_windows():
    """The recipe's validation windows (context 64, the whole split): L*'s yardstick."""
    data = shakespeare_data(RECIPE["block_size"], RECIPE["batch_size"], RECIPE["val_fraction"], 0)
    return data.windows("val", data.windows("val")[0].shape[0])


def run(config, steps, seed, val, goal, progress_bar=False):
    """Train ``config`` for ``steps`` from ``seed``. Every ``steps/CHECKS`` steps: the loss on
    ``EVAL_WINDOWS`` validation windows (the curve), and, once that is within ``NEAR`` of
    ``goal``, on the whole split ``val`` (where n_s is read); the final loss on ``val``; the
    training loss; the wall time without the evaluations."""
    model, opt, data = build(config, seed)
    small = data.windows("val", EVAL_WINDOWS) if config["block_size"] == 64 else \
        shakespeare_data(64, 12, config["val_fraction"], seed).windows("val", EVAL_WINDOWS)
    near = [False]

    def evaluate(m):
        out = {"curve": evaluate_loss(m, *small)}
        near[0] = near[0] or out["curve"] <= goal + NEAR
        if near[0]:
            out["val"] = evaluate_loss(m, *val)
        return out

    timed = Timed(evaluate)
    t = time.perf_counter()
    hist = train(model.train(), opt, data.batch, forward_loss, steps, clip_norm=config["clip"],
                 lr_schedule=schedule(config, steps), evaluate=timed,
                 eval_every=max(1, steps // CHECKS), progress_bar=progress_bar,
                 desc=f"seed {seed}, {steps} steps")
    seconds = time.perf_counter() - t - timed.seconds
    vals = [[s, m["val"]] for s, m in hist["eval"] if "val" in m]
    if not vals or vals[-1][0] != steps:
        vals.append([steps, evaluate_loss(model.eval(), *val)])
    return {"final": vals[-1][1], "val": vals, "curve": [[s, m["curve"]] for s, m in hist["eval"]],
            "loss": [round(x, 4) for x in hist["loss"]], "seconds": seconds,
            "threads": parallel.get_num_threads(), "load_average_after": load_average()}


def reached(result, goal):
    """n_s: the first evaluated step with validation loss ≤ ``goal``, or None."""
    return next((s for s, v in result["val"] if v <= goal), None)


# --- the step time ---------------------------------------------------------------------------------

def stepper(config, seed=0):
    """A function running ``STEPS_PER_ROUND`` training steps of ``config`` (state carried on)."""
    model, opt, data = build(config, seed)
    state = {"step": 0}
    lr = schedule(config, 10 ** 6)

    def go():
        s = state["step"]
        train(model.train(), opt, data.batch, forward_loss, s + STEPS_PER_ROUND, start_step=s,
              clip_norm=config["clip"], lr_schedule=lr, progress_bar=False)
        state["step"] = s + STEPS_PER_ROUND
    return go


def torch_stepper(config, seed=0):
    """The PyTorch twin's ``STEPS_PER_ROUND`` steps of ``config``."""
    step, _ = torch_trainer(config, seed, 10 ** 6)
    state = {"step": 0}

    def go():
        for _ in range(STEPS_PER_ROUND):
            state["step"] += 1
            step(state["step"])
    return go


def step_times(steppers, rounds, threads=TIME_THREADS):
    """``{name: [seconds per step of each round]}``, the configurations interleaved in each round
    (two warm-up calls each first)."""
    import torch
    was = parallel.get_num_threads()
    parallel.set_num_threads(threads)
    torch.set_num_threads(threads)
    try:
        for go in steppers.values():
            go(), go()
        times = {name: [] for name in steppers}
        for _ in range(rounds):
            for name, go in steppers.items():
                t = time.perf_counter()
                go()
                times[name].append((time.perf_counter() - t) / STEPS_PER_ROUND)
        return times
    finally:
        parallel.set_num_threads(was)


# --- PyTorch ---------------------------------------------------------------------------------------

def torch_trainer(config, seed, steps):
    """``(step(i) -> loss, loss_of(x, y))``: the twin of ``build(config, seed)`` with the same
    batches and schedule; ``torch.optim.Muon`` for the 2-D parameters of the blocks."""
    import torch
    from tformer.bench.torch_gpt import from_tinygpt
    model, _, data = build(config, seed)
    tm = from_tinygpt(model)
    hidden = [p for n, p in tm.named_parameters() if p.ndim == 2 and n.startswith("blocks.")]
    other = [p for n, p in tm.named_parameters() if not (p.ndim == 2 and n.startswith("blocks."))]
    adamw_kw = dict(betas=(config["beta1"], config["beta2"]), eps=config["eps"],
                    weight_decay=config["weight_decay"])
    if config["optimizer"] == "muon":
        opts = [(torch.optim.Muon(hidden, lr=config["muon_lr"],
                                  weight_decay=config["muon_weight_decay"]), 1.0),
                (torch.optim.AdamW(other, lr=config["lr"], **adamw_kw),
                 config["lr"] / config["muon_lr"])]
    else:
        opts = [(torch.optim.AdamW(tm.parameters(), lr=config["lr"], **adamw_kw), 1.0)]
    lr = schedule(config, steps)

    def step(i):
        for opt, scale in opts:
            for group in opt.param_groups:
                group["lr"] = lr(i) * scale
        x, y = (torch.from_numpy(a) for a in data.batch(i - 1))
        z = tm(x)
        loss = torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))
        for opt, _ in opts:
            opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), config["clip"])
        for opt, _ in opts:
            opt.step()
        return loss.item()

    def loss_of(x, y, rows=64):
        total = 0.0
        with torch.no_grad():
            for s in range(0, x.shape[0], rows):
                z = tm(torch.from_numpy(x[s:s + rows]))
                total += float(torch.nn.functional.cross_entropy(
                    z.reshape(-1, z.shape[-1]), torch.from_numpy(y[s:s + rows]).reshape(-1),
                    reduction="sum"))
        return total / y.size
    return step, loss_of


def torch_run(config, steps, seed, val, progress_bar=False):
    """The final configuration in PyTorch (one thread, as the tformer runs): loss at ``steps``."""
    import torch
    torch.manual_seed(seed)
    torch.set_num_threads(parallel.get_num_threads())
    step, loss_of = torch_trainer(config, seed, steps)
    t = time.perf_counter()
    losses = [step(i) for i in progress(range(1, steps + 1), enabled=progress_bar,
                                        desc=f"PyTorch seed {seed}")]
    seconds = time.perf_counter() - t
    return {"final": loss_of(*val), "loss": [round(x, 4) for x in losses], "seconds": seconds,
            "threads": torch.get_num_threads(), "torch": torch.__version__}


# --- the stages ------------------------------------------------------------------------------------

def welch_less(a, b):
    """One-sided Welch t-test of mean(a) < mean(b): the p-value (0 or 1 when both are constant)."""
    from scipy import stats
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.std() == 0 and b.std() == 0:
        return 0.0 if a.mean() < b.mean() else 1.0
    # one constant sample (the recipe's time is its length): Welch's t is then the other's
    # one-sample t against that constant, with its n − 1 degrees of freedom
    if b.std() == 0:
        return float(stats.ttest_1samp(a, b.mean(), alternative="less").pvalue)
    if a.std() == 0:
        return float(stats.ttest_1samp(b, a.mean(), alternative="greater").pvalue)
    return float(stats.ttest_ind(a, b, equal_var=False, alternative="less").pvalue)


def t_interval(xs):
    """``[mean, low, high]``: the mean and its 95 % Student-t interval over seeds."""
    from scipy import stats
    xs = np.asarray(xs, float)
    h = stats.t.ppf(0.975, xs.size - 1) * xs.std(ddof=1) / math.sqrt(xs.size) if xs.size > 1 else 0
    return [float(xs.mean()), float(xs.mean() - h), float(xs.mean() + h)]


def _job(config, steps, seed, goal):
    """One run in a worker process (one thread)."""
    parallel.set_num_threads(1)
    return run(config, steps, seed, val_windows(), goal)


class Runner:
    """Runs the training runs not yet in the result on disk, two at a time (one process and one
    thread each), and saves the result after each."""

    def __init__(self, out, result, goal, workers=None):
        self.out, self.result, self.goal = out, result, goal
        self.workers = WORKERS if workers is None else workers

    def get(self, jobs):
        """``[run result]`` of ``jobs = [(config, steps, seed)]``."""
        todo = [j for j in jobs if key(*j) not in self.result["runs"]]
        if todo and self.workers == 1:
            for j in todo:
                self.result["runs"][key(*j)] = _job(*j, self.goal)
                write_json(self.out, self.result)
        elif todo:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(min(self.workers, len(todo)), mp_context=ctx) as pool:
                futures = {pool.submit(_job, *j, self.goal): j for j in todo}
                for f in progress(as_completed(futures), total=len(todo), desc="runs"):
                    j = futures[f]
                    self.result["runs"][key(*j)] = f.result()
                    write_json(self.out, self.result)
        return [self.result["runs"][key(*j)] for j in jobs]


def pilot(runner, config, candidates, goal):
    """The shortest candidate length whose pilot seed ends ≥ MARGIN below ``goal`` (else the
    longest), and each pilot's final loss; the candidates run two at a time, longest first,
    until one fails."""
    finals, order = {}, sorted(candidates, reverse=True)
    for i in range(0, len(order), 2):
        pair = order[i:i + 2]
        for steps, r in zip(pair, runner.get([(config, s, PILOT_SEED) for s in pair])):
            finals[steps] = r["final"]
        if any(finals[s] > goal - MARGIN for s in pair):
            break
    good = [s for s, v in finals.items() if v <= goal - MARGIN]
    return (min(good) if good else max(candidates)), finals


def score(entry, tau, incumbent=None):
    """T_s = n_s·τ of a stage whose every seed reached L*, and the verdict against the incumbent."""
    entry = dict(entry, tau=tau)
    if all(n is not None for n in entry["reached"]):
        entry["times"] = [n * tau for n in entry["reached"]]
        entry["time"] = t_interval(entry["times"])
        if incumbent is not None:
            entry["p"] = welch_less(entry["times"], incumbent["times"])
            entry["kept"] = entry["p"] < ALPHA
    else:
        entry["kept"] = False
    return entry


def measure(runner, name, config, steps, seeds, goal):
    """Every seed of ``config`` at ``steps``: final losses and n_s (the recipe's n_s: its length)."""
    runs = runner.get([(config, steps, s) for s in seeds])
    finals = [r["final"] for r in runs]
    reached = [steps] * len(seeds) if name == "recipe" else [reached_at(r, goal) for r in runs]
    return {"name": name, "config": config, "steps": steps, "finals": finals,
            "final": t_interval(finals), "reached": reached, "kept": name == "recipe"}


def reached_at(result, goal):
    return reached(result, goal)


def main(args):
    t0 = time.perf_counter()
    goal = target()
    result = previous(args.out) if os.path.exists(args.out) else {}
    result.setdefault("runs", {})
    result.setdefault("pair_tau", {})
    result.update({"provenance": record("speedrun"), "target": goal, "target_file": TARGET_FILE,
                   "seeds": list(args.seeds), "pilot_seed": PILOT_SEED, "margin": MARGIN,
                   "checks": CHECKS, "alpha": ALPHA, "base": BASE, "base_steps": BASE_STEPS,
                   "fractions": list(FRACTIONS),
                   "stages_planned": [[n, c, why] for n, c, why in STAGES]})
    runner = Runner(args.out, result, goal)
    entries = [measure(runner, "recipe", dict(BASE), BASE_STEPS, args.seeds, goal)]
    configs = {"recipe": dict(BASE)}
    incumbent = None
    for name, change, why in STAGES:
        best = entries[0] if incumbent is None else incumbent
        trial = {**best["config"], **change}
        candidates = sorted({round(f * best["steps"]) for f in FRACTIONS}, reverse=True)
        steps, finals = pilot(runner, trial, candidates, goal)
        e = measure(runner, name, trial, steps, args.seeds, goal)
        e.update(why=why, change=change, pilot={str(k): v for k, v in finals.items()})
        # τ of the incumbent and the trial, interleaved, decides (the table re-times all below)
        if name not in result["pair_tau"]:
            t = step_times({"incumbent": stepper(best["config"]), "trial": stepper(trial)},
                           args.rounds)
            result["pair_tau"][name] = {k: float(np.median(v)) for k, v in t.items()}
        pt = result["pair_tau"][name]
        inc = score(best, pt["incumbent"])
        e = score(e, pt["trial"], inc)
        e["decided_with"] = {"incumbent_tau": pt["incumbent"], "incumbent_times": inc["times"]}
        entries.append(e)
        configs[name] = trial
        if e["kept"]:
            incumbent = e
        print(f"{name}: S {steps}, finals {np.round(e['finals'], 4)}, reached {e['reached']}, "
              f"p {e.get('p')}, kept {e['kept']}", flush=True)
        result["stages"] = entries
        write_json(args.out, result)
    final = incumbent or entries[0]
    result["final_config"] = {"name": final["name"], "config": final["config"],
                              "steps": final["steps"]}
    return finish(args, result, configs, t0)


def finish(args, result, configs, t0):
    """Step times of every stage's configuration (and the twin's of the final one), interleaved;
    the stages re-scored with them; the PyTorch runs; the file written."""
    final, steps = result["final_config"]["config"], result["final_config"]["steps"]
    steppers = {name: stepper(c) for name, c in configs.items()}
    if not args.no_torch:
        steppers["torch final"] = torch_stepper(final)
    times = step_times(steppers, args.rounds)
    result["tau"] = {n: {"median": float(np.median(t)), "rounds": t} for n, t in times.items()}
    result["tau_threads"] = TIME_THREADS
    # the table: every stage's times with the τ of these rounds, and Welch's p against the
    # incumbent with them (``p_retimed``); the verdict and its p stay those of the stage's own
    # pair timing, which decided what the next stages were built on
    incumbent, rescored = None, []
    for e in result["stages"]:
        r = score({**e, "kept": e["name"] == "recipe"}, result["tau"][e["name"]]["median"],
                  incumbent)
        if "p" in r:
            r["p_retimed"] = r["p"]
        r.update({k: e[k] for k in ("kept", "p") if k in e})
        rescored.append(r)
        if r["kept"]:
            incumbent = r
    result["table"] = rescored
    torch_key = key(final, steps, list(args.seeds))
    if not args.no_torch and result.get("torch", {}).get("key") != torch_key:
        val = val_windows()
        parallel.set_num_threads(1)
        runs = {str(s): torch_run(final, steps, s, val, not args.no_progress) for s in args.seeds}
        result["torch"] = {"runs": runs, "final": t_interval([r["final"] for r in runs.values()]),
                           "key": torch_key}
    result["provenance"]["load_average_end"] = load_average()
    result["provenance"]["wall_seconds"] = time.perf_counter() - t0
    write_json(args.out, result)
    print(f"wrote {args.out} ({result['provenance']['wall_seconds']:.0f} s)")
    return 0
