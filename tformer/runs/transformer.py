"""``python -m tformer run transformer``: the complete Transformer on a padded sequence task.

Trains ``tformer.models.transformer.Transformer`` to reverse (or sort) sequences of variable
length, padded on the right, with every training feature of the complete Transformer:
cross-entropy that ignores padding, Adam, a warm-up schedule (cosine, or Vaswani et al.'s
``min(step^-0.5, step·warmup^-1.5)``), gradient clipping by global norm, gradient accumulation,
atomic checkpoints of model + optimizer +
config + step (``--resume`` continues one bit for bit), and the NaN guard. It ends by printing the
exact-match accuracy of greedy decoding and of beam search on held-out sequences.

``--batching bucketed`` draws length-bucketed batches under a budget of ``--max-tokens`` padded
positions (``tformer.data.batching``, Fitting in memory) instead of fixed batches of ``--batch-size``
rows padded to the longest possible row; ``--batching sorted`` keeps each step's fixed batch but
sorts it by length and splits it into micro-batches under ``--max-tokens`` (the same gradient,
less padding); the run then reports the share of padded positions and the tokens per second of
training for any kind. ``--gradient-checkpointing`` recomputes each
block's forward pass in the backward pass (``tformer.nn.recompute``).
"""
import os
import time

import numpy as np

from tformer.training.checkpoint import load_checkpoint
from tformer.data.batching import BucketedTask, SortedTask, counting, default_budget
from tformer.data.sequences import EOS, PAD, SequenceTask
from tformer.models.transformer import Transformer
from tformer.training.optim import Adam, cosine_with_warmup, noam_lr
from tformer.training.precision import precision_policy
from tformer.training.train import train
from tformer.runs.files import MALFORMED, read_checkpoint_file
from tformer.runs.flag_groups import (Flag, add_checkpoint_flags, add_compute_flags,
                                      add_data_flags, add_model_flags, add_output_flags,
                                      add_training_flags)
from tformer.runs.flags import (UsageError, at_least_two, fraction, heads_divide, idle,
                                length_penalty, positive_int, probability, resumed_steps)
from tformer.runs.declare import updates, writes

DEFAULT_CHECKPOINT = "checkpoints/transformer.npz"
EXPECTED_RESUME = ("a checkpoint of this run to --resume (saved by `python -m tformer run "
                   "transformer` with the same flags)")


def add_arguments(p):
    """The run's flags; the defaults reach the accuracy the chapter states in a few minutes on 2 cores."""
    g = p.add_argument_group("task")
    g.add_argument("--task", choices=("reverse", "sort"), default="reverse",
                   help="y = reverse(x) or sort(x)")
    g.add_argument("--n-symbols", type=at_least_two, default=10,
                   help="alphabet size of the sequences")
    g.add_argument("--min-len", type=positive_int, default=1, help="shortest sequence")
    add_model_flags(g, max_len=Flag(8, "longest sequence (rows are padded to 2·max_len+3)"))
    g = p.add_argument_group("model (the complete Transformer, decoder-only)")
    add_model_flags(g, d_model=64, n_heads=4, n_layers=Flag(2, "post-norm blocks N"),
                    d_ff=Flag(256, "hidden width of the ReLU FFN"))
    g.add_argument("--dropout", type=probability, default=0.1,
                   help="dropout probability (off in eval)")
    add_compute_flags(g, attention="plain", gradient_checkpointing=False,
                      blocks_per_segment=Flag(1, "with --gradient-checkpointing: blocks recomputed "
                                                 "together (k; √N is a good choice)"))
    g = p.add_argument_group("training")
    add_training_flags(g, steps=1500, batch_size=Flag(64, "sequences per micro-batch"))
    g.add_argument("--accum", type=positive_int, default=1,
                   help="micro-batches accumulated per step")
    g.add_argument("--batching", choices=("fixed", "bucketed", "sorted"), default="fixed",
                   help="fixed: --batch-size rows padded to 2·max_len+2; bucketed: rows of similar "
                        "length from a sorted pool, as many as fit in --max-tokens padded "
                        "positions; sorted: each step's fixed batch, sorted by length and split "
                        "into micro-batches of at most --max-tokens padded positions")
    g.add_argument("--max-tokens", type=positive_int, default=None,
                   help="bucketed, sorted: token budget B×T_max of a (micro-)batch (default: "
                        "bucketed --batch-size × (2·max_len+2), the size of a fixed batch; "
                        "sorted an eighth of that)")
    add_data_flags(g, pool_size=Flag(1024, "bucketed: sequences sorted by length together"))
    add_training_flags(g, lr=Flag(2e-3, "peak learning rate (reached at step --warmup)"))
    g.add_argument("--schedule", choices=("cosine", "noam"), default="cosine",
                   help="cosine with linear warm-up to --lr, or lr·√warmup·min(step^-0.5, step·warmup^-1.5)")
    add_training_flags(g, warmup=Flag(150, "warm-up steps"),
                       clip=Flag(1.0, "clip the global gradient norm to this (0: off)"),
                       seed=Flag(0, "seeds the initialisation, dropout and the batches"))
    add_checkpoint_flags(g, checkpoint=Flag(DEFAULT_CHECKPOINT, "checkpoint file (written "
                                                                "atomically)"),
                         checkpoint_every=Flag(250, type=positive_int), resume=False)
    add_compute_flags(g, precision="fp32", init_scale=2.0 ** 16)
    add_output_flags(g, no_progress=False)
    g = p.add_argument_group("evaluation")
    g.add_argument("--eval-size", type=positive_int, default=1000,
                   help="distinct held-out sequences for exact match")
    add_training_flags(g, eval_every=Flag(500, "greedy exact match every this many steps (0: end "
                                               "only)"))
    g.add_argument("--beam-width", type=positive_int, default=4, help="beam width k")
    g.add_argument("--length-penalty", type=length_penalty, default=0.6,
                   help="α of lp(L) = ((5+L)/6)^α")
    g.add_argument("--target", type=fraction, default=0.99,
                   help="exit status 1 if greedy exact match ends below this (0: never)")


