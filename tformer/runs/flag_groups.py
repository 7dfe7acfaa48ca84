"""Every flag two commands share, declared once, in groups a command adds with its own defaults.

``add_training_flags(g, steps=500, lr=Flag(3e-3, "peak learning rate α"))`` declares ``--steps``
and ``--lr`` on the parser (or argument group) ``g``. A keyword given is a flag the command takes,
with that default, or with the default, help and metavar of a ``Flag``; a keyword left out is a
flag the command does not take. A group function may be called several times with other
keywords, to put flags in several sections of one ``--help``.

Each flag's name, type (its range at parse time, ``tformer.runs.flags``), action, nargs and usual
help are written here alone; ``tests/house/test_flags_once.py`` counts every flag string passed to
``add_argument`` in the package and fails on a second declaration. A flag whose commands need
different ranges lists the other ones here (``other_ranges``), and a command picks one with
``Flag(type=...)``: ``--eval-every`` of a run whose curves need evaluations is ≥ 1, of the others
≥ 0 (0: at the end only).
"""
from typing import NamedTuple

from tformer.runs import flags
from tformer.training.precision import PRECISIONS

ABSENT = object()       # a keyword left out: the command does not take the flag
REQUIRED = object()     # a default that says the flag must be given (``out=REQUIRED``)


class Flag(NamedTuple):
    """One command's default of a shared flag, and, where the command says more, its help, its
    metavar, or one of the flag's other ranges."""
    default: object
    help: str = None
    metavar: str = None
    type: object = None


def _spec(given, help, type=None, other_ranges=(), metavar=None):
    """``add_argument``'s keywords for a flag ``given`` as a default or as a ``Flag``: its usual
    ``help``, ``type`` and ``metavar`` unless the ``Flag`` says otherwise (a ``type`` only among
    ``other_ranges``)."""
    flag = given if isinstance(given, Flag) else Flag(given)
    if flag.type is not None and flag.type not in other_ranges:
        raise TypeError(f"type: expected one of the flag's ranges {other_ranges}, got {flag.type}")
    kwargs = {"help": flag.help or help}
    if flag.default is REQUIRED:
        kwargs["required"] = True
    else:
        kwargs["default"] = flag.default
    if flag.type or type:
        kwargs["type"] = flag.type or type
    if flag.metavar or metavar:
        kwargs["metavar"] = flag.metavar or metavar
    return kwargs


def _switch(given, help):
    """``add_argument``'s keywords for an on/off flag (``store_true``, default False)."""
    flag = given if isinstance(given, Flag) else Flag(given)
    if flag.default is not False:
        raise ValueError(f"default: an on/off flag is off by default, got {flag.default!r}")
    return {"action": "store_true", "help": flag.help or help}


def add_model_flags(p, *, d_model=ABSENT, n_heads=ABSENT, n_layers=ABSENT, max_len=ABSENT,
                    seq_len=ABSENT, d_ff=ABSENT, n_kv_heads=ABSENT):
    """The model's sizes: C, H, N, T (a context, or the positions of a fixed-length task), d_ff."""
    if d_model is not ABSENT:
        p.add_argument("--d-model", **_spec(d_model, "width C", flags.positive_int))
    if n_heads is not ABSENT:
        p.add_argument("--n-heads", **_spec(n_heads, "attention heads H", flags.positive_int))
    if n_layers is not ABSENT:
        p.add_argument("--n-layers", **_spec(n_layers, "blocks", flags.positive_int))
    if max_len is not ABSENT:
        p.add_argument("--max-len", **_spec(max_len, "context length T", flags.positive_int))
    if seq_len is not ABSENT:
        p.add_argument("--seq-len", **_spec(seq_len, "positions per sequence, T",
                                            flags.positive_int))
    if d_ff is not ABSENT:
        p.add_argument("--d-ff", **_spec(d_ff, "hidden width of the MLP", flags.positive_int))
    if n_kv_heads is not ABSENT:
        p.add_argument("--n-kv-heads", **_spec(n_kv_heads, "key/value heads of grouped-query "
                                                           "attention", flags.positive_int))


