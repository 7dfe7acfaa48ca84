"""``python -m tformer finetune``: tune a trained TinyGPT on preference pairs, by DPO or by
fine-tuning on the chosen responses (SFT), all weights or LoRA adapters.

    --dpo:  L = (1/N) Σ_i −log σ(β Δ_i),
            Δ_i = (log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))
    --sft:  L = −(1/Σ|y_w|) Σ_i Σ_t log π(y_w,t | x, y_w,<t)      (the rejected responses unused)

π_ref is the model read from ``--checkpoint``, π the model tuned from it; log π(y|x) sums over the
response's tokens. ``tformer.tuning.tune`` does the work through the book's one training loop (AdamW,
clipping at 1, warm-up over a tenth of the steps, cosine to a tenth of the peak rate, weight decay
0); ``tformer.tuning.dpo`` holds DPO's loss and its gradient, derived by hand.

    python -m tformer finetune (--dpo PAIRS | --sft PAIRS) [--checkpoint MODEL] [--tokenizer TOK]
        --out OUT [--lora R] [--lora-alpha A] [--lora-targets T] [--steps N] [--lr LR]
        [--beta B] [--batch-pairs B] [--seed S]

- ``PAIRS``: JSON lines ``{"prompt", "chosen", "rejected"}`` (text), as ``python -m tformer
  preference --pairs-out FILE`` writes them; read and checked by ``tformer.runs.pairs_file``.
- ``--checkpoint``: a float TinyGPT (``run tinygpt``) or an int8 one (``quantize``: its weights
  turned back into float32 to train); default the book's long-run model, whose tokenizer is the
  default ``--tokenizer``. A model of the 256 bytes needs no tokenizer.
- ``--out``: the tuned model, a float TinyGPT checkpoint (LoRA adapters merged into their weights)
  that records its tokenizer: ``python -m tformer generate --checkpoint OUT --tokenizer TOK``
  samples it. It is never an input, and an existing file there is replaced only if it is a TinyGPT
  checkpoint itself; it is written once, atomically, after training.
- ``--lora R``: rank-R adapters on ``--lora-targets`` (default every linear layer), scale
  ``--lora-alpha / R``; without it every weight is trained.

Every 10 steps (every steps/20 in a run of more than 200) it prints the objective on the first 32
pairs; at the end the objective on every pair before and after, and the share of pairs whose
implicit reward β log π/π_ref orders them right (β Δ_i > 0; with ``--sft`` too, for comparison):
at the start π = π_ref, so Δ_i = 0 for every pair. A learning rate at which training stops being
finite is a usage error naming ``--lr``; nothing is written.
"""
import os

import numpy as np

from tformer.training.checkpoint import save_checkpoint
from tformer.data.text import encode as byte_encode
from tformer.nn.lora import Adapters, merge_lora
from tformer.decoding.quantize import dequantized
from tformer.tuning.tune import margins, objective, tune
from tformer.runs.files import (MALFORMED, check_tokenizer, load_tinygpt_file, load_tokenizer_file,
                    read_checkpoint_file, tokenizer_record)
from tformer.runs.flag_groups import (REQUIRED, Flag, add_checkpoint_flags, add_data_flags,
                                      add_lora_flags, add_output_flags, add_training_flags)
from tformer.runs.flags import (UsageError, dpo_beta, positive_int, positive_learning_rate,
                                tuning_steps)
from tformer.runs.finetune import checked_targets
from tformer.runs.pairs_file import read_pairs
from tformer.runs.declare import reads, writes

DEFAULT_CHECKPOINT = "book/data/long_run_w8.npz"         # tformer.experiments.long_run's shipped
DEFAULT_TOKENIZER = "book/data/long_run_tokenizer.json"  # model and tokenizer
# The largest rates of the preference experiment's grids (book/data/preference.json) whose
# validation loss stayed within 0.05 nats/char of the base's: DPO there scans about 43 % of its
# lines at about 3 nats of KL per line; the rates its held-out objective picked cost ten times more.
LR = {"lora": 3e-4, "full": 3e-5}
STEPS, BETA, BATCH_PAIRS = 150, 0.1, 16
LORA_TARGETS = "all"                     # the preference experiment's adapters: every linear layer
PROBE = 32                               # pairs whose objective is printed during training