def files(args):
    """What the run writes (``tformer.runs.declare``): ``--checkpoint`` (read first with
    ``--resume``) and ``--log``."""
    return [(updates if args.resume else writes)("--checkpoint", args.checkpoint),
            writes("--log", getattr(args, "log", None))]


def unused_flags(args):
    """Flags of a mode the command line did not choose: the loss scale of fp16, the segments of
    gradient checkpointing, the budget of bucketed or sorted batches and the pool of bucketed."""
    return [*idle("--init-scale", f"with --precision {args.precision} (the initial loss scale "
                                  f"of fp16)", args.precision != "fp16"),
            *idle("--blocks-per-segment", "without --gradient-checkpointing",
                  not args.gradient_checkpointing),
            *idle("--max-tokens", "with --batching fixed (--batch-size rows)",
                  args.batching == "fixed"),
            *idle("--pool-size", f"with --batching {args.batching} (the pool of bucketed "
                                 f"batches)", args.batching != "bucketed")]


def check_args(args):
    """The flags that must agree (ValueError naming them): ``--min-len ≤ --max-len``, ``--n-heads``
    divides an even ``--d-model``, and a ``--max-tokens`` budget holds one padded row."""
    if args.min_len > args.max_len:
        raise ValueError(f"--min-len: expected at most --max-len = {args.max_len}, got {args.min_len}")
    heads_divide(args.d_model, args.n_heads, even=True)
    vocab = 4 + args.n_symbols                     # SequenceTask: PAD, BOS, SEP, EOS and the symbols
    if args.beam_width > vocab:
        raise ValueError(f"--beam-width: expected at most the vocabulary, {vocab} tokens (4 + "
                         f"--n-symbols), got {args.beam_width}")
    row = 2 * args.max_len + 2                     # SequenceTask.seq_len: the longest model input
    if args.batching in ("bucketed", "sorted") and args.max_tokens is not None \
            and args.max_tokens < row:
        raise ValueError(f"--max-tokens: expected at least one row of 2·--max-len + 2 = {row} "
                         f"positions, got {args.max_tokens}")


def make_schedule(args):
    """lr(step) for the chosen schedule; both peak at ``args.lr`` at step ``args.warmup``."""
    if args.schedule == "noam":
        scale = args.lr * args.warmup ** 0.5

        def noam(step):
            return scale * noam_lr(step, 1, args.warmup)
        return noam

    def cosine(step):
        return cosine_with_warmup(step, args.lr, args.warmup, args.steps, 0.05 * args.lr)
    return cosine


