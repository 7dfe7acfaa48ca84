"""Flag types and checks shared by the run commands: a bad value is argparse's usage error.

Each ``type=`` function below turns the flag's text into a number or raises
``argparse.ArgumentTypeError``, so that ``python -m tformer run transformer --min-len 0`` stops
with ``error: argument --min-len: expected an integer ≥ 1, got '0'`` (exit status 2) before
anything is built. Flags that must agree with each other are checked by the run module's
``check_args(args)``, which raises ValueError naming the flags; ``python -m tformer`` turns that
into the command's usage error too (``tformer.__main__._check_flags``). Bad input found only once
a command runs (a checkpoint that is not one) raises ``UsageError``, which ``python -m tformer``
prints the same way: the command, the flag, what was expected and what was given, exit status 2.
The flags two commands share are declared once, with these types, in ``tformer.runs.flag_groups``.
"""
import argparse
import math
import os
import sys


class UsageError(ValueError):
    """Bad input found while a command runs; its message starts with the flag it names."""


def _number(text, kind, what, ok):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text):
    """An integer ≥ 1 (sizes, counts, steps)."""
    return _number(text, int, "an integer ≥ 1", lambda v: v >= 1)


def nonnegative_int(text):
    """An integer ≥ 0 (seeds, warm-up steps, "0: off" intervals)."""
    return _number(text, int, "an integer ≥ 0", lambda v: v >= 0)


def positive_float(text):
    """A finite number > 0 (ε, a loss scale)."""
    return _number(text, float, "a finite number > 0", lambda v: math.isfinite(v) and v > 0)


def nonnegative_float(text):
    """A finite number ≥ 0 (learning rates, weight decay, clipping with 0 for off, α, targets)."""
    return _number(text, float, "a finite number ≥ 0", lambda v: math.isfinite(v) and v >= 0)


# The largest learning rate a flag takes: AdamW moves a weight by about lr a step, and at lr = 10
# a thousand steps already leave any weight a sane model holds; 1e308 makes inf at the first.
MAX_LR = 10.0


def learning_rate(text):
    """A learning rate: a finite number from 0 to ``MAX_LR``."""
    nonnegative_float(text)
    return _number(text, float, f"a finite number ≥ 0 and at most {MAX_LR:g} (a learning rate: "
                                f"AdamW moves a weight by about lr a step)",
                   lambda v: math.isfinite(v) and 0 <= v <= MAX_LR)


def positive_learning_rate(text):
    """A learning rate that trains: a finite number > 0 and at most ``MAX_LR``."""
    return _number(text, float, f"a finite number > 0 and at most {MAX_LR:g} (a learning rate: "
                                f"AdamW moves a weight by about lr a step)",
                   lambda v: math.isfinite(v) and 0 < v <= MAX_LR)


# The largest compute budget a command plans: FLOPs, years of one CPU; a larger plan is no run.
MAX_FLOPS = 1e19


def flops(text):
    """A compute budget: FLOPs > 0 and at most ``MAX_FLOPS``."""
    return _number(text, float, f"FLOPs > 0 and at most {MAX_FLOPS:g} (years of one CPU)",
                   lambda v: math.isfinite(v) and 0 < v <= MAX_FLOPS)


# AdamW's decoupled decay multiplies each weight by 1 − lr·λ a step: past 1 it flips the weights'
# signs. λ at most 10 (with the rates the book uses, lr·λ stays far below 1).
MAX_WEIGHT_DECAY = 10.0


def weight_decay(text):
    """AdamW's λ: a finite number from 0 to ``MAX_WEIGHT_DECAY``."""
    return _number(text, float, f"a finite number ≥ 0 and at most {MAX_WEIGHT_DECAY:g} (AdamW "
                                f"multiplies each weight by 1 − lr·λ a step)",
                   lambda v: math.isfinite(v) and 0 <= v <= MAX_WEIGHT_DECAY)


# Beam search's length penalty ((5 + |y|) / 6)^α: at α = 10 a hypothesis twice as long already
# weighs hundreds of times more (beyond, the length alone ranks them; at 1e308 it overflows).
MAX_LENGTH_PENALTY = 10.0


def length_penalty(text):
    """Beam search's α: a finite number from 0 to ``MAX_LENGTH_PENALTY``."""
    return _number(text, float, f"a finite number ≥ 0 and at most {MAX_LENGTH_PENALTY:g}",
                   lambda v: math.isfinite(v) and 0 <= v <= MAX_LENGTH_PENALTY)


def fraction(text):
    """A share in [0, 1] (an exact-match target)."""
    return _number(text, float, "a share in [0, 1]", lambda v: 0 <= v <= 1)


# The smallest temperature > 0: below it logits / T overflow (float32 holds 3.4e38; logits reach
# 1e3), and what is written is no longer the model's most likely text. 0 is greedy.
MIN_TEMPERATURE = 1e-30


