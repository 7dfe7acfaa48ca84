"""Mixed-precision training: float16 or bfloat16 compute, float32 master weights, dynamic loss scaling.

The casting policy, as automatic mixed precision (AMP) applies it:

- The model's parameters stay float32: they are the *master weights*. The optimizer updates them,
  with float32 state; checkpoints save them; their gradients are float32 too.
- The forward and backward passes read a *low-precision copy* of every parameter (float16 or
  bfloat16): ``MixedPrecision`` points each layer's attribute (``Linear.W``, ``LayerNorm.gamma``,
  ...) at the copy, while ``module.params`` keeps the master. So activations, and the gradients
  flowing back through them, are float16/bfloat16, and the kernels never see a float32 array.
- Products take low-precision inputs and accumulate in float32 (``tformer.core.dtypes.matmul``);
  softmax, LayerNorm and the loss run in float32 on upcast copies. Each parameter's gradient
  leaves its kernel in the low precision and is added into its float32 gradient.
- After every optimizer step the masters are rounded into the copies again (``refresh``).

float16 keeps numbers only down to 2⁻²⁴ ≈ 6e−8: smaller gradients round to zero. *Loss scaling*
multiplies the loss, hence every gradient, by S before the backward pass, and divides the float32
gradients by S before the update. The right S is not known in advance, so ``DynamicLossScaler``
finds it (PyTorch's ``GradScaler`` algorithm): start large, halve S and skip the step whenever a
gradient overflows to inf/NaN, double it after ``growth_interval`` clean steps in a row. bfloat16
has float32's exponent range and needs no scaling.

One training step, in the order ``tformer.training.train`` runs it: forward/backward of every micro-batch
with the loss gradient multiplied by S (``backward``) → (all-reduce of the gradients, with
several processes) → ``unscale_``: divide by S, check for inf/NaN, skip the step on overflow →
global norm and clipping → optimizer step → ``refresh``.
"""
import math

import numpy as np

from tformer.core.dtypes import bfloat16, float16

PRECISIONS = {"fp32": np.dtype(np.float32), "fp16": float16, "bf16": bfloat16}


def precision_dtype(precision):
    """``"fp32"``, ``"fp16"`` or ``"bf16"`` -> its NumPy dtype; anything else raises ValueError."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {sorted(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    return value


class DynamicLossScaler:
    """The loss scale S and its update rule (PyTorch's ``GradScaler``).

        overflow (an inf/NaN gradient):  skip the step,  S ← S · backoff_factor,  n ← 0
        a clean step:                    n ← n + 1;  if n = growth_interval:  S ← S · growth_factor,  n ← 0

    Defaults are GradScaler's: S₀ = 2¹⁶, ×2 after 2000 clean steps, ×½ on overflow. With factors
    that are powers of two, S stays a power of two and scaling and unscaling are exact.
    ``min_scale``: an overflow at S ≤ min_scale is no overflow that scaling can cure (the
    unscaled gradient itself is not finite), so ``update`` raises FloatingPointError instead of
    skipping forever. ``skipped`` counts the skipped steps.
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, min_scale=1.0):
        self.scale = _positive("init_scale", init_scale)
        self.growth_factor = _positive("growth_factor", growth_factor)
        if self.growth_factor <= 1:
            raise ValueError(f"growth_factor: expected a number > 1, got {growth_factor!r}")
        self.backoff_factor = _positive("backoff_factor", backoff_factor)
        if self.backoff_factor >= 1:
            raise ValueError(f"backoff_factor: expected a number in (0, 1), got {backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, (int, np.integer)) \
                or growth_interval < 1:
            raise ValueError(f"growth_interval: expected an integer ≥ 1, got {growth_interval!r}")
        self.growth_interval = int(growth_interval)
        self.min_scale = _positive("min_scale", min_scale)
        self.growth_tracker = 0          # clean steps since the last change of S
        self.skipped = 0

    def update(self, found_inf):
        """Apply the rule above after a step whose gradients were (not) finite; returns the new S."""
        if found_inf:
            if self.scale <= self.min_scale:
                raise FloatingPointError(
                    f"the gradient is not finite even at loss scale {self.scale:g} "
                    f"(min_scale {self.min_scale:g}): not an overflow that scaling can cure")
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            self.skipped += 1
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale *= self.growth_factor
                self.growth_tracker = 0
        return self.scale

    _KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "min_scale",
             "growth_tracker", "skipped")

    def state_dict(self):
        """Everything ``update`` depends on, as JSON-able scalars (checkpoints store it)."""
        return {k: getattr(self, k) for k in self._KEYS}

    def load_state_dict(self, state):
        """Restore from ``state_dict()``; validated in full before anything changes."""
        missing = sorted(set(self._KEYS) - set(state))
        if missing:
            raise ValueError(f"state: missing keys {missing} of a DynamicLossScaler")
        new = DynamicLossScaler(state["scale"], state["growth_factor"], state["backoff_factor"],
                                state["growth_interval"], state["min_scale"])
        for k in ("growth_tracker", "skipped"):
            v = state[k]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"state[{k!r}]: expected an integer ≥ 0, got {v!r}")
            setattr(new, k, int(v))
        if new.growth_tracker >= new.growth_interval:
            raise ValueError(f"state['growth_tracker']: expected < growth_interval = "
                             f"{new.growth_interval}, got {new.growth_tracker}")
        self.__dict__.update(new.__dict__)
        return self

    def __repr__(self):
        return (f"DynamicLossScaler(scale={self.scale:g}, growth_tracker={self.growth_tracker}, "
                f"skipped={self.skipped}, growth_interval={self.growth_interval})")


