"""LoRA: a frozen linear layer plus a trainable low-rank update (Hu et al., 2021).

    Y = X (W + s A B) + b,    A: (C_in, r),  B: (r, C_out),  s = α / r,  W and b frozen

``B`` starts at zero, so an adapted model starts as the base model, bit for bit. Only ``A`` and
``B`` are trained (biases and norms stay frozen too, by ``Module.freeze``): r (C_in + C_out)
numbers per layer instead of C_in C_out. The backward pass never forms dW; it needs

    dA = s Xᵀ (dY Bᵀ),    dB = s (X A)ᵀ dY,    dX = dY Wᵀ + s (dY Bᵀ) Aᵀ.

``apply_lora(model, r, alpha, targets)`` freezes the model and wraps linear layers of it by name,
in place, so every frozen layer's backward skips its dW too (the layers without an adapter as
well); ``Adapters(model)`` is what the optimizer, the gradient clipping and a fine-tuning
checkpoint see (the trained parameters: the adapters' A and B, nothing else);
``merge_lora(model)`` folds W ← W + s A B for inference, which leaves a plain model again. The
adapter file (A, B, r, α, targets and the base model's fingerprint) is ``tformer.training.lora_file``.
"""
import hashlib
import math

import numpy as np

from tformer.nn.layers import Linear, Module, copy_state

# Target names beyond a layer's own name (``qkv``, ``o``, ``fc1``, ``lm_head``, ...): groups.
GROUPS = {"attn": ("qkv", "q", "k", "v", "o"), "mlp": ("fc1", "fc2")}
ALL = "all"                     # every Linear of the model, the LM head included


def check_rank(r, name="r"):
    """r: an integer ≥ 1, else ValueError (TypeError for a non-integer) naming ``name``."""
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer ≥ 1, got {type(r).__name__} {r!r}")
    if r < 1:
        raise ValueError(f"{name}: expected an integer ≥ 1, got {r}")
    return int(r)


def check_alpha(alpha, name="alpha"):
    """α: a finite number > 0, else ValueError naming ``name``."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) \
            or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"{name}: expected a finite number > 0, got {alpha!r}")
    return float(alpha)


class LoRALinear(Module):
    """Y = X (W + s A B) + b around a frozen ``Linear`` (its W and b are not trained).

    Shapes: ``x: (..., C_in)`` -> ``(..., C_out)``; ``A: (C_in, r)`` drawn from
    U(−1/√C_in, 1/√C_in), ``B: (r, C_out)`` zeros, ``s = alpha / r``. The wrapped layer is the
    child ``base`` (its kernel computes X W + b), frozen here (``Module.freeze``: W and b have
    no gradient for an optimizer or the clipping to see); ``backward`` accumulates dA and dB only.
    """

    saved = ("_cache",)

    def __init__(self, base, r, alpha, rng=None, seed=0):
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"base: expected a tformer.nn.layers.Linear, got {type(base).__name__}")
        r, alpha = check_rank(r), check_alpha(alpha)
        C_in, C_out = base.W.shape
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(seed)
        bound = 1.0 / math.sqrt(C_in)
        self.base = base.freeze()                     # W and b: requires_grad = False
        self.r, self.alpha, self.scale = r, alpha, alpha / r
        self.A = self.add_param("A", rng.uniform(-bound, bound, (C_in, r)).astype(base.W.dtype))
        self.B = self.add_param("B", np.zeros((r, C_out), base.W.dtype))
        self._cache = None

    def forward(self, x, out=None):
        """x: (..., C_in) -> (..., C_out); ``out``: an array to write the result into."""
        y = self.base(x, out=out)                     # X W + b: the frozen layer's own kernel
        x2 = x.reshape(-1, self.A.shape[0])           # (N, C_in), N = B·T
        h = x2 @ self.A                               # X A: (N, r)
        y2 = y.reshape(-1, self.B.shape[1])           # (N, C_out), a view of y
        y2 += self.scale * (h @ self.B)               # + s (X A) B
        self._cache = (x2, h, x.shape)
        return y

    def backward(self, dy):
        """dy: (..., C_out) -> dx: (..., C_in); accumulates dA and dB (no dW: W is frozen)."""
        x2, h, shape = self._cache                    # X: (N, C_in), X A: (N, r)
        dy2 = dy.reshape(-1, self.B.shape[1])         # (N, C_out)
        dh = self.scale * (dy2 @ self.B.T)            # s dY Bᵀ: (N, r)
        self.grads["A"] += x2.T @ dh                  # dA = s Xᵀ (dY Bᵀ): (C_in, r)
        self.grads["B"] += self.scale * (h.T @ dy2)   # dB = s (X A)ᵀ dY: (r, C_out)
        # dY Wᵀ by ``@`` (in bfloat16 it returns float32), not the frozen base's backward
        # (``fast.linear.linear_backward_without_dW``, which rounds to bfloat16): LoRA's bits.
        dx = dy2 @ self.base.W.T                      # dY Wᵀ: (N, C_in)
        dx += dh @ self.A.T                           # + s (dY Bᵀ) Aᵀ
        return dx.reshape(shape)

    def rows(self, x):
        """The rows ``x: (N, C_in)`` of one decoding step (``tformer.decoding.kv_cache``): X W + b by the
        base layer's ``rows``, + s (X A) B, the arithmetic of ``forward``."""
        y = self.base.rows(x)                         # (N, C_out)
        y += self.scale * ((x @ self.A) @ self.B)     # + s (X A) B
        return y

    @property
    def W(self):
        """The frozen base weight (its shape and dtype are the layer's; the layer computes with
        W + s A B)."""
        return self.base.W

    def merged_weight(self):
        """W + s A B: the weight of the one Linear this layer computes."""
        return self.base.W + self.scale * (self.A @ self.B)


