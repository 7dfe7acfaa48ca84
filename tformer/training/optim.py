"""Optimizers (SGD, Adam, AdamW in both ε placements), gradient clipping, and the schedules.

An optimizer takes the model and reads ``model.named_parameters()``, which yields
``(qualified_name, param, grad)`` with ``param`` and ``grad`` NumPy arrays of one shape and dtype,
or ``grad`` None for a frozen parameter (``Module.freeze``), which the optimizer leaves alone: no
state, no moment update, no weight decay, as PyTorch's optimizers skip a parameter whose ``grad``
is None. ``opt.step()`` updates every other ``param`` in place (``param -= ...``; the array object
is never replaced) from its ``grad``, which it never modifies. State (``m``, ``v``, momentum
buffers) is keyed by the qualified name, has the parameter's shape and dtype, and is created with
the optimizer. Scalars enter the arithmetic as Python floats, so float32 parameters are updated in
float32 with no float64 temporaries.

Symbols follow the sources: g the gradient, m and v the first and second moments, m_hat and v_hat
their bias-corrected values, beta1 / beta2, eps (ε), lr (η or α), weight_decay (λ), t the step.
"""

import math
import threading

import numpy as np

from tformer.core import parallel
from tformer.training.schedules import LRScheduler, cosine_with_warmup, noam_lr

__all__ = ["SGD", "Adam", "AdamW", "clip_grad_norm", "noam_lr", "cosine_with_warmup", "LRScheduler"]


