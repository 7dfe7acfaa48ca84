"""The one training loop: accumulation, clipping, schedules, evaluation, checkpoints, NaN guard.

Every system of the book trains through ``train``. What differs between them is passed in:
``batch(step) -> batch`` (a pure function of the step, so a resumed run sees the same data) and
``forward_loss(model, batch) -> (loss, dout)``, which runs the forward pass and the loss and
returns the gradient of the loss with respect to the model's output. ``train`` then calls
``model.backward(dout / accum_steps)`` for each micro-batch and ``optimizer.step()``.

With ``precision=`` (a ``tformer.training.precision.MixedPrecision``) one step is: backward of every
micro-batch from S · dout in the model's low precision → (all-reduce, with ``data_parallel``) →
unscale and check for inf/NaN (an overflow skips the step and halves S) → global norm and
clipping → update of the float32 masters → refresh of the low-precision copies.
"""
import math
import os
import time

import numpy as np

from tformer.training.checkpoint import save_checkpoint
from tformer.nn.layers import Module
from tformer.training.optim import clip_grad_norm
from tformer.core.progress import progress
from tformer.training.runlog import write_history
from tformer.training.batch_threads import BatchCut

NO_CLIP = float(np.finfo(np.float64).max)


class NonFiniteLossError(FloatingPointError):
    """Raised when the loss (or the gradient norm) stops being finite; names the step and the last good checkpoint."""


def train(model, optimizer, batch, forward_loss, steps, *, start_step=0, accum_steps=1,
          clip_norm=None, lr_schedule=None, evaluate=None, eval_every=0, checkpoint_path=None,
          checkpoint_every=0, config=None, progress_bar=None, desc="train", log_every=1,
          data_parallel=None, precision=None, log_path=None, checkpoint_extra=None):
    """Train ``model`` for steps ``start_step+1 .. steps``; returns the history dict.

    - ``accum_steps = k``: the gradient of one update is the mean over ``k`` micro-batches
      ``batch((step − 1)·k + i)``, which equals one batch ``k`` times larger when the loss is a mean.
    - ``batch(i)`` may also return a list of micro-batches, each a dict with a ``"weight"`` w_j:
      they run forward and backward in turn, the loss is Σ_j w_j·L_j and each backward starts
      from w_j·dout_j (``tformer.data.batching.SortedTask``: one batch cut by length, w_j its
      share of the counted tokens, so the gradient is the whole batch's).
    - ``clip_norm``: gradients are scaled so that their global norm is at most this; the norm
      before clipping is logged as ``grad_norm`` either way.
    - ``lr_schedule(step) -> lr`` sets ``optimizer.lr`` before each update.
    - ``evaluate(model) -> dict`` runs every ``eval_every`` steps and at the end (model in eval
      mode for the call, back to train mode after).
    - ``checkpoint_path``: written atomically every ``checkpoint_every`` steps and at the end;
      its ``extra`` holds ``steps``, the length of the schedule (``--resume`` compares it), and
      ``checkpoint_extra`` (a dict: what the run records with it, e.g. its tokenizer).
    - A non-finite loss or gradient norm raises ``NonFiniteLossError`` before the update, so the
      parameters and the last checkpoint on disk stay those of the last good step.
    - ``data_parallel`` (a ``tformer.training.mpi.DataParallel``; ``batch`` then gives this rank's
      slice): after the backward passes the gradient and the loss are averaged over the ranks, and
      the NaN guard, the norm and clipping act on the averaged values, the same on every rank.
    - ``precision``: mixed precision (see the module docstring); the checkpoints also store its
      loss-scaler state, so a resumed run continues the same schedule of S.
    - ``log_path``: the history is written there (``tformer.training.runlog``: CSV or JSON lines,
      atomically) with every checkpoint and at the end.

    History: lists ``step``, ``loss``, ``lr``, ``grad_norm`` (‖g‖ before clipping), ``clip_ratio``
    (min(1, clip_norm / ‖g‖): the factor the gradient was scaled by, 1 when not clipped), ``time``,
    and ``eval`` (a list of
    ``(step, metrics)`` pairs); with ``precision`` also ``loss_scale`` (S of each logged step) and
    ``skipped`` (the steps skipped on overflow; their ``grad_norm`` is NaN).
    """
    mp, dp, hist, net = _setup(model, accum_steps, steps, start_step, precision, data_parallel)
    last_good, t0 = None, time.perf_counter()
    bar = progress(range(start_step + 1, steps + 1), enabled=progress_bar, desc=desc)
    for step in bar:
        if lr_schedule is not None:
            optimizer.lr = lr_schedule(step)
        scale = mp.loss_scale
        loss, cause = accumulate_gradients(model, batch, forward_loss, step, accum_steps, mp, dp,
                                           net)
        _stop_unless_finite(loss, "the loss", step, last_good, cause)
        norm = _update(model, optimizer, clip_norm, mp, dp, hist, step, last_good)
        if step % log_every == 0 or step == steps:
            _record(hist, step, loss, optimizer, norm, clip_norm, time.perf_counter() - t0, scale)
        if evaluate is not None and ((eval_every and step % eval_every == 0) or step == steps):
            _evaluate(model, evaluate, hist, step)
        if step == steps or (checkpoint_path and checkpoint_every and step % checkpoint_every == 0):
            last_good = _save(model, optimizer, config, step, steps, dp, precision, hist,
                              checkpoint_path, log_path, checkpoint_extra) or last_good
        _show(bar, loss, norm)
    return hist


