"""``python -m tformer run attention``: the single attention layer on the copy-max task.

Trains ``AttentionLayer`` with L = ½‖Y − Y_true‖² and AdamW (ε inside the square root) through
``tformer.training.train.train``, then prints the final training loss and the held-out loss and accuracy
(the share of output rows whose nearest input row is the one with the largest first feature).
``add_common_arguments`` and ``fit`` are shared with ``python -m tformer run transformer2``.
"""
import time

import numpy as np

from tformer.data.copy_max import copy_max_batch, evaluate, half_sum_loss, held_out
from tformer.models.attention_layer import AttentionLayer
from tformer.training.optim import AdamW
from tformer.training.train import train
from tformer.runs.flag_groups import Flag, add_checkpoint_flags, add_model_flags, add_training_flags
from tformer.runs.flags import positive_float, positive_int

DEFAULTS = dict(d_model=16, seq_len=8, batch_size=32, steps=3000, lr=3e-3)


def add_common_arguments(parser, defaults):
    """The flags both the single attention layer and the two-layer transformer take: sizes, steps, optimizer, seed, evaluation."""
    g = parser.add_argument_group("sizes")
    add_model_flags(g, d_model=Flag(defaults["d_model"], "features per position, d (the inputs' "
                                                         "width and the model's)"),
                    seq_len=defaults["seq_len"])
    add_training_flags(g, batch_size=Flag(defaults["batch_size"],
                                          "sequences per training batch, B"))
    g = parser.add_argument_group("training")
    add_training_flags(g, steps=Flag(defaults["steps"], "AdamW steps (one batch each)"),
                       lr=Flag(defaults["lr"], "learning rate η"),
                       weight_decay=Flag(0.01, "AdamW's λ: W ← (1 − λη) W − …"))
    g.add_argument("--eps", type=positive_float, default=1e-8,
                   help="AdamW's ε, inside the square root")
    add_training_flags(g, seed=Flag(0, "seeds the initial weights and every batch"))
    g = parser.add_argument_group("evaluation and output")
    g.add_argument("--eval-batches", type=positive_int, default=16,
                   help="held-out batches of 64 sequences each (never used for training)")
    add_training_flags(g, eval_every=Flag(0, "also evaluate every N steps and print it (0: only "
                                             "at the end)"))
    add_checkpoint_flags(g, checkpoint=Flag(None, "save model + optimizer + config here at the "
                                                  "end (.npz)", metavar="PATH"))


def add_arguments(parser):
    add_common_arguments(parser, DEFAULTS)


def check_flags(args):
    """The batch's activations (B·T·C, B·T·T, and the held-out batches of 64) fit in memory.
    The two-layer transformer's run shares it."""
    from tformer.runs.flags import activation_fits
    for B in (args.batch_size, 64 * args.eval_batches):
        activation_fits("--batch-size, --seq-len, --d-model, --eval-batches",
                        (B, args.seq_len, max(args.d_model, args.seq_len)))


def fit(model, args, make_batch, held, name):
    """Train ``model`` on batches ``make_batch(i, ...)`` with the flags in ``args``; print and return
    ``(history, final held-out metrics)``."""
    opt = AdamW(model, lr=args.lr, weight_decay=args.weight_decay, eps=args.eps, eps_inside_sqrt=True)

    def batch(i):
        return make_batch(i, batch_size=args.batch_size, seq_len=args.seq_len, d_model=args.d_model,
                          seed=args.seed)

    def report(model):
        return evaluate(model, held)

    print(f"{name}: {model.num_parameters()} parameters, {model.config}; "
          f"B={args.batch_size} T={args.seq_len} steps={args.steps} lr={args.lr:g} "
          f"weight_decay={args.weight_decay:g}", flush=True)
    t0 = time.perf_counter()
    hist = train(model, opt, batch, half_sum_loss, args.steps, evaluate=report,
                 eval_every=args.eval_every, checkpoint_path=args.checkpoint,
                 config=dict(model.config, **_run_config(args)), desc=name,
                 log_path=getattr(args, "log", None))
    wall = time.perf_counter() - t0
    if args.eval_every:
        for step, m in hist["eval"]:
            print(f"  step {step:6d}: held-out loss {m['loss']:.4f}, accuracy {m['accuracy']:.2%}")
    final = hist["eval"][-1][1]
    n_held = sum(x.shape[0] for x, _ in held)
    last = hist["loss"][-100:]
    train_loss = float(np.mean(last))
    print(f"final training loss (½‖Y − Y_true‖² of a batch, mean of the last {len(last)} steps): "
          f"{train_loss:.4f} per batch of {args.batch_size}, {train_loss / args.batch_size:.4f} per sequence")
    print(f"held-out loss (½‖Y − Y_true‖² per sequence, {n_held} sequences): {final['loss']:.4f}")
    print(f"held-out accuracy: {final['accuracy']:.2%} of output rows nearest the right input row, "
          f"{final['seq_accuracy']:.2%} of sequences right at every position")
    print(f"wall time: {wall:.1f} s")
    final = dict(final, train_loss=train_loss, wall_s=wall)
    return hist, final


def _run_config(args):
    return {k: getattr(args, k) for k in ("seq_len", "batch_size", "lr", "weight_decay", "eps")}


def files(args):
    """What the run writes (``tformer.runs.declare``): ``--checkpoint`` (at the end), ``--log``.
    The two-layer transformer's run shares it."""
    from tformer.runs.declare import writes
    return [writes("--checkpoint", args.checkpoint), writes("--log", getattr(args, "log", None))]


def main(args):
    model = AttentionLayer(d_model=args.d_model, seed=args.seed)
    held = held_out(args.eval_batches, batch_size=64, seq_len=args.seq_len, d_model=args.d_model,
                    seed=args.seed)
    fit(model, args, copy_max_batch, held, "attention")
    return 0
