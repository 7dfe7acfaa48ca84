"""Learning-rate schedules: plain functions of the step number, and a helper that applies one.

Steps count from 1, as the optimizers' bias corrections do: the first call to ``opt.step()`` is
step 1 (``opt.t == 1`` after it). Both schedules are pure functions of ``step``, so a resumed
run needs nothing but the step counter to continue its schedule.

- :func:`noam_lr` is the warmup schedule of the "complete Transformer" guide,
  ``min(step**-0.5, step * warmup**-1.5)``, times ``d_model**-0.5`` as in the original paper.
- :func:`cosine_with_warmup` is linear warmup to ``max_lr`` followed by half a cosine down to
  ``min_lr``.
- :func:`trapezoid` is linear warmup, a constant rate, and a linear cool-down to 0 over the last
  ``cooldown`` steps (modded-nanogpt's and nanochat's shape; ``cooldown = total − warmup`` is a
  straight line from the peak to 0).
- :class:`LRScheduler` sets ``opt.lr`` from any such function before each step.
"""

import math

__all__ = ["noam_lr", "cosine_with_warmup", "trapezoid", "LRScheduler"]


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def noam_lr(step, d_model, warmup):
    r"""lr(step) = d_model^{-1/2} · min(step^{-1/2}, step · warmup^{-3/2}).

    Rises linearly for ``step < warmup``, peaks at ``step == warmup`` with value
    ``(d_model · warmup)^{-1/2}``, then decays as ``step^{-1/2}``.

    step: int >= 1 (the 1-based number of the optimizer step about to be taken);
    d_model: int >= 1; warmup: int >= 1. Returns a Python float (an absolute learning rate).

    The usual PyTorch form passes ``lambda step: min(step**-0.5, step*warmup**-1.5)`` to
    ``LambdaLR`` as a *multiplier* of the base lr; ``noam_lr(step, 1, warmup)`` is exactly that
    multiplier. Step 0 is not defined (``0**-0.5`` is infinite) and raises ``ValueError``: note that
    ``LambdaLR`` evaluates its lambda at step 0 when it is constructed, so that lambda as written
    stops with ``ZeroDivisionError`` there (the auditing appendix shows it); counting steps from 1
    avoids that.
    """
    step = _check_int("step", step, 1)
    d_model = _check_int("d_model", d_model, 1)
    warmup = _check_int("warmup", warmup, 1)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def cosine_with_warmup(step, max_lr, warmup, total, min_lr=0.0):
    r"""Linear warmup, then cosine decay::

        lr(s) = max_lr · s / warmup                                    for 0 <= s < warmup
        lr(s) = min_lr + ½(max_lr − min_lr)(1 + cos(π (s − warmup) / (total − warmup)))
                                                                       for warmup <= s <= total
        lr(s) = min_lr                                                 for s > total

    so lr(0) = 0, lr(warmup) = max_lr, lr(total) = min_lr. With ``warmup == 0`` there is no ramp.

    step: int >= 0; max_lr >= min_lr >= 0 (floats); warmup: int >= 0; total: int > warmup.
    Returns a Python float. Called with the 1-based step about to be taken, the first update
    uses ``max_lr / warmup`` (never a wasted step at lr 0).
    """
    step = _check_int("step", step, 0)
    warmup = _check_int("warmup", warmup, 0)
    total = _check_int("total", total, 0)
    if total <= warmup:
        raise ValueError(f"total must be > warmup, got total={total}, warmup={warmup}")
    max_lr, min_lr = float(max_lr), float(min_lr)
    if not (math.isfinite(min_lr) and min_lr >= 0.0):
        raise ValueError(f"min_lr must be finite and >= 0, got {min_lr}")
    if not (math.isfinite(max_lr) and max_lr >= min_lr):
        raise ValueError(f"max_lr must be finite and >= min_lr={min_lr}, got {max_lr}")
    if step < warmup:
        return max_lr * step / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)  # in [0, 1)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def trapezoid(step, max_lr, warmup, total, cooldown):
    r"""Linear warmup, constant, then a linear cool-down to zero::

        lr(s) = max_lr · s / warmup                           for 0 <= s < warmup
        lr(s) = max_lr                                        for warmup <= s <= total − cooldown
        lr(s) = max_lr · (total − s) / cooldown               for total − cooldown < s <= total
        lr(s) = 0                                             for s > total

    so lr(total) = 0: the last step is taken at max_lr / cooldown. With ``warmup == 0`` there is
    no ramp; ``cooldown == total − warmup`` decays straight from the peak.

    step: int >= 0; max_lr >= 0; warmup >= 0, cooldown >= 1 (ints), warmup + cooldown <= total.
    Called with the 1-based step about to be taken, as :func:`cosine_with_warmup`.
    """
    step = _check_int("step", step, 0)
    warmup = _check_int("warmup", warmup, 0)
    total = _check_int("total", total, 1)
    cooldown = _check_int("cooldown", cooldown, 1)
    if warmup + cooldown > total:
        raise ValueError(f"warmup + cooldown must be <= total, got warmup={warmup}, "
                         f"cooldown={cooldown}, total={total}")
    max_lr = float(max_lr)
    if not (math.isfinite(max_lr) and max_lr >= 0.0):
        raise ValueError(f"max_lr must be finite and >= 0, got {max_lr}")
    if step < warmup:
        return max_lr * step / warmup
    if step >= total:
        return 0.0
    return max_lr * min(1.0, (total - step) / cooldown)


class LRScheduler:
    """Sets ``opt.lr = lr_fn(opt.t + 1)``: the learning rate of the step about to be taken.

    ``lr_fn`` maps a 1-based step number to an absolute learning rate, e.g.
    ``lambda s: noam_lr(s, d_model=512, warmup=4000)`` or
    ``lambda s: base_lr * noam_lr(s, 1, 4000)`` (the guide's multiplier form).

    The schedule is read from the optimizer's own counter ``opt.t``, so the scheduler holds no
    state of its own: it is resumed by restoring the optimizer, and ``step()`` may be called before
    ``opt.step()`` or after it (PyTorch's order); both give every optimizer step the lr of its
    number. The constructor already sets the lr of the next step.
    """

    def __init__(self, opt, lr_fn):
        if not callable(lr_fn):
            raise TypeError(f"lr_fn must be callable, got {type(lr_fn).__name__}")
        self.opt = opt
        self.lr_fn = lr_fn
        self.step()

    def step(self):
        """Set and return the lr for optimizer step ``opt.t + 1``."""
        self.opt.lr = self.lr_fn(self.opt.t + 1)
        return self.opt.lr

    @property
    def lr(self):
        return self.opt.lr