def _setup(model, accum_steps, steps, start_step, precision, data_parallel):
    """``train``'s arguments checked and the model in training mode; returns its precision
    policy, its data-parallel policy (each doing nothing when not given), an empty history and
    what runs the passes (``_runner``)."""
    _check_args(accum_steps, steps, start_step, precision, data_parallel)
    mp = precision if precision is not None else FULL_PRECISION
    dp = data_parallel if data_parallel is not None else ONE_PROCESS
    mp.refresh()                                   # the copies follow the masters (e.g. just loaded)
    model.train()
    return mp, dp, _new_history(precision is not None), _runner(model)


def _update(model, optimizer, clip_norm, mp, dp, hist, step, last_good):
    """Unscale the gradients (mixed precision), clip them and update the parameters; returns the
    norm ‖g‖ before clipping, NaN for a step skipped on a float16 overflow (S halved)."""
    if not _unscale(mp, step, last_good):
        hist["skipped"].append(step)
        return float("nan")
    norm = dp.clip_grad_norm(model, clip_norm or NO_CLIP)
    _stop_unless_finite(norm, "the gradient norm", step, last_good)
    optimizer.step()
    mp.refresh()                                   # masters → low-precision copies
    return norm


def _evaluate(model, evaluate, hist, step):
    """``evaluate(model)`` in eval mode, recorded as ``(step, metrics)``; back to train mode."""
    model.eval()
    hist["eval"].append((step, evaluate(model)))
    model.train()


def _save(model, optimizer, config, step, steps, dp, precision, hist, checkpoint_path, log_path,
          checkpoint_extra=None):
    """The checkpoint (its ``extra`` holds ``steps`` and ``checkpoint_extra``) and the history,
    where asked; returns the checkpoint's path, or None if none was written."""
    saved = None
    if checkpoint_path:
        dp.save_checkpoint(checkpoint_path, model, optimizer, config, step,
                           extra={**(checkpoint_extra or {}), "steps": steps}, precision=precision)
        saved = os.fspath(checkpoint_path)
    if log_path:
        write_history(log_path, hist)
    return saved


def _show(bar, loss, norm):
    """The loss and gradient norm on the progress bar, if there is one."""
    if hasattr(bar, "set_postfix") and not bar.disable:
        bar.set_postfix(loss=f"{loss:.4g}", gnorm=f"{norm:.3g}", refresh=False)


def _runner(model):
    """What runs the forward and backward passes: the model (or, under a view of its trainable
    part such as LoRA's ``Adapters``, the model it views) with each batch cut across threads where
    that pays (``tformer.training.batch_threads.BatchCut``)."""
    inner = model if isinstance(model, Module) else getattr(model, "model", None)
    return BatchCut(inner) if isinstance(inner, Module) else model