def add_compute_flags(p, *, attention=ABSENT, gradient_checkpointing=ABSENT,
                      blocks_per_segment=ABSENT, precision=ABSENT, init_scale=ABSENT):
    """How a step is computed: the attention kernel, recomputation in the backward, precision."""
    if attention is not ABSENT:
        p.add_argument("--attention", choices=["plain", "flash"],
                       **_spec(attention, "attention kernel: plain (stores the T×T "
                                          "probabilities) or flash (the online softmax)"))
    if gradient_checkpointing is not ABSENT:
        p.add_argument("--gradient-checkpointing",
                       **_switch(gradient_checkpointing, "keep only each segment's input and "
                                                         "recompute its forward in the backward"))
    if blocks_per_segment is not ABSENT:
        p.add_argument("--blocks-per-segment",
                       **_spec(blocks_per_segment, "with --gradient-checkpointing: blocks "
                                                   "recomputed together (k)", flags.positive_int))
    if precision is not ABSENT:
        p.add_argument("--precision", choices=sorted(PRECISIONS),
                       **_spec(precision, "compute in float32, or in float16/bfloat16 with "
                                          "float32 master weights"))
    if init_scale is not ABSENT:
        p.add_argument("--init-scale", **_spec(init_scale, "fp16: initial loss scale S of the "
                                                           "dynamic loss scaler",
                                               flags.positive_float))


def add_training_flags(p, *, steps=ABSENT, batch_size=ABSENT, lr=ABSENT, min_lr=ABSENT,
                       warmup=ABSENT, weight_decay=ABSENT, clip=ABSENT, eval_every=ABSENT,
                       eval_windows=ABSENT, seed=ABSENT, seeds=ABSENT):
    """The optimizer's steps, batch and schedule, the evaluations, the seeds."""
    if steps is not ABSENT:
        p.add_argument("--steps", **_spec(steps, "optimizer steps", flags.positive_int,
                                          other_ranges=(flags.tuning_steps,)))
    if batch_size is not ABSENT:
        p.add_argument("--batch-size", **_spec(batch_size, "windows per step B",
                                               flags.positive_int))
    if lr is not ABSENT:
        p.add_argument("--lr", **_spec(lr, "peak learning rate", flags.learning_rate,
                                       other_ranges=(flags.positive_learning_rate,)))
    if min_lr is not ABSENT:
        p.add_argument("--min-lr", **_spec(min_lr, "learning rate at the end of the cosine",
                                           flags.learning_rate))
    if warmup is not ABSENT:
        p.add_argument("--warmup", **_spec(warmup, "linear warm-up steps", flags.nonnegative_int))
    if weight_decay is not ABSENT:
        p.add_argument("--weight-decay", **_spec(weight_decay, "λ of AdamW's decoupled decay",
                                                 flags.weight_decay))
    if clip is not ABSENT:
        p.add_argument("--clip", **_spec(clip, "global gradient-norm clip (0: off)",
                                         flags.nonnegative_float))
    if eval_every is not ABSENT:
        p.add_argument("--eval-every", **_spec(eval_every, "evaluate every this many steps",
                                               flags.nonnegative_int,
                                               other_ranges=(flags.positive_int,)))
    if eval_windows is not ABSENT:
        p.add_argument("--eval-windows", **_spec(eval_windows, "windows of each evaluation",
                                                 flags.positive_int))
    if seed is not ABSENT:
        p.add_argument("--seed", **_spec(seed, "seed", flags.nonnegative_int))
    if seeds is not ABSENT:
        p.add_argument("--seeds", nargs="+", **_spec(seeds, "one run per seed",
                                                     flags.nonnegative_int))


def add_checkpoint_flags(p, *, checkpoint=ABSENT, checkpoint_every=ABSENT, resume=ABSENT):
    """What a run saves, how often, and whether it continues."""
    if checkpoint is not ABSENT:
        p.add_argument("--checkpoint", **_spec(checkpoint, "the checkpoint file"))
    if checkpoint_every is not ABSENT:
        p.add_argument("--checkpoint-every",
                       **_spec(checkpoint_every, "write the checkpoint every this many steps",
                               flags.nonnegative_int,
                               other_ranges=(flags.positive_int,)))
    if resume is not ABSENT:
        p.add_argument("--resume", **_switch(resume, "continue from --checkpoint if it exists"))