def add_arguments(p):
    """The finetune command's flags."""
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--dpo", metavar="PAIRS", default=None,
                      help="DPO on these pairs: JSON lines {prompt, chosen, rejected} (text)")
    what.add_argument("--sft", metavar="PAIRS", default=None,
                      help="fine-tune on the chosen responses of these pairs (the same file)")
    add_checkpoint_flags(p, checkpoint=Flag(DEFAULT_CHECKPOINT, "the TinyGPT to tune, float or "
                                                                "int8 (it is also DPO's reference)",
                                            metavar="MODEL"))
    add_data_flags(p, tokenizer=Flag(None, f"the model's BPE tokenizer (None: {DEFAULT_TOKENIZER} "
                                           f"with the default --checkpoint, the 256 bytes with "
                                           f"another)"))
    add_output_flags(p, out=Flag(REQUIRED, "where to write the tuned model (a float TinyGPT "
                                           "checkpoint)", metavar="FILE"))
    g = p.add_argument_group("LoRA")
    add_lora_flags(g, lora=Flag(None, "train rank-R adapters alone (merged into the weights at the "
                                      "end)"),
                   lora_alpha=Flag(None, "α of the adapters' scale s = α / R (None: R, s = 1)",
                                   metavar="A"),
                   lora_targets=Flag(None, f"comma-separated layer names: qkv, o, fc1, fc2, "
                                           f"lm_head, or the groups attn, mlp, all (None: "
                                           f"{LORA_TARGETS})", metavar="T"))
    add_training_flags(p, steps=Flag(STEPS, type=tuning_steps),
                       lr=Flag(None, f"peak learning rate (None: {LR['lora']:g} with --lora, "
                                     f"{LR['full']:g} without)", type=positive_learning_rate))
    p.add_argument("--beta", type=dpo_beta, default=None,
                   help=f"DPO's β, the strength of the pull toward the reference (None: {BETA:g}; "
                        f"with --sft, the β of the implicit reward reported)")
    p.add_argument("--batch-pairs", type=positive_int, default=BATCH_PAIRS,
                   help="pairs per step (at most the file's pairs)")
    add_training_flags(p, seed=Flag(0, "seed of the order of the pairs and of the adapters' "
                                       "start"))


def files(args):
    """What the command reads and writes (``tformer.runs.declare``): the pairs, the model and its
    tokenizer (the shipped one with the default ``--checkpoint``), ``--out``."""
    args.loss, args.pairs = ("dpo", args.dpo) if args.dpo is not None else ("sft", args.sft)
    args.pairs_flag = f"--{args.loss}"
    if args.tokenizer is None and args.checkpoint == DEFAULT_CHECKPOINT:
        args.tokenizer = DEFAULT_TOKENIZER
    from tformer.runs.pairs_file import EXPECTED
    return [reads(args.pairs_flag, args.pairs, f"a file of {EXPECTED}"),
            reads("--checkpoint", args.checkpoint),
            reads("--tokenizer", args.tokenizer), writes("--out", args.out)]


def check_args(args):
    """The flags that must agree, the tokenizer's default, and the files: no output is an input,
    ``--out`` can be written, and an existing ``--out`` is a TinyGPT checkpoint (nothing else is
    replaced)."""
    args.loss, args.pairs = ("dpo", args.dpo) if args.dpo is not None else ("sft", args.sft)
    args.pairs_flag = f"--{args.loss}"
    if args.lora is None:
        for flag, value in (("--lora-alpha", args.lora_alpha), ("--lora-targets", args.lora_targets)):
            if value is not None:
                raise ValueError(f"{flag}: applies to LoRA fine-tuning; expected --lora R too, "
                                 f"got {flag} {value} alone")
    if args.beta is None:
        args.beta = BETA
    if args.lora is not None and args.lora_targets is None:
        args.lora_targets = LORA_TARGETS
    if args.lr is None:
        args.lr = LR["lora" if args.lora is not None else "full"]
    files(args)
    if os.path.exists(args.out):
        _replaceable(args.out)