def accumulate_gradients(model, batch, forward_loss, step, accum_steps, mp, dp, net=None):
    """The step's loss L = (1/k) Σ_i Σ_j w_j L_ij over its k micro-batches (each batch possibly cut
    into weighted parts j), and ∂L/∂θ accumulated into the model's gradients: each backward pass
    starts from w_j · dout / k (times S with mixed precision). With several processes the gradient
    and the loss are then averaged over the ranks. Returns ``(loss, cause)``: ``cause`` is the
    error of a loss kernel that refused inf/NaN input (the loss is then NaN), else None. ``net``
    (default ``model``) runs the forward and backward passes."""
    net = model if net is None else net
    model.zero_grad()
    loss, cause = 0.0, None
    for i in range(accum_steps):
        for w, b in micro_batches(batch((step - 1) * accum_steps + i)):
            try:
                l, dout = forward_loss(net, b)
            except FloatingPointError as e:        # a loss kernel refusing inf/NaN input
                l, cause = float("nan"), e
            loss += w * l / accum_steps
            if not math.isfinite(loss):
                if dp is ONE_PROCESS:
                    return loss, cause
                continue                           # the other ranks wait for this one's gradient
            dout = dout / accum_steps if accum_steps > 1 else dout
            dout = dout * w if w != 1.0 else dout
            mp.backward(net, dout)                 # from S · dout, in the low precision if mixed
    return dp.reduce_gradients(model, loss), cause       # g ← (1/p) Σ_r g_r, and the mean loss


class _FullPrecision:
    """What ``train`` asks of a precision policy, for float32/float64 training: no loss scale,
    no low-precision copies, no step to skip (``tformer.training.precision.MixedPrecision`` is the
    other policy)."""
    loss_scale = 1.0

    def backward(self, model, dout):
        return model.backward(dout)

    def unscale_(self):
        return True

    def refresh(self):
        pass


class _OneProcess:
    """What ``train`` asks of data parallelism, for one process: nothing to average
    (``tformer.training.mpi.DataParallel`` is the hook for several)."""

    def reduce_gradients(self, model, loss):
        return loss

    def clip_grad_norm(self, model, max_norm):
        return clip_grad_norm(model, max_norm)

    def save_checkpoint(self, *args, **kwargs):
        return save_checkpoint(*args, **kwargs)


FULL_PRECISION, ONE_PROCESS = _FullPrecision(), _OneProcess()


def _check_args(accum_steps, steps, start_step, precision, data_parallel):
    if accum_steps < 1:
        raise ValueError(f"accum_steps: expected an integer ≥ 1, got {accum_steps}")
    if steps < start_step:
        raise ValueError(f"steps: expected at least start_step = {start_step}, got {steps}")
    if precision is not None and data_parallel is not None and data_parallel.zero:
        raise ValueError("precision: mixed precision with ZeRO-1 (sharded gradients) is not "
                         "supported; use data parallelism without zero")


def _new_history(mixed):
    hist = {"step": [], "loss": [], "lr": [], "grad_norm": [], "clip_ratio": [], "time": [],
            "eval": []}
    if mixed:
        hist.update(loss_scale=[], skipped=[])
    return hist


def _record(hist, step, loss, optimizer, norm, clip_norm, seconds, scale):
    """One logged step: its loss, learning rate, gradient norm and clip ratio, time, loss scale."""
    hist["step"].append(step)
    hist["loss"].append(loss)
    hist["lr"].append(float(getattr(optimizer, "lr", float("nan"))))
    hist["grad_norm"].append(norm)
    hist["clip_ratio"].append(clip_ratio(norm, clip_norm))
    hist["time"].append(seconds)
    if "loss_scale" in hist:
        hist["loss_scale"].append(scale)


def _stop_unless_finite(value, what, step, last_good, cause=None):
    """Raise ``NonFiniteLossError`` before the update if ``value`` is inf/NaN (parameters and the
    last checkpoint on disk stay those of the last good step)."""
    if not math.isfinite(value):
        where = f"; the last good checkpoint is {last_good}" if last_good else ""
        raise NonFiniteLossError(f"step {step}: {what} is {value}; training stopped before the "
                                 f"update{where}") from cause


def micro_batches(b):
    """``[(w_j, batch_j)]``: a list of micro-batch dicts with their ``"weight"``, or ``[(1, b)]``."""
    return [(float(m["weight"]), m) for m in b] if isinstance(b, list) else [(1.0, b)]


def clip_ratio(norm, clip_norm):
    """min(1, c / ‖g‖): the factor clipping to norm ``c`` multiplies the gradient by (NaN if ‖g‖ is)."""
    if not math.isfinite(norm):
        return float("nan")
    if not clip_norm or norm <= clip_norm:
        return 1.0
    return clip_norm / norm


def _unscale(mp, step, last_good):
    """Unscale the gradients (mixed precision); False if they overflowed (skip this step)."""
    try:
        return mp.unscale_()
    except FloatingPointError as e:
        where = f"; the last good checkpoint is {last_good}" if last_good else ""
        raise NonFiniteLossError(f"step {step}: {e}; training stopped before the update{where}") from e