def _check_float(name, value, low, high=math.inf, low_open=False, high_open=True):
    """Return ``float(value)`` if it lies in the interval, else raise ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    ok = math.isfinite(value) and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return value


_BLOCK = 1 << 18          # elements per cache block of an optimizer update (1 MiB in float32)


def _check_betas(betas):
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    return (_check_float("betas[0] (beta1)", betas[0], 0.0, 1.0),
            _check_float("betas[1] (beta2)", betas[1], 0.0, 1.0))


class Optimizer:
    """Base class: parameter bookkeeping, the step counter ``t``, the lr, and (de)serialization.

    Subclasses set ``_slots`` (the names of their per-parameter state arrays) and ``_hyper`` (the
    names of their scalar hyperparameters) and implement ``_update(param, grad, state)``.
    """

    _slots = ()
    _hyper = ()

    def __init__(self, model, lr):
        if not hasattr(model, "named_parameters"):
            raise TypeError(f"model must have named_parameters(), got {type(model).__name__}")
        self.model = model
        self.lr = lr
        self.t = 0
        self.state = {}  # name -> {slot: array of the parameter's shape and dtype}
        self._flat = None
        params = list(self._parameters())
        flat = model.flat_buffers() if hasattr(model, "flat_buffers") else None
        layout = model.flat_layout() if flat is not None else None
        if layout is not None and not self._frozen_seen:
            # The model keeps its parameters in one flat buffer (Module.flatten_parameters): the
            # state gets one flat array per slot, and each parameter's state is a view of its
            # slice, where the buffer's table (Module.flat_layout) puts the parameter.
            P, G = flat
            slots = {s: np.zeros_like(P) for s in self._slots}
            for name, param, grad in params:
                at, shape = layout[name]
                self.state[name] = {s: a[at:at + param.size].reshape(shape) for s, a in slots.items()}
            self._flat = (P, G, slots)
        else:
            for name, param, grad in params:
                self.state[name] = {s: np.zeros_like(param) for s in self._slots}
        if not self.state:
            if self._frozen_seen:
                raise ValueError("model: every parameter is frozen, there is nothing to train "
                                 "(unfreeze some first)")
            raise ValueError("model has no parameters: named_parameters() yielded nothing")

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = _check_float("lr", value, 0.0)

    def _parameters(self):
        """Yield checked ``(name, param, grad)`` of the parameters to train; an array listed twice
        (tied weights) once, a frozen one (``grad`` None) never.

        Frozen parameters leave gaps in the flat buffers, so an optimizer over a model with some
        updates one array at a time (each update is elementwise: the same numbers as the one
        sweep); one frozen after the optimizer was made turns the sweep off here, before ``step``
        would run it. A tied array frozen under one name and trained under another raises
        ValueError."""
        seen_names, seen_arrays, frozen = set(), set(), {}
        self._frozen_seen = False
        for name, param, grad in self.model.named_parameters():
            if name in seen_names:
                raise ValueError(f"parameter name {name!r} appears twice in named_parameters()")
            seen_names.add(name)
            if not (isinstance(param, np.ndarray) and np.issubdtype(param.dtype, np.floating)):
                raise TypeError(f"parameter {name!r} must be a floating-point ndarray, "
                                f"got {type(param).__name__} {getattr(param, 'dtype', '')}")
            if (grad is None) != frozen.setdefault(id(param), grad is None):
                raise ValueError(f"parameter {name!r}: a tied array, frozen under one name and "
                                 f"trained under another; expected it frozen in every module "
                                 f"that holds it, or in none")
            if grad is None:
                self._frozen_seen, self._flat = True, None
                continue
            if grad.shape != param.shape or grad.dtype != param.dtype:
                raise ValueError(f"gradient of {name!r} has shape {grad.shape} {grad.dtype}, "
                                 f"expected the parameter's {param.shape} {param.dtype}")
            if id(param) in seen_arrays:
                continue
            seen_arrays.add(id(param))
            yield name, param, grad

    def _step_parameters(self):
        """``[(name, param, grad)]`` a step updates, checked in full before anything changes:
        each one known when the optimizer was made."""
        params = list(self._parameters())
        for name, _, _ in params:
            if name not in self.state:
                raise ValueError(f"parameter {name!r} was not present when the optimizer was "
                                 f"created; known parameters: {sorted(self.state)}")
        return params

    def step(self):
        """Advance ``t`` by one and update every parameter in place from its gradient."""
        params = self._step_parameters()
        self.t += 1
        if self._flat is not None and (self.model.flat_buffers() or (None,))[0] is self._flat[0]:
            # Every parameter at once: one sweep over the flat buffers, split across threads from
            # about a million numbers (below that, a few dozen NumPy calls in two threads taking
            # turns on the GIL are slower than in one).
            P, G, slots = self._flat
            parallel.parallel_for(lambda lo, hi: self._sweep(P, G, slots, lo, hi), P.size, grain=1 << 20)
            return
        for name, param, grad in params:
            state = self.state[name]
            if all(a.flags.c_contiguous for a in (param, grad, *state.values())):
                flat = {k: a.reshape(-1) for k, a in state.items()}   # views: they write through
                self._sweep(param.reshape(-1), grad.reshape(-1), flat, 0, param.size)
            else:                                   # views that do not flatten: the equation itself
                self._update(param, grad, state)

    def _sweep(self, p, g, state, lo, hi):
        """``_update`` on elements ``lo:hi`` of flat arrays, in consecutive blocks of ``_BLOCK``.

        Every update is elementwise, so a block is updated exactly as the whole would be; but a
        block's dozen passes (moments, bias correction, √, division, decay) then run over a few
        MiB that stay in cache instead of streaming the whole parameter from memory once per pass
        (smaller blocks would lose more to Python's per-call overhead than they gain).
        """
        for a in range(lo, hi, _BLOCK):
            b = min(a + _BLOCK, hi)
            self._update_inplace(p[a:b], g[a:b], {k: x[a:b] for k, x in state.items()})

    def _update(self, param, grad, state):
        """The update equation of one parameter, written as the chapter writes it."""
        raise NotImplementedError

    def _update_inplace(self, param, grad, state):
        """``_update`` with the same arithmetic and no temporary arrays (``tests/training/test_optim.py``
        holds the two equal bit for bit); the step's contiguous sweep calls this one."""
        self._update(param, grad, state)

    # -- serialization -------------------------------------------------------------------------

    def state_dict(self):
        """A flat dict of copies: ``"optimizer"`` (class name), ``"t"``, ``"lr"``, every
        hyperparameter, and one array per parameter and slot under ``"<slot>.<qualified name>"``
        (e.g. ``"m.blocks.0.W_q"``). Flat string keys, so ``np.savez(path, **sd)`` stores it."""
        sd = {"optimizer": type(self).__name__, "t": self.t, "lr": self.lr}
        for h in self._hyper:
            sd[h] = getattr(self, h)
        for name, slots in self.state.items():
            for s, arr in slots.items():
                sd[f"{s}.{name}"] = arr.copy()
        return sd

    def load_state_dict(self, sd):
        """Restore ``t``, ``lr``, hyperparameters and state from :meth:`state_dict`'s output.

        Everything is validated before anything is changed: a different optimizer class, a
        missing or unexpected key, or an array whose shape differs from the parameter's raises
        ValueError naming it. Scalars may come back as 0-d arrays (as ``np.load`` returns them).
        Arrays are copied into the existing state, cast to the parameter's dtype."""
        def scalar(key):
            value = sd[key]
            return value.item() if isinstance(value, np.ndarray) else value

        expected = {"optimizer", "t", "lr", *self._hyper}
        expected |= {f"{s}.{name}" for name in self.state for s in self._slots}
        missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
        if missing or unexpected:
            raise ValueError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, "
                             f"unexpected keys {unexpected}")
        if str(scalar("optimizer")) != type(self).__name__:
            raise ValueError(f"state dict is for optimizer {scalar('optimizer')!r}, "
                             f"not {type(self).__name__!r}")
        t = scalar("t")
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"t must be an integer >= 0, got {t!r}")
        for name, slots in self.state.items():
            for s, arr in slots.items():
                src = np.asarray(sd[f"{s}.{name}"])
                if src.shape != arr.shape:
                    raise ValueError(f"state {s!r} of parameter {name!r} has shape {src.shape}, "
                                     f"expected {arr.shape}")
                if not np.issubdtype(src.dtype, np.floating):
                    raise ValueError(f"state {s!r} of parameter {name!r} has dtype {src.dtype}, "
                                     f"expected a floating dtype")
        hyper = {h: scalar(h) for h in ("lr", *self._hyper)}
        backup = {h: getattr(self, h) for h in hyper}
        try:  # the setters / validators raise ValueError naming a bad hyperparameter
            self._set_hyper(**hyper)
        except (ValueError, TypeError):
            self._set_hyper(**backup)
            raise
        self.t = int(t)
        for name, slots in self.state.items():
            for s, arr in slots.items():
                np.copyto(arr, sd[f"{s}.{name}"], casting="same_kind")

    def _set_hyper(self, lr, **hyper):
        self.lr = lr
        for h, value in hyper.items():
            setattr(self, h, value)

    def __repr__(self):
        hyper = ", ".join(f"{h}={getattr(self, h)!r}" for h in ("lr", *self._hyper))
        return f"{type(self).__name__}({hyper}, t={self.t}, parameters={len(self.state)})"


