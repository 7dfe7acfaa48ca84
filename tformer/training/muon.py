"""Muon: momentum, then the update matrix replaced by a nearly orthogonal one (Newton–Schulz).

For each hidden weight matrix W (shape ``(d_in, d_out)``, row vectors as everywhere in tformer)
with gradient g, momentum μ, learning rate η and weight decay λ::

    B ← μB + (1 − μ) g                          the momentum buffer (B starts at 0)
    U = μB + (1 − μ) g   (Nesterov)  or  B      (one more step towards g, not stored)
    O = NS(U)                                   U = PΣQᵀ  ->  O ≈ P Qᵀ, singular values near 1
    W ← (1 − ηλ) W − η s O                      decoupled decay with η; s the shape's lr scale

``s`` is ``adjust_lr_fn``'s: ``"original"`` (also None; Keller Jordan's) s = √max(1, d_out/d_in),
``"match_rms_adamw"`` (Moonshot's) s = 0.2·√max(d_in, d_out). This is ``torch.optim.Muon``
(PyTorch 2.13) step for step, including its forms: the buffer is the lerp B ← B + (1 − μ)(g − B),
though its docstring writes B ← μB + g (a factor 1/(1 − μ) that the normalisation inside NS
removes), and the decay uses the unscaled η. Two differences, both of layout or precision:

- tformer stores W as ``(d_in, d_out)``, the transpose of torch's ``nn.Linear.weight``
  ``(d_out, d_in)``; NS(Wᵀ) = NS(W)ᵀ, and s reads d_out/d_in from the layer's meaning, so the same
  layer gets the same update (``tests/training/test_torch_parity_muon.py`` compares W with torch's weightᵀ).
- torch runs the Newton–Schulz iteration in bfloat16 on every device; here it runs in the
  parameter's own dtype (float32, or float64 for the parity tests, where torch's bfloat16 cast
  is replaced by a copy).

Muon is for 2-D matrices of the hidden layers only. ``MuonAdamW`` is the recipe of nanochat and
modded-nanogpt as one optimizer: Muon for the matrices of the blocks, AdamW for the embeddings,
the LM head, the gains and the biases (``split_parameters``). A fused W_qkv (C, 3C) is one
matrix here, as ``torch.optim.Muon`` treats nanoGPT's ``c_attn``; nanochat and modded-nanogpt
keep W_q, W_k, W_v apart and orthogonalise each.

Where Muon composes and where it does not:

- threads: the matrices are updated side by side (``parallel.run_tasks``, one matrix per task),
  each by the same arithmetic on whichever thread, so every thread count gives the same update
  up to the rounding of the matrix products;
- frozen parameters (``Module.freeze``) get no state and no update; LoRA's ``Adapters`` view
  gives Muon the adapters' A and B (2-D, in the blocks);
- checkpoints and ``--resume``: ``state_dict`` / ``load_state_dict`` as every optimizer's, so a
  resumed run repeats the straight one bit for bit;
- MPI data parallelism without ZeRO: every rank holds the whole reduced gradient and computes
  the same update;
- **ZeRO-1 does not compose**: its shards (``tformer.training.zero.ShardedOptimizer``) cut the
  flat buffer into 1-D slices across matrices, and NS needs each whole matrix. ``Muon`` and
  ``MuonAdamW`` raise ValueError on a ZeRO-1 shard.
"""
import functools
import math

import numpy as np

from tformer.core import parallel
from tformer.training.optim import AdamW, Optimizer, _check_bool, _check_float

__all__ = ["newton_schulz", "adjust_lr", "Muon", "MuonAdamW", "ParameterGroup",
           "is_hidden_matrix", "split_parameters", "NS_COEFFICIENTS", "ADJUST_LR_FNS"]

NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)     # (a, b, c): Keller Jordan's quintic
ADJUST_LR_FNS = ("original", "match_rms_adamw")