def _replaceable(path):
    """ValueError unless the existing file ``path`` is a float TinyGPT checkpoint (what --out
    writes): another kind of file is never replaced without a word."""
    try:
        meta = read_checkpoint_file("--out", path)[0]
        if "vocab_size" not in meta["config"] or "pad_idx" in meta["config"] or \
                meta["config"].get("lora"):
            raise UsageError("a checkpoint of another model")
    except UsageError as e:
        why = str(e).split(f"{path!r}: ", 1)[-1]
        raise ValueError(f"--out: expected a new file or a TinyGPT checkpoint to replace, got the "
                         f"existing {path!r} ({why}); it is kept: choose another --out or remove "
                         f"it") from None


def _model(args):
    """``(model, tokenizer, encode)``: the float TinyGPT of ``--checkpoint``, its tokenizer (None:
    the bytes) and text -> ids; a UsageError if they do not go together."""
    model, meta = load_tinygpt_file("--checkpoint", args.checkpoint)
    V = model.config["vocab_size"]
    if args.tokenizer is None:
        if V != 256:
            raise UsageError(f"--tokenizer: the model reads {V} tokens, not the 256 bytes; "
                             f"expected the tokenizer it was trained with, got none")
        tokenizer, encode = None, byte_encode
    else:
        tokenizer = load_tokenizer_file("--tokenizer", args.tokenizer)
        if tokenizer.vocab_size != V:
            raise UsageError(f"--tokenizer: expected a tokenizer of the model's {V} tokens, got "
                             f"{tokenizer.vocab_size} in {args.tokenizer!r}")
        check_tokenizer(meta, tokenizer, "--tokenizer", args.tokenizer, "--checkpoint",
                        args.checkpoint)
        encode = tokenizer.encode
    try:
        return dequantized(model), tokenizer, encode
    except MALFORMED as e:
        raise UsageError(f"--checkpoint: expected a TinyGPT checkpoint, got {args.checkpoint!r}: "
                         f"{e}") from None


def _lora(args, model):
    """``tune``'s ``lora`` argument, its targets and rank checked on ``model``; None without
    ``--lora``."""
    if args.lora is None:
        return None
    targets = checked_targets(args, model)
    return {"r": args.lora, "alpha": args.lora_alpha, "targets": targets}


def _progress(args, probe, every):
    """``evaluate`` for ``train``: prints the objective on ``probe`` every ``every`` steps."""
    calls = []

    def evaluate(model):
        calls.append(None)
        step = min(len(calls) * every, args.steps)
        value = objective(model, probe, args.loss, args.beta)
        print(f"step {step:{len(str(args.steps))}d}/{args.steps}: {args.loss} loss "
              f"{value:.4f} on the first {len(probe)} pairs", flush=True)
        return {"probe": value}
    return evaluate