class SGD(Optimizer):
    r"""Stochastic gradient descent with optional momentum and (coupled, L2) weight decay.

        g ← ∇θ + λθ            (λ = weight_decay; added to a copy, the gradient is not modified)
        b ← μ b + g            (μ = momentum; b starts at 0, so the first b is g)
        θ ← θ − η b            (η = lr; with μ = 0 this is θ ← θ − η g and no b is stored)

    This is PyTorch's ``torch.optim.SGD`` without dampening or Nesterov.
    State: ``momentum_buffer`` of each parameter's shape and dtype (only when momentum > 0).
    """

    _hyper = ("momentum", "weight_decay")

    def __init__(self, model, lr, momentum=0.0, weight_decay=0.0):
        self.momentum = _check_float("momentum", momentum, 0.0, 1.0)
        self.weight_decay = _check_float("weight_decay", weight_decay, 0.0)
        self._slots = ("momentum_buffer",) if self.momentum > 0 else ()
        super().__init__(model, lr)

    def _set_hyper(self, lr, momentum, weight_decay):
        momentum = _check_float("momentum", momentum, 0.0, 1.0)
        if (momentum > 0) != (self.momentum > 0):
            raise ValueError(f"momentum {momentum} cannot replace {self.momentum}: one of them "
                             f"is 0 and keeps no momentum buffer")
        self.momentum = momentum
        self.weight_decay = _check_float("weight_decay", weight_decay, 0.0)
        self.lr = lr

    def _update(self, param, grad, state):
        """g ← ∇θ + λθ,  b ← μ b + g,  θ ← θ − η b  (θ ← θ − η g without momentum)."""
        g = grad
        if self.weight_decay != 0.0:
            g = grad + self.weight_decay * param        # a new array: the gradient is not modified
        if self.momentum != 0.0:
            b = state["momentum_buffer"]
            b *= self.momentum
            b += g                                      # b = μ b + g, in the state
            g = b
        param -= self.lr * g