def newton_schulz(G, coefficients=NS_COEFFICIENTS, steps=5, eps=1e-7):
    """X ← aX + b(XXᵀ)X + c(XXᵀ)²X, ``steps`` times, from X₀ = G / max(‖G‖_F, ε).

    Shapes: ``G: (m, n)`` -> ``(m, n)``, in G's dtype. With X = UΣVᵀ one step is U p(Σ) Vᵀ,
    p(σ) = aσ + bσ³ + cσ⁵: the singular vectors stay, the singular values (all ≤ 1 after the
    division, since ‖X‖₂ ≤ ‖X‖_F) move towards 1 (the default coefficients push them into a band
    around 1, not onto it). A tall G (m > n) is transposed first, so that
    XXᵀ is the smaller Gram matrix, ``(min(m, n), min(m, n))``; the result is transposed back.
    """
    a, b, c = coefficients
    tall = G.shape[0] > G.shape[1]
    X = G.T if tall else G
    X = X / max(float(np.linalg.norm(X)), eps)      # ‖X‖_F ≤ 1: every σ ≤ 1
    for _ in range(steps):
        A = X @ X.T                                 # XXᵀ
        B = b * A + c * (A @ A)                     # b XXᵀ + c (XXᵀ)²
        X = a * X + B @ X                           # aX + b(XXᵀ)X + c(XXᵀ)²X
    return X.T if tall else X


def adjust_lr(lr, adjust_lr_fn, shape):
    """η·s for a matrix W of ``shape = (d_in, d_out)``: s = √max(1, d_out/d_in) (``"original"``
    or None) or 0.2·√max(d_in, d_out) (``"match_rms_adamw"``), as ``torch.optim.Muon`` computes
    it for the same layer (its weight is ``(d_out, d_in)``)."""
    d_in, d_out = shape
    if adjust_lr_fn == "match_rms_adamw":
        return lr * (0.2 * math.sqrt(max(d_in, d_out)))
    return lr * math.sqrt(max(1, d_out / d_in))


def refuse_zero1(model):
    """ValueError if ``model`` is a ZeRO-1 shard (``tformer.training.zero``, a layer above this
    one, hence the check by the class's module rather than an import)."""
    if type(model).__module__ == "tformer.training.zero":
        raise ValueError("model: Muon does not compose with ZeRO-1 (tformer.training.zero."
                         "ShardedOptimizer, DataParallel(zero=True)): its shards are 1-D slices "
                         "of the flat buffer that cut across matrices, and Newton–Schulz needs "
                         "each whole matrix; got a ZeRO-1 shard (use DataParallel(zero=False))")


def _check_coefficients(coefficients):
    if not isinstance(coefficients, (tuple, list, np.ndarray)) or len(coefficients) != 3:
        raise ValueError(f"ns_coefficients must be three numbers (a, b, c), got {coefficients!r}")
    return tuple(_check_float(f"ns_coefficients[{i}] ({s})", v, -math.inf)
                 for i, (s, v) in enumerate(zip("abc", coefficients)))


def _check_ns_steps(ns_steps):
    if isinstance(ns_steps, (bool, np.bool_)) or not isinstance(ns_steps, (int, np.integer)) \
            or not 1 <= ns_steps < 100:
        raise ValueError(f"ns_steps must be an integer in [1, 99], got {ns_steps!r}")
    return int(ns_steps)


def _check_adjust_lr_fn(adjust_lr_fn):
    if adjust_lr_fn is None:
        return "original"
    if not isinstance(adjust_lr_fn, str) or adjust_lr_fn not in ADJUST_LR_FNS:
        raise ValueError(f"adjust_lr_fn must be None or one of {list(ADJUST_LR_FNS)}, "
                         f"got {adjust_lr_fn!r}")
    return adjust_lr_fn