def _describe(args, model, pairs, cut, batch):
    name = "DPO" if args.loss == "dpo" else "fine-tuning on the chosen responses (SFT)"
    cfg = model.config
    print(f"{name} on {len(pairs):,} pairs of {args.pairs_flag} {args.pairs}"
          + (f" ({cut:,} prompt{'s' * (cut > 1)} cut on the left to fit T = {cfg['max_len']})"
             if cut else ""))
    print(f"model: {args.checkpoint}, TinyGPT C={cfg['d_model']}, {cfg['n_layers']} layers, "
          f"T={cfg['max_len']}, V={cfg['vocab_size']:,}, {model.num_parameters():,} parameters"
          + (f"; tokenizer {args.tokenizer}" if args.tokenizer else "; bytes"))
    what = (f"LoRA r={args.lora}, α={args.lora_alpha or args.lora:g} on {args.lora_targets}"
            if args.lora is not None else "every weight")
    print(f"training: {what}; {args.steps} steps of {batch} pairs, peak lr {args.lr:g}"
          + (f", β={args.beta:g}" if args.loss == "dpo" else "")
          + (f" (--batch-pairs {args.batch_pairs} is more than the file's pairs)"
             if batch < args.batch_pairs else ""), flush=True)


def _report(before, after, margins, beta):
    print(f"objective on the {margins.size:,} pairs: {before:.4f} before, {after:.4f} after")
    share = float((margins > 0).mean())
    print(f"implicit reward β log π/π_ref orders the pair right (chosen above rejected): at the "
          f"start Δ = 0 for every pair (π = π_ref), after {share:.1%} of the pairs "
          f"(mean margin β Δ = {beta * float(margins.mean()):+.4f})")
    return share


def _train(args, base, pairs, lora, batch):
    """``(model, hist, objective after, margins Δ)``: ``tune`` with progress lines, the adapters
    merged; a UsageError naming ``--lr`` if training or the tuned model stops being finite."""
    probe = pairs.subset(np.arange(min(PROBE, len(pairs))))
    every = max(10, args.steps // 20)
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # said once, below
            model, hist = tune(base, pairs, args.loss, args.lr, args.steps, args.seed,
                               args.beta, lora, batch, evaluate=_progress(args, probe, every),
                               eval_every=every)
            if lora is not None:
                print(f"LoRA: {Adapters(model).num_trainable():,} trained parameters, merged "
                      f"into the weights")
                merge_lora(model)
            if not all(np.isfinite(p).all() for _, p, _ in model.named_parameters()):
                raise FloatingPointError("the tuned weights hold NaN or infinite values")
            return model, hist, objective(model, pairs, args.loss, args.beta), \
                margins(model, pairs)
    except (FloatingPointError, ValueError) as e:      # NonFiniteLossError is a FloatingPointError
        if not isinstance(e, FloatingPointError) and "NaN" not in str(e):
            raise                                        # not a diverged run: a bug to show
        raise UsageError(f"--lr: expected a learning rate at which training stays finite, got "
                         f"--lr {args.lr:g}: {e}; nothing was written") from None


def main(args):
    base, tokenizer, encode = _model(args)
    pairs, cut = read_pairs(args.pairs_flag, args.pairs, encode, base.config["max_len"])
    lora = _lora(args, base)
    batch = min(args.batch_pairs, len(pairs))
    _describe(args, base, pairs, cut, batch)                # every input checked: now work
    pairs.reference(base)
    before = objective(base, pairs, args.loss, args.beta)
    model, hist, after, margins = _train(args, base, pairs, lora, batch)
    share = _report(before, after, margins, args.beta)
    extra = {"tokenizer": tokenizer_record(tokenizer), "steps": args.steps,
             "finetune": {"loss": args.loss, "pairs": os.path.basename(args.pairs),
                          "n_pairs": len(pairs), "prompts_cut": cut,
                          "base": os.path.basename(args.checkpoint), "lr": args.lr,
                          "steps": args.steps, "beta": args.beta, "batch_pairs": batch,
                          "seed": args.seed, "lora": lora, "objective_before": before,
                          "objective_after": after, "reward_accuracy_after": share,
                          "losses": [float(x) for x in hist["loss"]]}}
    save_checkpoint(args.out, model, step=args.steps, extra=extra)
    print(f"wrote {args.out} ({os.path.getsize(args.out):,} bytes): python -m tformer generate "
          f"--checkpoint {args.out}" + (f" --tokenizer {args.tokenizer}" if tokenizer else ""))
    return 0