class _AdamBase(Optimizer):
    """Shared moment updates of Adam and AdamW."""

    _slots = ("m", "v")
    _hyper = ("beta1", "beta2", "eps")

    def __init__(self, model, lr, betas, eps):
        self.beta1, self.beta2 = _check_betas(betas)
        self.eps = _check_float("eps", eps, 0.0, low_open=True)
        super().__init__(model, lr)

    @property
    def betas(self):
        return (self.beta1, self.beta2)

    def _set_hyper(self, lr, beta1, beta2, eps, **rest):
        self.beta1, self.beta2 = _check_betas((beta1, beta2))
        self.eps = _check_float("eps", eps, 0.0, low_open=True)
        if "weight_decay" in rest:
            self.weight_decay = _check_float("weight_decay", rest.pop("weight_decay"), 0.0)
        if "eps_inside_sqrt" in rest:
            self.eps_inside_sqrt = _check_bool("eps_inside_sqrt", rest.pop("eps_inside_sqrt"))
        self.lr = lr

    def _scratch(self, like):
        """Two scratch arrays shaped like ``like``: views of two flat buffers that the optimizer
        keeps between steps (one pair per thread), so an update allocates nothing (fresh memory
        costs page faults)."""
        n = like.size
        bufs = self.__dict__.setdefault("_scratch_bufs", {})
        key = threading.get_ident()
        buf = bufs.get(key)
        if buf is None or buf.dtype != like.dtype or buf.shape[1] < n:
            largest = max(p.size for _, p, _ in self._parameters())
            buf = np.empty((2, max(n, largest)), like.dtype)
            bufs[key] = buf
        return buf[0, :n].reshape(like.shape), buf[1, :n].reshape(like.shape)

    def _moments(self, grad, state):
        """m ← β1 m + (1−β1) g,  v ← β2 v + (1−β2) g²;  returns m_hat = m / (1 − β1^t), v_hat = v / (1 − β2^t).

        ``m`` and ``v`` are the optimizer's state: they are updated where they are (``[...] =``)."""
        m, v = state["m"], state["v"]
        m[...] = self.beta1 * m + (1 - self.beta1) * grad
        v[...] = self.beta2 * v + (1 - self.beta2) * grad**2
        m_hat = m / (1 - self.beta1 ** self.t)
        v_hat = v / (1 - self.beta2 ** self.t)
        return m_hat, v_hat

    def _moments_inplace(self, grad, state):
        """``_moments`` with the same arithmetic, written into two scratch buffers of the
        parameter's dtype (reused by the next parameter; the caller may overwrite them)."""
        m, v = state["m"], state["v"]
        m_hat, v_hat = self._scratch(grad)
        np.multiply(grad, 1.0 - self.beta1, out=m_hat)     # (1−β1) g
        m *= self.beta1
        m += m_hat                                         # m = β1 m + (1−β1) g
        np.multiply(grad, grad, out=v_hat)                 # g²
        v_hat *= 1.0 - self.beta2
        v *= self.beta2
        v += v_hat                                         # v = β2 v + (1−β2) g²
        np.divide(m, 1.0 - self.beta1 ** self.t, out=m_hat)  # m_hat
        np.divide(v, 1.0 - self.beta2 ** self.t, out=v_hat)  # v_hat
        return m_hat, v_hat


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