def linear_layers(model):
    """``[(path, layer)]`` for every Linear or LoRALinear of ``model`` (not the Linear inside a
    LoRALinear), depth first (``Module.named_layers``): what LoRA swaps with ``Module.replace``."""
    return model.named_layers(Linear, LoRALinear)


def target_names(model):
    """The names ``targets`` may use for ``model``: its linear layers' own names (the last part
    of their path: ``qkv``, ``o``, ``fc1``, ``fc2``, ``lm_head``), the groups that contain one
    of them (``attn``, ``mlp``) and ``all``."""
    own = {path.rsplit(".", 1)[-1] for path, _ in linear_layers(model)}
    groups = {g for g, members in GROUPS.items() if own & set(members)}
    return sorted(own | groups | {ALL})


def resolve_targets(model, targets):
    """The paths of the linear layers named by ``targets`` (a name or a list of names), in
    model order; ValueError naming ``targets`` on an unknown name or an empty list."""
    names = [targets] if isinstance(targets, str) else list(targets)
    known = target_names(model)
    unknown = [t for t in names if t not in known]
    if not names or unknown:
        raise ValueError(f"targets: expected names among {known}, got "
                         f"{unknown[0] if unknown else names}")
    wanted = set()
    for t in names:
        wanted |= {ALL} if t == ALL else set(GROUPS.get(t, (t,)))
    return [path for path, _ in linear_layers(model)
            if ALL in wanted or path.rsplit(".", 1)[-1] in wanted]


def apply_lora(model, r, alpha=None, targets=("attn",), seed=0):
    """Freeze every parameter of ``model`` (``Module.freeze``), then wrap the linear layers named by
    ``targets`` in ``LoRALinear`` (rank ``r``, ``alpha`` default r, so s = 1), in place; returns
    their paths. The adapters' A and B are then the model's only trained parameters, and every
    other layer's backward pass computes its input gradient alone (``merge_lora`` leaves the
    merged model frozen, as peft's ``merge_and_unload`` leaves ``requires_grad`` off).

    The model's parameters are gathered into one flat buffer again (the base weights keep their
    bits), so that the batch is still cut across threads (``tformer.training.batch_threads``).
    """
    r = check_rank(r)
    alpha = float(r) if alpha is None else check_alpha(alpha)
    if getattr(model, "lora", None):
        raise ValueError("model: already has LoRA adapters (merge_lora first to add others)")
    paths = resolve_targets(model, targets)
    model.freeze()
    rng = np.random.default_rng(seed)
    for path, child in linear_layers(model):
        if path in paths:
            model.replace(path, LoRALinear(child, r, alpha, rng))
    model.lora = {"r": r, "alpha": alpha, "targets": [targets] if isinstance(targets, str) else list(targets),
                  "layers": paths}
    if model.flattened():
        model.flatten_parameters()
    return paths


