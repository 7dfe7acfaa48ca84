"""``python -m tformer preference``: DPO teaches the long run's model to write lines that scan.

    L_DPO = (1/N) Σ −log σ(β [(log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))])

**The model** is the book's long-run TinyGPT (3x128, BPE 8,192, ``long_run.load_shipped``) with its
int8 weights turned back into float32 (``scaling.quantize.dequantized``): the reference π_ref, and the
start of every tuned policy π. **The preference** is iambic pentameter, judged by
``tformer.data.meter.scans`` (the CMU Pronouncing Dictionary). **The data**: prompts end inside a
speech of the 38 plays' training text (``tformer.tuning.pairs``); the reference writes
``SAMPLES`` next lines for each at temperature 1; on every prompt where the judge says yes to some
and no to others, yes and no are paired. Every pair comes from the model's own distribution.

**The methods**, each from the reference with the same pairs, steps and batches per seed
(``METHODS``): DPO with LoRA adapters on every linear layer (``dpo-lora``), DPO on every weight
(``dpo-full``), and supervised fine-tuning on the chosen lines alone (``sft-lora``, ``sft-full``),
the baseline that needs no pairs. Each method's peak learning rate is picked from ``LR_GRID`` by
its own objective on held-out pairs (pairs of training-text prompts kept out of training; never the
evaluation prompts); every rate of the grid is measured too, on a pilot seed, which traces each
method's frontier of the preference against the KL and the loss it costs. Weight decay is 0 for every method: nothing pulls the weights toward zero
that the reference did not (the KL term is DPO's pull toward the reference).

**What is measured**, on prompts from the eight plays' validation text (held out of the long run's
training and of the pairs): the share of sampled lines that scan (``EVAL_SAMPLES`` per prompt,
temperature 1, the same draws for every model), with a 95 % Wilson interval per run and the spread
over seeds; the KL divergence KL(π ‖ π_ref) per line, exact over the vocabulary at each position
of the policy's own lines; the validation loss on the yardstick (nats/char, the long run's
1.22); the base's rate with best-of-n (n lines drawn, the judge picks one that scans: the rate is
the share of prompts where one of n does), the sceptic's baseline that needs no training.
"""
import json
import math
import os
import time

import numpy as np

from tformer.core.atomic import write_json
from tformer.tuning import pairs as PR
from tformer.data.all_plays import all_plays_data, all_plays_documents, yardstick
from tformer.data.meter import scans
from tformer.fast.losses import kl_divergence, log_softmax
from tformer.runs.flags import UsageError
from tformer.decoding.quantize import dequantized
from tformer.runs.declare import reads, writes
from tformer.tuning.tune import Pairs, objective, tune
from tformer.experiments.long_run import load_shipped, load_shipped_model
from tformer.core.provenance import load_average, record
from tformer.experiments.scaling_corpus import token_windows, windows_nats_per_char

DEFAULT_OUT = "book/data/preference.json"
METHODS = {"dpo-lora": {"loss": "dpo", "kind": "lora"}, "dpo-full": {"loss": "dpo", "kind": "full"},
           "sft-lora": {"loss": "sft", "kind": "lora"}, "sft-full": {"loss": "sft", "kind": "full"}}
LR_GRID = {"lora": (1e-4, 3e-4, 1e-3, 3e-3), "full": (1e-5, 3e-5, 1e-4, 3e-4)}
LORA = {"r": 8, "targets": "all"}
BETA = 0.1
SAMPLES = 8
PAIR_PROMPTS = 1600
HELD_OUT = 0.1
EVAL_PROMPTS = 300
EVAL_SAMPLES = 4
BEST_OF = (1, 2, 4, 8)
BATCH_PAIRS = 16
DEFAULT_STEPS = 150
SHOW = 6                      # lines shown per model in the result


def add_arguments(p):
    from tformer.runs.flag_groups import Flag, add_output_flags, add_training_flags
    add_output_flags(p, out=DEFAULT_OUT)
    add_training_flags(p, steps=Flag(DEFAULT_STEPS, "training steps of every method"),
                       seeds=Flag([1, 2, 3], "training seeds (order of the pairs, adapters' "
                                             "start)"))
    p.add_argument("--pairs-out", default="", help="also write the training pairs as JSON lines "
                   "(prompt, chosen, rejected), the input of `python -m tformer finetune --dpo`")


def files(args):
    """What the command reads and writes (``tformer.runs.declare``): the long run's shipped
    model, its tokenizer and its plan; ``--out`` and ``--pairs-out``."""
    from tformer.experiments.long_run import DEFAULT_OUT as PLAN, SHIPPED_MODEL, SHIPPED_TOKENIZER
    return [reads("the long run's model", SHIPPED_MODEL), reads("its tokenizer", SHIPPED_TOKENIZER),
            reads("its plan", PLAN), writes("--out", args.out), writes("--pairs-out", args.pairs_out)]


def check_args(args):
    if args.steps < 10:
        raise UsageError(f"--steps: expected at least 10 (a tenth is the warm-up), got {args.steps}")
    if len(args.seeds) < 2 or len(set(args.seeds)) != len(args.seeds):
        raise UsageError(f"--seeds: expected at least two different seeds, got {args.seeds}")