class Adam(_AdamBase):
    r"""Adam (the post-LN encoder's form; no weight decay).

        m ← β1 m + (1−β1) g,    v ← β2 v + (1−β2) g²
        m_hat = m / (1 − β1^t), v_hat = v / (1 − β2^t)
        θ ← θ − η · m_hat / (√v_hat + ε)

    t counts from 1 at the first ``step()``. State: ``m`` and ``v`` of each parameter's shape and
    dtype, zero at the start. Equal to ``torch.optim.Adam`` with ``weight_decay=0``.
    """

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(model, lr, betas, eps)

    def _update(self, param, grad, state):
        """θ ← θ − η · m_hat / (√v_hat + ε)."""
        m_hat, v_hat = self._moments(grad, state)
        param -= self.lr * (m_hat / (np.sqrt(v_hat) + self.eps))

    def _update_inplace(self, param, grad, state):
        m_hat, v_hat = self._moments_inplace(grad, state)
        np.sqrt(v_hat, out=v_hat)
        v_hat += self.eps                   # √v_hat + ε
        m_hat /= v_hat                      # m_hat / (√v_hat + ε)
        m_hat *= self.lr
        param -= m_hat


class AdamW(_AdamBase):
    r"""AdamW with decoupled weight decay, in the two ε placements of the sources.

    Both forms update the moments as Adam does (the decay never enters g, m or v):

        m ← β1 m + (1−β1) g,    v ← β2 v + (1−β2) g²
        m_hat = m / (1 − β1^t), v_hat = v / (1 − β2^t)

    ``eps_inside_sqrt=False`` (default; TinyGPT), with α = lr:

        θ ← θ − α (m_hat / (√v_hat + ε) + λ θ)

    ``eps_inside_sqrt=True`` (the two-layer transformer and the single attention layer),
    with η = lr:

        W ← (1 − λη) W − η · m_hat / √(v_hat + ε)

    How they relate: TinyGPT's λθ is the θ *before* the step, so θ − α(u + λθ) =
    (1 − αλ)θ − αu. The decay is therefore the same multiplicative shrink (1 − ηλ) of the old
    weights in both, and the forms differ only in where ε sits: √v_hat + ε against √(v_hat + ε).
    When v_hat ≫ ε the two agree closely; when v_hat is tiny (g ≈ 0) the ε-inside form divides by
    √ε (1e-4 for ε = 1e-8) and moves far less than the ε-outside one, which divides by √v_hat + ε.
    Each is computed here as its source writes it (ε outside: the bracket is formed, then scaled
    by α; ε inside: W is shrunk, then the step subtracted), so results agree with the algebra up to
    rounding. ``torch.optim.AdamW`` shrinks θ by (1 − αλ) before its Adam step: the ε-outside form.

    State: ``m`` and ``v`` of each parameter's shape and dtype, zero at the start.
    """

    _hyper = ("beta1", "beta2", "eps", "weight_decay", "eps_inside_sqrt")

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 eps_inside_sqrt=False):
        self.weight_decay = _check_float("weight_decay", weight_decay, 0.0)
        self.eps_inside_sqrt = _check_bool("eps_inside_sqrt", eps_inside_sqrt)
        super().__init__(model, lr, betas, eps)

    def _update(self, param, grad, state):
        """ε inside: W ← (1 − λη) W − η m_hat / √(v_hat + ε);  ε outside: θ ← θ − α (m_hat / (√v_hat + ε) + λθ)."""
        m_hat, v_hat = self._moments(grad, state)
        if self.eps_inside_sqrt:
            param *= 1.0 - self.weight_decay * self.lr
            param -= self.lr * (m_hat / np.sqrt(v_hat + self.eps))
        elif self.weight_decay != 0.0:
            param -= self.lr * (m_hat / (np.sqrt(v_hat) + self.eps) + self.weight_decay * param)
        else:
            param -= self.lr * (m_hat / (np.sqrt(v_hat) + self.eps))

    def _update_inplace(self, param, grad, state):
        m_hat, v_hat = self._moments_inplace(grad, state)
        if self.eps_inside_sqrt:            # ε inside
            v_hat += self.eps
            np.sqrt(v_hat, out=v_hat)       # √(v_hat + ε)
            m_hat /= v_hat                  # m_hat / √(v_hat + ε)
            m_hat *= self.lr                # η · m_hat / √(v_hat + ε)
            if self.weight_decay != 0.0:
                param *= 1.0 - self.weight_decay * self.lr   # (1 − λη) W
            param -= m_hat
        else:                               # ε outside
            np.sqrt(v_hat, out=v_hat)
            v_hat += self.eps               # √v_hat + ε
            m_hat /= v_hat                  # m_hat / (√v_hat + ε)
            if self.weight_decay != 0.0:
                np.multiply(param, self.weight_decay, out=v_hat)  # λθ (old θ)
                m_hat += v_hat              # m_hat / (√v_hat + ε) + λθ
            m_hat *= self.lr                # α (...)
            param -= m_hat


