"""Flag types and checks shared by the run commands: a bad value is argparse's usage error.

Each ``type=`` function below turns the flag's text into a number or raises
``argparse.ArgumentTypeError``, so that ``python -m tformer run transformer --min-len 0`` stops
with ``error: argument --min-len: expected an integer ≥ 1, got '0'`` (exit status 2) before
anything is built. Flags that must agree with each other are checked by the run module's
``check_args(args)``, which raises ValueError naming the flags; ``python -m tformer`` turns that
into the command's usage error too (``tformer.__main__._check_flags``).
"""
import argparse
import math


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


def probability(text):
    """A drop probability p in [0, 1)."""
    return _number(text, float, "a probability in [0, 1)", lambda v: 0 <= v < 1)


def at_least_two(text):
    """An integer ≥ 2 (an alphabet)."""
    return _number(text, int, "an integer ≥ 2", lambda v: v >= 2)


def heads_divide(d_model, n_heads, d_flag="--d-model", h_flag="--n-heads", even=False):
    """``check_args`` helper: H divides C (and C/H, the sin/cos pairs of C, is even when asked)."""
    if d_model % n_heads:
        raise ValueError(f"{h_flag}: must divide {d_flag} = {d_model}, got {n_heads}")
    if even and d_model % 2:
        raise ValueError(f"{d_flag}: expected an even width (sinusoidal positions come in sin/cos "
                         f"pairs), got {d_model}")