# --- the data ----------------------------------------------------------------------------------

def texts():
    """``(train, eval)``: the 38 plays' training text and the eight plays' validation text."""
    docs = all_plays_documents()
    data = all_plays_data(documents=docs)
    return data.train.tobytes().decode("ascii"), yardstick(data, docs).tobytes().decode("ascii")


def judge_all(tokenizer, responses, lengths):
    """``(M, n)`` bool: the judge on each response's line (``responses: (M, n, R)``)."""
    M, n, _ = responses.shape
    flat, lens = responses.reshape(M * n, -1), lengths.reshape(-1)
    return np.array([scans(PR.line_of(tokenizer, r[:k])) for r, k in zip(flat, lens)]).reshape(M, n)


def draw(model, tokenizer, prompt_ids, n, seed):
    """``n`` lines per prompt: ``(responses (M, n, R), lengths (M, n), judged (M, n))``."""
    rng = np.random.default_rng(seed)
    resp = PR.sample_responses(model, prompt_ids, n, rng)
    lens = PR.cut_responses(resp.reshape(-1, resp.shape[2]), PR.newline_tokens(tokenizer))
    lens = lens.reshape(resp.shape[:2])
    return resp, lens, judge_all(tokenizer, resp, lens)


# --- the measurements ----------------------------------------------------------------------------

def kl_per_line(model, ref, prompt_ids, resp, lens, rows=32):
    """KL(π ‖ π_ref) of each line: Σ_t Σ_v π_t(v) (log π_t(v) − log π_ref,t(v)) over its positions."""
    out = []
    P, R = prompt_ids, resp.reshape(-1, resp.shape[-1])
    P = np.repeat(P, resp.shape[1], axis=0)
    lens = lens.reshape(-1)
    for s in range(0, R.shape[0], rows):
        x, _, m = PR.sequences(P[s:s + rows], R[s:s + rows], lens[s:s + rows])
        lp, lq = log_softmax(model.forward(x)), log_softmax(ref.forward(x))
        kl = kl_divergence(lp, lq)                                         # (b, T)
        out.append(np.where(m, kl, 0).sum(axis=1))
    return np.concatenate(out)


def yardstick_windows(tokenizer, text, T):
    """The validation text as the long run scores it: ``(x, y, token_lengths)``."""
    ids = tokenizer.encode(text.encode())
    return (*token_windows(ids, T), np.array([len(t) for t in tokenizer.tokens]))


def nats_per_char(model, windows):
    return windows_nats_per_char(model, *windows)


def wilson(k, n, z=1.959964):
    """The 95 % Wilson score interval of a rate k/n."""
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(c - h, 5), round(c + h, 5)]


# Student's t, two-sided 95 %, by degrees of freedom (beyond 10: the normal's 1.96 is within 6 %).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228}


def t_interval(xs):
    """``[mean, low, high]``: the seeds' mean and its 95 % Student-t interval."""
    xs = np.asarray(xs, dtype=np.float64)
    h = T95.get(xs.size - 1, 1.96) * xs.std(ddof=1) / math.sqrt(xs.size)
    return [round(float(xs.mean()), 5), round(float(xs.mean() - h), 5), round(float(xs.mean() + h), 5)]


def evaluate(model, ref, tokenizer, prompt_ids, windows, seed):
    """Rate of lines that scan (Wilson interval), KL per line, nats/char, a few lines."""
    resp, lens, judged = draw(model, tokenizer, prompt_ids, EVAL_SAMPLES, seed)
    k, n = int(judged.sum()), judged.size
    kl = kl_per_line(model, ref, prompt_ids, resp, lens)
    lines = [PR.line_of(tokenizer, resp[i, 0, :lens[i, 0]]) for i in range(SHOW)]
    return {"rate": k / n, "scans": k, "lines": n, "rate_interval": wilson(k, n),
            "kl_per_line": float(kl.mean()), "val_nats_per_char": nats_per_char(model, windows),
            "mean_tokens": float(lens.mean()), "samples": lines,
            "samples_scan": [bool(judged[i, 0]) for i in range(SHOW)]}


# --- the experiment ------------------------------------------------------------------------------

def best_of(judged, ns=BEST_OF):
    """The share of prompts where one of the first n lines scans, for each n (the judge picks it)."""
    return {str(n): float(judged[:, :n].any(axis=1).mean()) for n in ns if n <= judged.shape[1]}


def make_data(model, tokenizer, train_text):
    """The pairs (training and held-out) and what the reference's lines were like."""
    prompt_ids, _ = PR.prompts(train_text, tokenizer, PAIR_PROMPTS, np.random.default_rng(0))
    resp, lens, judged = draw(model, tokenizer, prompt_ids, SAMPLES, seed=0)
    n_out = round(HELD_OUT * PAIR_PROMPTS)
    split = {}
    for name, rows in (("train", np.arange(n_out, PAIR_PROMPTS)), ("held_out", np.arange(n_out))):
        index = [(rows[m], w, l) for m, w, l in PR.make_pairs(judged[rows])]
        split[name] = Pairs.from_samples(prompt_ids, resp, lens, index).reference(model)
    info = {"prompts": PAIR_PROMPTS, "samples_per_prompt": SAMPLES, "rate": float(judged.mean()),
            "prompts_with_a_pair": int((judged.any(1) & ~judged.all(1)).sum()),
            "pairs": len(split["train"]), "held_out_pairs": len(split["held_out"]),
            "mean_tokens": float(lens.mean())}
    return split, info, (prompt_ids, resp, lens)