class Muon(Optimizer):
    r"""Muon (``torch.optim.Muon``'s arguments and defaults) on a model whose trained parameters
    are all 2-D matrices: a ``ParameterGroup`` of a model's hidden matrices, as ``MuonAdamW``
    makes one. The equations are the module's docstring; ``_update`` is them.

    ``adjust_lr_fn=None`` is ``"original"`` (stored so). ``momentum`` in [0, 1), ``ns_steps`` an
    integer in [1, 99], ``eps`` > 0. State: ``momentum_buffer`` of each matrix's shape and dtype,
    zero at the start; ``state_dict`` stores the coefficients as the scalars ``a``, ``b``, ``c``.
    """

    _slots = ("momentum_buffer",)
    _hyper = ("momentum", "nesterov", "a", "b", "c", "eps", "ns_steps", "weight_decay",
              "adjust_lr_fn")

    def __init__(self, model, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=NS_COEFFICIENTS, eps=1e-7, ns_steps=5, adjust_lr_fn=None):
        refuse_zero1(model)
        a, b, c = _check_coefficients(ns_coefficients)
        self._set_muon(momentum, nesterov, a, b, c, eps, ns_steps, weight_decay, adjust_lr_fn)
        super().__init__(model, lr)
        for name, param, _ in self._parameters():
            if param.ndim != 2:
                raise ValueError(f"parameter {name!r}: Muon updates 2-D matrices, got shape "
                                 f"{param.shape} (give embeddings, the head, gains and biases to "
                                 f"AdamW: MuonAdamW does)")

    @property
    def ns_coefficients(self):
        return (self.a, self.b, self.c)

    def _set_muon(self, momentum, nesterov, a, b, c, eps, ns_steps, weight_decay, adjust_lr_fn):
        """Check every hyperparameter, then set them (a bad one changes nothing)."""
        checked = dict(momentum=_check_float("momentum", momentum, 0.0, 1.0),
                       nesterov=_check_bool("nesterov", nesterov),
                       eps=_check_float("eps", eps, 0.0, low_open=True),
                       ns_steps=_check_ns_steps(ns_steps),
                       weight_decay=_check_float("weight_decay", weight_decay, 0.0),
                       adjust_lr_fn=_check_adjust_lr_fn(adjust_lr_fn))
        checked.update(zip("abc", _check_coefficients((a, b, c))))
        self.__dict__.update(checked)

    def _set_hyper(self, lr, **hyper):
        self._set_muon(**hyper)
        self.lr = lr

    def step(self):
        """Advance ``t`` by one and update every matrix, side by side on the threads."""
        params = self._step_parameters()
        self.t += 1
        parallel.run_tasks(*(functools.partial(self._update, param, grad, self.state[name])
                             for name, param, grad in params))

    def _update(self, param, grad, state):
        """B ← μB + (1 − μ)g;  O = NS(μB + (1 − μ)g) (Nesterov) or NS(B);  W ← (1 − ηλ)W − η s O."""
        mu, buf = self.momentum, state["momentum_buffer"]
        buf += (1.0 - mu) * (grad - buf)                       # B ← B + (1 − μ)(g − B)
        U = buf + (1.0 - mu) * (grad - buf) if self.nesterov else buf
        O = newton_schulz(U, self.ns_coefficients, self.ns_steps, self.eps)
        param *= 1.0 - self.lr * self.weight_decay             # decoupled decay, unscaled η
        param -= adjust_lr(self.lr, self.adjust_lr_fn, param.shape) * O


class ParameterGroup:
    """The parameters of ``model`` named in ``names``, as an optimizer sees them (frozen ones
    included, with gradient None, so the optimizer skips them as it would on the model).
    ``flat_buffers()`` is None: the optimizer updates the arrays one at a time."""

    def __init__(self, model, names):
        self.model, self.names = model, frozenset(names)

    def named_parameters(self, prefix=""):
        return ((n, p, g) for n, p, g in self.model.named_parameters(prefix) if n in self.names)

    def flat_buffers(self):
        return None


def is_hidden_matrix(name, param):
    """The default rule of ``split_parameters``: a 2-D parameter of the block stack (its name
    starts with ``blocks.``), as nanochat gives Muon ``transformer.h`` and modded-nanogpt the
    matrices of ``model.blocks``. Embeddings, the LM head, gains and biases are not."""
    return param.ndim == 2 and name.startswith("blocks.")


def split_parameters(model, hidden=is_hidden_matrix):
    """``(muon_names, adamw_names)``: the names of ``model.named_parameters()`` (frozen ones too)
    for which ``hidden(name, param)`` holds, and the others, each in the model's order. A tied
    array (one array under several names, the tied embedding and head) goes to Muon only if every
    one of its names is hidden, so one optimizer owns it."""
    named = list(model.named_parameters())
    owner = {}
    for name, param, _ in named:
        owner[id(param)] = owner.get(id(param), True) and bool(hidden(name, param))
    return ([name for name, param, _ in named if owner[id(param)]],
            [name for name, param, _ in named if not owner[id(param)]])