def add_data_flags(p, *, text=ABSENT, val_fraction=ABSENT, tokenizer=ABSENT, vocab_sizes=ABSENT,
                   pool_size=ABSENT):
    """The text, its held-out split, its tokens, and the batches of sequences."""
    if text is not ABSENT:
        p.add_argument("--text", **_spec(text, "train on this file", metavar="FILE"))
    if val_fraction is not ABSENT:
        p.add_argument("--val-fraction", **_spec(val_fraction, "held-out tail of each document",
                                                 flags.share, other_ranges=(flags.probability,)))
    if tokenizer is not ABSENT:
        p.add_argument("--tokenizer", **_spec(tokenizer, "a BPE tokenizer file (JSON)",
                                              metavar="FILE"))
    if vocab_sizes is not ABSENT:
        p.add_argument("--vocab-sizes", nargs="+",
                       **_spec(vocab_sizes, "vocabulary sizes V (256: bytes, no merge)",
                               flags.vocab_sizes, other_ranges=(flags.positive_int,)))
    if pool_size is not ABSENT:
        p.add_argument("--pool-size", **_spec(pool_size, "bucketed batches: sequences sorted by "
                                                         "length together", flags.positive_int))


def add_sampling_flags(p, *, prompt=ABSENT, gen_tokens=ABSENT):
    """What a model is asked to continue, and how much it writes to be timed."""
    if prompt is not ABSENT:
        p.add_argument("--prompt", **_spec(prompt, "text to continue", flags.utf8_text))
    if gen_tokens is not ABSENT:
        p.add_argument("--gen-tokens", **_spec(gen_tokens, "tokens generated to time generation",
                                               flags.new_tokens))


def add_lora_flags(p, *, lora=ABSENT, lora_alpha=ABSENT, lora_targets=ABSENT, adapter=ABSENT):
    """LoRA's rank, scale and layers, and the adapter file."""
    if lora is not ABSENT:
        p.add_argument("--lora", **_spec(lora, "train rank-R LoRA adapters alone",
                                         flags.positive_int, metavar="R"))
    if lora_alpha is not ABSENT:
        p.add_argument("--lora-alpha", **_spec(lora_alpha, "α of the adapters' scale s = α / R",
                                               flags.lora_alpha))
    if lora_targets is not ABSENT:
        p.add_argument("--lora-targets", **_spec(lora_targets, "comma-separated layer names: "
                                                               "qkv, o, fc1, fc2, lm_head, or "
                                                               "the groups attn, mlp, all"))
    if adapter is not ABSENT:
        p.add_argument("--adapter", **_spec(adapter, "a LoRA adapter file", metavar="FILE"))


def add_timing_flags(p, *, rounds=ABSENT, time_rounds=ABSENT, reps=ABSENT, repeats=ABSENT):
    """How often a measurement is repeated (rounds interleave the things compared)."""
    if rounds is not ABSENT:
        p.add_argument("--rounds", **_spec(rounds, "interleaved timing rounds",
                                           flags.positive_int))
    if time_rounds is not ABSENT:
        p.add_argument("--time-rounds", **_spec(time_rounds, "interleaved rounds of the timing",
                                                flags.positive_int))
    if reps is not ABSENT:
        p.add_argument("--reps", **_spec(reps, "timed repetitions", flags.positive_int))
    if repeats is not ABSENT:
        p.add_argument("--repeats", **_spec(repeats, "interleaved rounds", flags.positive_int))


def add_output_flags(p, *, out=ABSENT, parts=ABSENT, no_progress=ABSENT, no_torch=ABSENT):
    """What a command writes and shows: ``--out``, the parts of an experiment it runs (the
    default: all; ``--out`` keeps the others), progress, the PyTorch side."""
    if out is not ABSENT:
        p.add_argument("--out", **_spec(out, "the JSON file to write"))
    if parts is not ABSENT:
        every = list(parts.default if isinstance(parts, Flag) else parts)
        p.add_argument("--parts", nargs="+", choices=every,
                       **_spec(parts, "the parts to measure"))
    if no_progress is not ABSENT:
        p.add_argument("--no-progress", **_switch(no_progress, "no progress bar"))
    if no_torch is not ABSENT:
        p.add_argument("--no-torch", **_switch(no_torch, "skip the PyTorch side"))


def add_experiment_flags(p, *, quick=ABSENT):
    """How much of an experiment runs: ``--quick``, a smoke run of every part at small sizes."""
    if quick is not ABSENT:
        p.add_argument("--quick", **_switch(quick, "a smoke run: every part at small sizes "
                                                   "(minutes; its numbers are not the chapter's)"))