class MixedPrecision:
    """Train ``model`` in ``precision`` (``"fp16"`` or ``"bf16"``) with float32 master weights.

    Attaching binds every layer's parameter attribute to a low-precision copy (see the module
    docstring); ``module.params``, the optimizer, the gradients and checkpoints keep float32. With
    a flat parameter buffer (``Module.flatten_parameters``) the copies are one flat buffer too and
    ``refresh`` is one cast. ``scaler``: a ``DynamicLossScaler`` (default for fp16: GradScaler's
    settings, with ``init_scale``), or None for no scaling (default for bf16).
    """

    def __init__(self, model, precision="fp16", scaler="default", init_scale=2.0 ** 16):
        self.dtype = precision_dtype(precision)
        if precision == "fp32":
            raise ValueError("precision: 'fp32' needs no MixedPrecision; use precision_policy(), "
                             "which returns None for it")
        self.name = precision
        if scaler == "default":
            scaler = DynamicLossScaler(init_scale) if precision == "fp16" else None
        if scaler is not None and not isinstance(scaler, DynamicLossScaler):
            raise TypeError(f"scaler: expected a DynamicLossScaler or None, got {type(scaler).__name__}")
        self.scaler = scaler
        self.model = model
        self._bind()

    # -- the low-precision copies -----------------------------------------------------------

    def _bind(self):
        """Make the low-precision copies and point the layers' attributes at them."""
        masters, seen = [], set()
        for m in self.model.modules():
            for p in m.params.values():
                if id(p) not in seen:
                    seen.add(id(p))
                    masters.append(p)
        for p in masters:
            if p.dtype != np.float32:
                raise TypeError(f"model: mixed precision needs float32 parameters (the masters), "
                                f"got {p.dtype}")
        flat = self.model.flat_buffers()
        layout = self.model.flat_layout() if flat is not None else None
        if layout is not None:                      # the copies laid out as the masters are
            P = flat[0]
            self._flat = (P, np.empty(P.shape, self.dtype))           # masters, copies
            copies = {}
            for name, p, _ in self.model.named_parameters():
                at, shape = layout[name]
                copies[id(p)] = self._flat[1][at:at + p.size].reshape(shape)
        else:
            self._flat = None
            copies = {id(p): np.empty(p.shape, self.dtype) for p in masters}
        self._pairs = [(p, copies[id(p)]) for p in masters]
        self._bindings = []                         # (module, attribute, master, copy)
        for m in self.model.modules():
            for attr, key in m.param_attributes():
                p = m.params[key]
                if getattr(m, attr) is p:
                    m.bind(attr, copies[id(p)])
                    self._bindings.append((m, attr, p, copies[id(p)]))
        self.refresh()

    def refresh(self):
        """Round the float32 masters into the low-precision copies (after every update)."""
        if self._flat is not None:
            np.copyto(self._flat[1], self._flat[0], casting="same_kind")
        else:
            for p, c in self._pairs:
                np.copyto(c, p, casting="same_kind")

    def detach(self):
        """Point the layers back at their float32 masters: the model computes in float32 again."""
        for m, attr, p, _ in self._bindings:
            m.bind(attr, p)
        self._bindings = []

    # -- loss scaling ---------------------------------------------------------------------------

    @property
    def loss_scale(self):
        """S (1.0 without a scaler)."""
        return self.scaler.scale if self.scaler is not None else 1.0

    def scale_grad(self, dout):
        """S · ∂L/∂output, rounded to the model's format: what the backward pass starts from.

        ``dout`` is the loss's float32 gradient (``F.cross_entropy`` returns float32 for
        low-precision logits); multiplying before rounding is what keeps its small entries."""
        g = np.multiply(dout, self.loss_scale, dtype=np.float32)
        return g.astype(self.dtype)

    def backward(self, model, dout):
        """``model.backward(scale_grad(dout))``. With a scaler, overflow to inf/NaN is expected now
        and then (``unscale_`` finds it and the step is skipped), so NumPy's overflow warnings are
        silenced for this pass."""
        if self.scaler is None:
            return model.backward(self.scale_grad(dout))
        with np.errstate(over="ignore", invalid="ignore"):
            return model.backward(self.scale_grad(dout))

    def _grads(self):
        """The float32 gradient arrays (the flat buffer when there is one: a frozen parameter's
        place there stays zero, see ``Module.freeze``)."""
        flat = self.model.flat_buffers()
        if flat is not None:
            return [flat[1]]
        seen, out = set(), []
        for _, p, g in self.model.named_parameters():
            if g is not None and id(p) not in seen:        # a frozen parameter has none
                seen.add(id(p))
                out.append(g)
        return out

    def unscale_(self):
        """Gradients ← gradients / S, in place; returns False if any was inf/NaN (skip the step).

        Then updates the scaler (halve S on overflow, count a clean step otherwise). Without a
        scaler it does nothing and returns True: a non-finite bfloat16 gradient is then caught by
        the training loop's NaN guard, as in float32. Raises FloatingPointError (from the scaler)
        when the gradient is not finite even at the smallest scale.
        """
        if self.scaler is None:
            return True
        grads = self._grads()
        with np.errstate(invalid="ignore"):
            finite = all(np.isfinite(g).all() for g in grads)
        if finite:
            inv = 1.0 / self.scaler.scale
            for g in grads:
                g *= inv
        self.scaler.update(not finite)
        return finite

    # -- checkpoints ----------------------------------------------------------------------------

    def state_dict(self):
        """``{"precision": name, "scaler": scaler state or None}`` (JSON-able)."""
        return {"precision": self.name,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state):
        """Restore the scaler from a checkpoint's state (a run saved in the same precision), then
        ``refresh`` the copies from the (just loaded) masters."""
        if not isinstance(state, dict) or "precision" not in state:
            raise ValueError(f"state: expected a MixedPrecision state dict, got {state!r}")
        if state["precision"] != self.name:
            raise ValueError(f"state: saved in precision {state['precision']!r}, this run is "
                             f"{self.name!r}")
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.refresh()
        return self

    def __repr__(self):
        return f"MixedPrecision({self.name!r}, scaler={self.scaler!r})"


def precision_policy(model, precision, init_scale=2.0 ** 16):
    """None for ``"fp32"``, else ``MixedPrecision(model, precision, init_scale=init_scale)``.

    Validates both arguments either way (an unknown precision, an init scale ≤ 0: ValueError)."""
    precision_dtype(precision)
    _positive("init_scale", init_scale)
    return None if precision == "fp32" else MixedPrecision(model, precision, init_scale=init_scale)