def _temperature_ok(v):
    return math.isfinite(v) and (v == 0 or v >= MIN_TEMPERATURE)


def temperature(text):
    """A sampling temperature: 0 (greedy) or a finite number ≥ ``MIN_TEMPERATURE``."""
    nonnegative_float(text)
    return _number(text, float, f"a finite number ≥ 0: 0 (greedy) or a temperature ≥ "
                                f"{MIN_TEMPERATURE:g} (below it the logits / T overflow)",
                   _temperature_ok)


# DPO's β: the pull toward the reference; β·Δ log-ratios overflow long before 1e300.
MAX_BETA = 100.0
# LoRA's α (the adapters' scale is α / r): a scale of thousands already swamps the base weights.
MAX_LORA_ALPHA = 1e4


def dpo_beta(text):
    """DPO's β: a number > 0 and at most ``MAX_BETA``."""
    return _number(text, float, f"a number > 0 and at most {MAX_BETA:g} (β·Δ of the log-ratios "
                                f"overflows beyond)", lambda v: 0 < v <= MAX_BETA)


def lora_alpha(text):
    """LoRA's α: a number > 0 and at most ``MAX_LORA_ALPHA``."""
    return _number(text, float, f"a number > 0 and at most {MAX_LORA_ALPHA:g} (the adapters' "
                                f"scale α / r)", lambda v: 0 < v <= MAX_LORA_ALPHA)


def probability(text):
    """A drop probability p in [0, 1)."""
    return _number(text, float, "a probability in [0, 1)", lambda v: 0 <= v < 1)


def at_least_two(text):
    """An integer ≥ 2 (an alphabet)."""
    return _number(text, int, "an integer ≥ 2", lambda v: v >= 2)


def share(text):
    """A share held out, strictly between 0 and 1 (``--val-fraction``)."""
    return _number(text, float, "a share in (0, 1)", lambda v: 0 < v < 1)


def top_p(text):
    """The mass p of the nucleus: a number in (0, 1] (1 keeps every token)."""
    return _number(text, float, "a probability mass in (0, 1]", lambda v: 0 < v <= 1)


def min_p(text):
    """min-p's fraction of the largest probability: a number in [0, 1] (0 keeps every token)."""
    return _number(text, float, "a fraction of the largest probability in [0, 1]",
                   lambda v: 0 <= v <= 1)


# The most tokens one command writes in one go: the sequence it holds (int64 ids, and the text
# it prints) stays in the megabytes.
MAX_NEW_TOKENS = 1_000_000


def new_tokens(text):
    """Tokens to generate: an integer from 0 to ``MAX_NEW_TOKENS``."""
    return _number(text, int, f"an integer ≥ 0 and at most {MAX_NEW_TOKENS:,} (the tokens a "
                              f"command holds in memory and prints at once)",
                   lambda v: 0 <= v <= MAX_NEW_TOKENS)


# The most steps a tuning run takes: the order of the preference pairs is drawn for every step
# before the first.
MAX_TUNING_STEPS = 1_000_000


def tuning_steps(text):
    """``finetune --steps``: an integer from 2 (a warm-up step, then the schedule) to
    ``MAX_TUNING_STEPS``."""
    return _number(text, int, f"an integer ≥ 2 (a warm-up step, then the schedule) and at most "
                              f"{MAX_TUNING_STEPS:,} (the order of the pairs is drawn for every "
                              f"step before the first)", lambda v: 2 <= v <= MAX_TUNING_STEPS)


def bpe_vocab(text):
    """``--bpe V``: at least the 256 bytes and one merge."""
    return _number(text, int, "a vocabulary of at least 256 tokens (the bytes) and one merge, "
                              "V ≥ 257", lambda v: v >= 257)


def vocab_sizes(text):
    """An entry of ``--vocab-sizes``: 256 (the bytes, no merge) or more."""
    return _number(text, int, "sizes ≥ 256 (the 256 bytes)", lambda v: v >= 256)