def merge_lora(model):
    """W ← W + s A B in every ``LoRALinear`` of ``model``, which becomes its plain ``Linear``
    again (in place; returns ``model``): the same function, the base model's speed."""
    for path, child in linear_layers(model):
        if isinstance(child, LoRALinear):
            child.base.W[...] = child.merged_weight()
            model.replace(path, child.base)
    model.lora = None
    if model.flattened():
        model.flatten_parameters()
    return model


def base_parameters(model):
    """``[(name, array)]``: the parameters of ``model`` that are not LoRA adapters (each once)."""
    seen = {id(m.params[k]) for m in model.modules() if isinstance(m, LoRALinear) for k in ("A", "B")}
    found = []                       # the module tree's own walk: an ``Adapters`` view yields A, B only
    for path, m in model.named_modules():
        for key, p in m.params.items():
            if id(p) not in seen:
                seen.add(id(p))
                found.append((f"{path}.{key}" if path else key, p))
    return found


def fingerprint(model):
    """SHA-256 (hex) of the base parameters of ``model``: shapes and float32 bytes, in order.
    The same before and after adapters are added (the base weights keep their bits)."""
    h = hashlib.sha256()
    for _, p in base_parameters(model):
        h.update(str(p.shape).encode())
        h.update(np.ascontiguousarray(p, dtype=np.float32).tobytes())
    return h.hexdigest()


class Adapters:
    """The trainable part of a model with LoRA adapters: its A and B, nothing else.

    ``named_parameters()`` yields only the parameters that are not frozen: after ``apply_lora``
    (which freezes everything else) the adapters' ``(name, A or B, gradient)``. An optimizer
    built on this view keeps moments for them alone, gradient clipping measures their norm, and
    ``state_dict()`` / ``load_state_dict()`` (a fine-tuning checkpoint) hold them alone. Anything
    else (``forward``, ``backward``, ``zero_grad``, ``train``, ``eval``, ``config``, ...) is the
    model's. ``config`` adds the adapters' ``lora`` entry to the model's, so a checkpoint of
    other adapters, or of adapters trained on another base, is refused. ``flat_buffers()`` is
    None: the optimizer updates A and B one array at a time (a few dozen small arrays).
    """

    def __init__(self, model):
        if not any(isinstance(m, LoRALinear) for m in model.modules()):
            raise ValueError("model: has no LoRA adapters (apply_lora first)")
        self.model = model

    def __getattr__(self, name):
        if name == "model":                   # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    def named_parameters(self, prefix=""):
        return ((name, p, g) for name, p, g in self.model.named_parameters(prefix) if g is not None)

    def num_trainable(self):
        """Number of trained scalars: Σ over adapted layers of r (C_in + C_out)."""
        return sum(p.size for _, p, _ in self.named_parameters())

    def flat_buffers(self):
        return None

    @property
    def config(self):
        """The model's config and ``lora``: r, α, targets and the base model's fingerprint."""
        cfg = dict(getattr(self.model, "config", {}))
        lora = self.model.lora
        cfg["lora"] = {**{k: lora[k] for k in ("r", "alpha", "targets")},
                       "base_fingerprint": fingerprint(self.model)}
        return cfg

    def state_dict(self):
        return {name: p.copy() for name, p, _ in self.named_parameters()}

    def load_state_dict(self, state):
        """Copy A and B in from ``state``; ValueError on missing/unexpected keys or shapes."""
        copy_state({name: p for name, p, _ in self.named_parameters()}, state)
        return self

    def forward(self, *args, **kwargs):
        return self.model.forward(*args, **kwargs)

    __call__ = forward

    def backward(self, dy):
        return self.model.backward(dy)