def clip_grad_norm(model, max_norm, error_if_nonfinite=False):
    r"""Scale all gradients in place so that their global L2 norm is at most ``max_norm``.

        ‖g‖ = √(Σ_p Σ_i g_{p,i}²);   if ‖g‖ > max_norm:  g ← g · max_norm / ‖g‖

    Returns the norm *before* clipping, as a Python float. Each tensor's sum of squares is one
    BLAS dot product in the gradient's own dtype (no upcast copy of the big arrays); the per-tensor
    sums are added in float64. If a float32 sum overflows while the values are finite, that
    tensor is rescaled by its largest magnitude and summed again.

    A non-finite norm (a NaN or inf gradient) is returned and nothing is scaled, as PyTorch's
    ``clip_grad_norm_`` does by default; the caller (the training loop's NaN guard) decides.
    With ``error_if_nonfinite=True`` it raises FloatingPointError instead.

    Gradients of arrays listed twice in ``named_parameters()`` (tied weights) count once; frozen
    parameters (``grad`` None) have none and do not count.
    """
    max_norm = _check_float("max_norm", max_norm, 0.0, low_open=True)
    grads, seen = [], set()
    for name, param, grad in model.named_parameters():
        if grad is not None and id(param) not in seen:
            seen.add(id(param))
            grads.append((name, grad))
    total = 0.0
    for name, grad in grads:
        r = grad.reshape(-1)
        with np.errstate(over="ignore"):
            s = float(np.dot(r, r))
        if math.isinf(s) and np.isfinite(r).all():
            scale = float(np.max(np.abs(r)))
            q = r / scale
            s = scale * scale * float(np.dot(q, q))
        total += s
    norm = math.sqrt(total)
    if not math.isfinite(norm):
        if error_if_nonfinite:
            bad = [n for n, g in grads if not np.isfinite(g).all()]
            raise FloatingPointError(f"gradient norm is {norm}; non-finite gradients in {bad}")
        return norm
    if norm > max_norm:
        coef = max_norm / norm
        for name, grad in grads:
            grad *= coef
    return norm