def utf8_text(text):
    """Text that has a UTF-8 encoding (bytes of the command line that are not UTF-8 reach Python
    as lone surrogates: refused)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"expected UTF-8 text, got a byte that is not UTF-8 at "
                                         f"character {e.start} of {text!r}") from None
    return text


def temperatures(text):
    """Comma-separated sampling temperatures, each a finite number ≥ 0 (an empty list: no
    samples); returns the list of floats."""
    out = []
    for part in (t.strip() for t in text.split(",")):
        if part:
            out.append(_number(part, float, f"comma-separated finite numbers ≥ 0 (in {text!r}), "
                                            f"each 0 (greedy) or ≥ {MIN_TEMPERATURE:g}",
                               _temperature_ok))
    return out


# The most numbers one activation of the small systems' runs may hold (B·T·C, B·T·T): 2^28, a
# GiB of float32; more is a run no one meant on these tasks.
MAX_ACTIVATION = 2 ** 28


def activation_fits(flags, sizes):
    """``check_flags`` helper: ValueError naming ``flags`` if the product of ``sizes`` (an
    activation's shape) exceeds ``MAX_ACTIVATION`` numbers."""
    n = math.prod(sizes)
    if n > MAX_ACTIVATION:
        raise ValueError(f"{flags}: expected an activation of at most {MAX_ACTIVATION:,} numbers "
                         f"(a GiB of float32), got {' × '.join(map(str, sizes))} = {n:,}")


def heads_divide(d_model, n_heads, d_flag="--d-model", h_flag="--n-heads", even=False):
    """``check_args`` helper: H divides C (and C/H, the sin/cos pairs of C, is even when asked)."""
    if d_model % n_heads:
        raise ValueError(f"{h_flag}: must divide {d_flag} = {d_model}, got {n_heads}")
    if even and d_model % 2:
        raise ValueError(f"{d_flag}: expected an even width (sinusoidal positions come in sin/cos "
                         f"pairs), got {d_model}")


def idle(flags, mode, when=True):
    """``unused_flags`` helper: ``[(flag, mode, when)]`` for each of ``flags`` (one or a list):
    when ``when`` holds, the flag does nothing ``mode`` ("with greedy decoding (--temperature
    0)"). Every flag is listed whatever ``when`` is (a test checks that the command has it)."""
    return [(f, mode, bool(when)) for f in ([flags] if isinstance(flags, str) else flags)]


def unused_error(flag, mode, value):
    """The usage error of ``flag`` given with ``value`` where it does nothing (``mode``)."""
    if value is True:
        got = flag
    elif isinstance(value, (list, tuple)):
        got = f"{flag} {' '.join(map(str, value))}"
    else:
        got = f"{flag} {value}"
    return ValueError(f"{flag}: does nothing {mode}; expected no {flag} with it, got {got}")


class Deprecated(argparse.Action):
    """An old spelling of a flag, kept for one release: it stores into the new flag's ``dest``
    and prints one line naming the new spelling (``add_argument("--layers", dest="n_layers",
    action=Deprecated, new="--n-layers", type=positive_int)``)."""

    def __init__(self, option_strings, dest, new, note="", **kwargs):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.new, self.note = new, note

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is the old spelling of {self.new} and goes in the "
              f"next release; use {self.new}{self.note}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def text_file(path, block_size, val_fraction, flag="--text"):
    """``check_args`` helper: ``path`` is a readable file whose train and validation splits
    (``tformer.data.text.split_sizes``) each hold a window of ``block_size`` + 2 bytes."""
    from tformer.data.text import split_sizes
    if not os.path.isfile(path):
        why = "a folder" if os.path.isdir(path) else "no such file"
        raise ValueError(f"{flag}: expected a readable file, got {path!r} ({why})")
    try:
        open(path, "rb").close()
    except OSError as e:
        raise ValueError(f"{flag}: expected a readable file, got {path!r} ({e.strerror})") from None
    need, size = block_size + 2, os.path.getsize(path)
    if min(split_sizes(size, val_fraction)) >= need:
        return
    least = max(need, math.ceil((need - 1.5) / val_fraction) - 2)
    while min(split_sizes(least, val_fraction)) < need:
        least += 1
    raise ValueError(f"{flag}: expected a file of at least {least:,} bytes (its train and "
                     f"validation splits, --val-fraction {val_fraction:g}, each hold --max-len + 2 "
                     f"= {need} bytes), got {path!r} of {size:,} bytes")


def json_object_file(flag, path, what):
    """``check_args`` helper: ``path``, if it exists, reads as a JSON object (a result file a
    command completes: checked before the work, not found malformed after it)."""
    import json
    if not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{flag}: expected {what} (it is completed, not replaced), got {path!r}, "
                         f"which does not read as JSON ({' '.join(str(e).split())[:100]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{flag}: expected {what} (a JSON object), got {path!r} holding a "
                         f"{type(data).__name__}")


def resumed_steps(meta, steps, path):
    """``--resume`` against ``--steps``: a ``UsageError`` if the checkpoint is past ``steps``; a
    one-line note if the run was started with another ``--steps`` (None if not, or unknown)."""
    start, before = meta["step"], (meta.get("extra") or {}).get("steps")
    if start > steps:
        raise UsageError(f"--steps: expected at least the step of the checkpoint {path!r}, "
                         f"{start}, got {steps}")
    if before is None or before == steps:
        return None
    return (f"--resume: the run was started with --steps {before}: steps {start + 1}..{steps} "
            f"follow the learning-rate schedule of a {steps}-step run (steps 1..{start} followed "
            f"the {before}-step one), so the result differs from a run started with --steps {steps}")