def main(args):
    t0 = time.perf_counter()
    if args.warmup >= args.steps:
        args.warmup = max(1, args.steps // 10)
        if args.schedule == "cosine":                 # the cosine decays after it: one step at least
            args.warmup = min(args.warmup, args.steps - 1)
        print(f"--warmup must be below --steps; using {args.warmup}")
    task = SequenceTask(args.task, args.n_symbols, args.min_len, args.max_len, seed=args.seed)
    max_tokens = (default_budget(args.batching, args.batch_size, task.seq_len)
                  if args.max_tokens is None else args.max_tokens)
    if args.batching == "bucketed":
        source = BucketedTask(task, max_tokens, args.pool_size, seed=args.seed).batch
    elif args.batching == "sorted":
        source = SortedTask(task, args.batch_size, max_tokens).batch
    else:
        source = lambda i: task.batch(i, args.batch_size)                    # noqa: E731
    model = Transformer(vocab_size=task.vocab_size, d_model=args.d_model, n_heads=args.n_heads,
                        n_layers=args.n_layers, d_ff=args.d_ff, max_len=task.seq_len,
                        dropout=args.dropout, seed=args.seed, attention=args.attention,
                        gradient_checkpointing=args.gradient_checkpointing,
                        blocks_per_segment=args.blocks_per_segment)
    precision = precision_policy(model, args.precision, args.init_scale)
    opt = Adam(model, lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    start = 0
    if args.resume and os.path.exists(args.checkpoint):
        read_checkpoint_file("--checkpoint", args.checkpoint, EXPECTED_RESUME)
        try:
            meta = load_checkpoint(args.checkpoint, model, opt, precision=precision)
        except MALFORMED as e:
            raise UsageError(f"--checkpoint: expected {EXPECTED_RESUME}, got {args.checkpoint!r}: "
                             f"{str(e).removeprefix('path: ')}") from None
        start = meta["step"]
        print(f"resumed from {args.checkpoint} at step {start}")
        note = resumed_steps(meta, args.steps, args.checkpoint)
        if note:
            print(note)
    print(f"task: {args.task} sequences of {args.min_len}..{args.max_len} symbols out of "
          f"{args.n_symbols}, padded to {task.seq_len} tokens; vocabulary {task.vocab_size}")
    print(f"Transformer: C={args.d_model}, H={args.n_heads}, N={args.n_layers}, d_ff={args.d_ff}, "
          f"dropout={args.dropout}, {model.num_parameters():,} parameters; "
          f"B={args.batch_size}×{args.accum}, {args.steps} steps, {args.schedule} schedule, "
          f"peak lr {args.lr:g}, clip {args.clip:g}")
    if args.batching == "bucketed":
        print(f"bucketed batches: at most {max_tokens} padded positions each, pools of "
              f"{args.pool_size} sequences")
    elif args.batching == "sorted":
        print(f"sorted batches: each step's {args.batch_size} rows sorted by length, in "
              f"micro-batches of at most {max_tokens} padded positions")
    heldout = task.heldout(args.eval_size)
    probe = task.heldout(min(200, args.eval_size), seed=args.seed + 1)      # held out, another draw
    n_probe = sum(len(y) for _, y in probe.values())

    count = {"real": 0, "positions": 0, "rows": 0, "batches": 0, "eval_s": 0.0}
    batch = counting(source, count, PAD)

    def evaluate(m):
        t = time.perf_counter()
        out = {"greedy": task.exact_match(m, probe, "greedy")}
        count["eval_s"] += time.perf_counter() - t
        return out

    hist = train(model, opt, batch, task.forward_loss, args.steps,
                 start_step=start, accum_steps=args.accum, clip_norm=args.clip or None,
                 lr_schedule=make_schedule(args), evaluate=evaluate if args.eval_every else None,
                 eval_every=args.eval_every, checkpoint_path=args.checkpoint,
                 checkpoint_every=args.checkpoint_every, progress_bar=False if args.no_progress else None,
                 desc="transformer", precision=precision, log_path=getattr(args, "log", None))
    if precision is not None:
        print(f"{args.precision}: {len(hist['skipped'])} of {args.steps - start} steps skipped on "
              f"overflow, final loss scale {precision.loss_scale:g}")
    if count["positions"]:
        seconds = (hist["time"][-1] if hist["time"] else 0.0) - count["eval_s"]
        per_step = (f" ({count['batches'] / max(1, (args.steps - start) * args.accum):.1f} "
                    f"micro-batches per step)" if args.batching == "sorted" else "")
        print(f"{args.batching} batches: {count['rows'] / count['batches']:.1f} rows per "
              f"batch on average{per_step}, {100 * (1 - count['real'] / count['positions']):.1f}% of the "
              f"positions padding; {count['real'] / seconds:,.0f} real tokens/s "
              f"({count['positions'] / seconds:,.0f} positions/s) in {seconds:.1f} s of training")
    for step, m in hist["eval"][:-1]:
        print(f"step {step:5d}: greedy exact match {m['greedy']:.3f} ({n_probe} probe sequences)")
    if hist["loss"]:
        k = min(50, len(hist["loss"]))
        print(f"final loss (mean of the last {k} steps) {np.mean(hist['loss'][-k:]):.4f}; "
              f"largest gradient norm {np.nanmax(hist['grad_norm']):.3g}, last {hist['grad_norm'][-1]:.3g}")
    n = sum(len(y) for _, y in heldout.values())
    t1 = time.perf_counter()
    acc_g = task.exact_match(model, heldout, "greedy")
    acc_b = task.exact_match(model, heldout, "beam", args.beam_width, args.length_penalty)
    print(f"held-out exact match on {n} distinct unseen sequences: greedy {acc_g:.3f}, "
          f"beam (k={args.beam_width}, α={args.length_penalty:g}) {acc_b:.3f} "
          f"(decoding {time.perf_counter() - t1:.0f} s)")
    x, y = (a[:3] for a in heldout[max(heldout)])                     # three of the longest
    gen = task.decode(model, x)
    for xi, gi, ok in zip(x, gen, task.correct(gen, y)):
        stop = int(np.argmax(gi == EOS)) + 1 if (gi == EOS).any() else len(gi)
        print(f"  {task.show(4 + xi)}  ->  {task.show(gi[:stop])}  ({'right' if ok else 'wrong'})")
    print(f"checkpoint: {args.checkpoint}; total {time.perf_counter() - t0:.0f} s")
    if args.target and acc_g < args.target:
        print(f"greedy exact match {acc_g:.3f} is below the target {args.target:g}")
        return 1
    return 0