def run(base, method, pairs, lr, steps, seed):
    """``tune`` with a method of ``METHODS``."""
    return tune(base, pairs, method["loss"], lr, steps, seed, BETA,
                LORA if method["kind"] == "lora" else None, BATCH_PAIRS)


def pick_lr(base, method, pairs, steps, seed, measure):
    """Every rate of the grid on a pilot seed: its held-out objective and ``measure(model)``
    (the frontier of the preference against KL and loss); the rate with the lowest held-out
    objective is the method's."""
    grid = {}
    for lr in LR_GRID[method["kind"]]:
        model, _ = run(base, method, pairs["train"], lr, steps, seed)
        ev = measure(model)
        grid[str(lr)] = {"held_out": round(objective(model, pairs["held_out"], method["loss"], BETA), 5),
                         **{k: ev[k] for k in ("rate", "kl_per_line", "val_nats_per_char")}}
        print(f"  lr {lr:g}: {grid[str(lr)]}", flush=True)
    return float(min(grid, key=lambda k: grid[k]["held_out"])), grid


def main(args):
    t0 = time.perf_counter()
    qmodel, tokenizer = load_shipped_model("preference")
    ref = dequantized(qmodel)
    train_text, eval_text = texts()
    windows = yardstick_windows(tokenizer, eval_text, ref.max_len)
    result = {"provenance": record("preference"),
              "config": {"beta": BETA, "steps": args.steps, "seeds": args.seeds,
                         "batch_pairs": BATCH_PAIRS, "lora": LORA, "lr_grid": LR_GRID,
                         "weight_decay": 0.0, "prompt_tokens": PR.PROMPT_TOKENS,
                         "response_tokens": PR.RESPONSE_TOKENS, "temperature": 1.0,
                         "eval_prompts": EVAL_PROMPTS, "eval_samples": EVAL_SAMPLES,
                         "warmup": "steps // 10", "min_lr": "lr / 10", "clip": 1.0}}
    print("the reference writes the pairs ...", flush=True)
    pairs, result["pairs"], raw = make_data(ref, tokenizer, train_text)
    print(f"pairs: {result['pairs']}", flush=True)
    if args.pairs_out:
        p, c, r = pairs["train"].prompt, pairs["train"].chosen, pairs["train"].rejected
        PR.write_pairs(args.pairs_out, tokenizer,
                       [(p[i], c[i, :pairs["train"].chosen_len[i]],
                         r[i, :pairs["train"].rejected_len[i]]) for i in range(len(p))])
    eval_ids, _ = PR.prompts(eval_text, tokenizer, EVAL_PROMPTS, np.random.default_rng(1))
    _, _, judged = draw(ref, tokenizer, eval_ids, max(BEST_OF), seed=2)
    result["shown_prompts"] = [tokenizer.decode(list(p)) for p in eval_ids[:SHOW]]
    result["base"] = {**evaluate(ref, ref, tokenizer, eval_ids, windows, seed=3),
                      "best_of": best_of(judged)}
    print(f"base: rate {result['base']['rate']:.3f}, best-of {result['base']['best_of']}", flush=True)
    result["methods"] = {}
    for name, method in METHODS.items():
        print(f"{name}: picking the learning rate ...", flush=True)
        lr, grid = pick_lr(ref, method, pairs, args.steps, seed=100,
                           measure=lambda m: evaluate(m, ref, tokenizer, eval_ids, windows, 3))
        runs = []
        for seed in args.seeds:
            model, hist = run(ref, method, pairs["train"], lr, args.steps, seed)
            ev = evaluate(model, ref, tokenizer, eval_ids, windows, seed=3)
            runs.append({"seed": seed, **ev, "losses": [round(x, 5) for x in hist["loss"]],
                         "held_out": objective(model, pairs["held_out"], method["loss"], BETA),
                         "seconds": hist["time"][-1]})
            print(f"  seed {seed}: rate {ev['rate']:.3f} KL {ev['kl_per_line']:.2f} "
                  f"val {ev['val_nats_per_char']:.4f}", flush=True)
        result["methods"][name] = {
            **method, "lr": lr, "lr_grid": grid, "runs": runs,
            **{key: t_interval([r[key] for r in runs])
               for key in ("rate", "kl_per_line", "val_nats_per_char")}}
        write_json(args.out, result)
    result["provenance"]["load_average_end"] = load_average()
    result["provenance"]["wall_seconds"] = time.perf_counter() - t0
    write_json(args.out, result)
    print(f"wrote {args.out} ({result['provenance']['wall_seconds']:.0f} s)")
    return 0