class MuonAdamW:
    """Muon for the hidden matrices and AdamW for everything else, stepped as one optimizer.

    ``MuonAdamW(model, muon={"lr": 0.02, ...}, adamw={"lr": 3e-3, "betas": (0.9, 0.95), ...},
    hidden=is_hidden_matrix)``: ``muon`` and ``adamw`` are the keyword arguments of ``Muon`` and
    of ``tformer.training.optim.AdamW`` (their defaults where left out), ``hidden`` the rule of
    ``split_parameters``. ``step()`` updates both; ``model.zero_grad()`` clears the gradients.

    ``lr`` is Muon's learning rate; setting it (a schedule, ``train(lr_schedule=...)``) moves
    AdamW's in proportion, η_AdamW = η_AdamW,0 · lr / η_Muon,0 (the ratio given at construction),
    as nanochat scales every group by one schedule. ``state_dict`` is one flat dict: ``t``,
    ``lr``, the two initial lrs, and each optimizer's own entries under ``muon.`` and ``adamw.``.

    A model with no trained hidden matrix raises ValueError (use AdamW); one whose other
    parameters are all frozen (LoRA's ``Adapters``) has ``adamw`` None. A ZeRO-1 shard raises
    ValueError (see the module docstring).
    """

    def __init__(self, model, muon=None, adamw=None, hidden=is_hidden_matrix):
        refuse_zero1(model)
        if not hasattr(model, "named_parameters"):
            raise TypeError(f"model must have named_parameters(), got {type(model).__name__}")
        for arg, kw in (("muon", muon), ("adamw", adamw)):
            if kw is not None and not isinstance(kw, dict):
                raise TypeError(f"{arg}: expected a dict of keyword arguments, got {kw!r}")
        self.model = model
        groups = [ParameterGroup(model, names) for names in split_parameters(model, hidden)]
        trained = [any(g is not None for _, _, g in group.named_parameters()) for group in groups]
        if not trained[0]:
            raise ValueError("model: no trained hidden matrix for Muon (by default a 2-D "
                             "parameter whose name starts with 'blocks.'); use AdamW alone")
        self.muon = Muon(groups[0], **(muon or {}))
        self.adamw = AdamW(groups[1], **(adamw or {})) if trained[1] else None
        if self.muon.lr == 0:
            raise ValueError("muon['lr'] must be > 0 (AdamW's lr follows it in proportion), "
                             "got 0.0")
        self.base_lr = (self.muon.lr, self.adamw.lr if self.adamw else 0.0)

    def _parts(self):
        return [(k, o) for k, o in (("muon", self.muon), ("adamw", self.adamw)) if o is not None]

    @property
    def lr(self):
        return self.muon.lr

    @lr.setter
    def lr(self, value):
        self.muon.lr = value
        if self.adamw is not None:
            self.adamw.lr = self.base_lr[1] * (self.muon.lr / self.base_lr[0])

    @property
    def t(self):
        return self.muon.t

    @property
    def state(self):
        """Every trained parameter's state: ``{name: {slot: array}}`` of both optimizers."""
        return {name: s for _, opt in self._parts() for name, s in opt.state.items()}

    def step(self):
        """One step of both optimizers (Muon's matrices, then AdamW's arrays)."""
        for _, opt in self._parts():
            opt.step()

    def state_dict(self):
        sd = {"optimizer": type(self).__name__, "t": self.t, "lr": self.lr,
              "base_lr_muon": self.base_lr[0], "base_lr_adamw": self.base_lr[1]}
        for prefix, opt in self._parts():
            sd.update({f"{prefix}.{k}": v for k, v in opt.state_dict().items()})
        return sd

    def load_state_dict(self, sd):
        """Restore both optimizers; everything is checked (each part's own checks) before the
        first change is kept: a failure in AdamW's part puts Muon's back."""
        own = {"optimizer", "t", "lr", "base_lr_muon", "base_lr_adamw"}
        parts = dict(self._parts())
        missing = sorted(own - set(sd))
        unexpected = sorted(k for k in sd if k not in own and k.split(".", 1)[0] not in parts)
        if missing or unexpected:
            raise ValueError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, "
                             f"unexpected keys {unexpected}")

        def scalar(key):
            value = sd[key]
            return value.item() if isinstance(value, np.ndarray) else value

        if str(scalar("optimizer")) != type(self).__name__:
            raise ValueError(f"state dict is for optimizer {scalar('optimizer')!r}, "
                             f"not {type(self).__name__!r}")
        base = (_check_float("base_lr_muon", scalar("base_lr_muon"), 0.0, low_open=True),
                _check_float("base_lr_adamw", scalar("base_lr_adamw"), 0.0))
        backup = self.muon.state_dict()
        try:
            for prefix, opt in parts.items():
                opt.load_state_dict({k[len(prefix) + 1:]: v for k, v in sd.items()
                                     if k.startswith(prefix + ".")})
        except (ValueError, TypeError):
            self.muon.load_state_dict(backup)
            raise
        self.base_lr = base

    def __repr__(self):
        return f"{type(self).__name__}(muon={self.muon!r}, adamw={self.adamw!r})"
