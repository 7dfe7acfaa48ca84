"""Post-training int8 quantization: int8 weights (w8), and int8 weights and activations (w8a8).

Symmetric uniform quantization with step s maps a real number w to the integer q = round(w / s),
clipped to [−127, 127], and back to q·s. The rounding error is at most s/2 per entry.

- **Weights**, per output channel: column j of ``W: (d_in, d_out)`` gets its own step
  s_j = max_i ``|W_ij|`` / 127, so the largest entry of each column maps to ±127 exactly. An
  embedding table ``(V, C)`` gets one step per row (per token).
- **Activations** (w8a8 only), per token and dynamically: each row x_n of the layer's input gets
  a_n = max_i ``|x_ni|`` / 127 when it arrives.
- **The product.** With X ≈ a ⊙ X_q and W ≈ Q ⊙ s, Y = X W ≈ (X_q Q) ⊙ (a sᵀ) + b: an integer
  matrix product, then one float scale per output entry. Each X_q Q entry is a sum of K products
  of two integers in [−127, 127], which int8 hardware accumulates in int32, exactly. NumPy has no
  integer BLAS; float32 BLAS on integer-valued arrays gives the same, exact, result as long as
  every partial sum is an integer below 2²⁴ in magnitude (float32 holds every integer up to 2²⁴,
  and a sum of two such integers is rounded only if it exceeds that): guaranteed when
  K·127² ≤ 2²⁴, i.e. K ≤ 1040, in any summation order. Beyond that the product runs in float64,
  exact up to K·127² ≤ 2⁵³. ``int_matmul`` does this.
- **w8** keeps activations in float32 and stores W as int8: Y = (X Q) ⊙ s + b. On this CPU it
  saves memory and file size, not time: Q is cast to float32 for every product.

LayerNorm parameters and biases stay float32 (they are few and sensitive). ``quantize_model``
turns a trained float model into an inference-only quantized one, in place; ``save_quantized``
and ``load_quantized`` write and read its file (a ``.npz`` archive: ``int8/<layer>.W`` and
``scale/<layer>.W`` for every quantized weight, ``model/<name>`` for the float parameters, and a
JSON ``meta`` with the configuration, the scheme and the quantized layers' shapes).
``load_model`` loads either kind of checkpoint, int8 or float, into a model for inference.
"""
import json

import numpy as np

from tformer.core.validate import float_array, int_array, index_range
from tformer.training.checkpoint import check_config, load_checkpoint, read_checkpoint, read_npz, write_npz
from tformer.nn.layers import Embedding, Linear, Module

QMAX = 127
SCHEMES = ("w8", "w8a8")
FORMAT = 1
_EXACT_F32_K = 2 ** 24 // (QMAX * QMAX)       # 1040: the longest exact float32 integer dot product


def check_scheme(scheme):
    """``scheme`` is ``"w8"`` or ``"w8a8"``, else ValueError naming it."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {list(SCHEMES)}, got {scheme!r}")
    return scheme


def quantize_tensor(w, axis):
    """q = round(w / s), s = ``max|w|`` / 127 along ``axis`` (one step per slice of the other axis).

    ``w: (n, m)`` float; ``axis=0`` gives one step per column (``s: (m,)``, Linear weights),
    ``axis=1`` one per row (``s: (n,)``, embedding tables). An all-zero slice gets s = 1 (its q
    is 0 whatever s is). Computed in float64, so ``|w − q·s| ≤ s/2`` holds to float64 rounding.
    Returns ``(q: int8 like w, s: float32)``.
    """
    float_array("w", w, ndim=2)
    w64 = w.astype(np.float64)
    s = (np.abs(w64).max(axis=axis) / QMAX).astype(np.float32)
    s[s == 0] = 1.0
    if not np.isfinite(s).all():
        raise ValueError("w: contains inf or NaN; it cannot be quantized")
    q = np.rint(w64 / np.expand_dims(s.astype(np.float64), axis))
    return np.clip(q, -QMAX, QMAX).astype(np.int8), s


def dequantize_tensor(q, s, axis):
    """w ≈ q · s (float32), ``s`` broadcast along ``axis`` as in ``quantize_tensor``."""
    return q.astype(np.float32) * np.expand_dims(s, axis)


def quantize_rows(x):
    """Per-row (per-token) dynamic quantization: a_n = max_i ``|x_ni|`` / 127, X_q = round(X / a).

    ``x: (N, K)`` float32 -> ``(xq: (N, K)`` integer values in [−127, 127], kept as float32 for the
    product, ``a: (N, 1)`` float32). An all-zero row gets a = 1.
    """
    a = np.abs(x).max(axis=1, keepdims=True) / np.float32(QMAX)       # (N, 1)
    a[a == 0] = 1.0
    xq = np.rint(x / a)
    np.clip(xq, -QMAX, QMAX, out=xq)
    return xq, a


def int_matmul(xq, q):
    """X_q Q, exactly: integer operands in [−127, 127], integer result (int32 accumulation).

    float32 BLAS when K·127² ≤ 2²⁴ (K ≤ 1040: every partial sum is an integer float32 holds
    exactly), else float64 BLAS. ``xq: (N, K)`` integer-valued, ``q: (K, M)`` int8  ->  ``(N, M)``
    float32 (for K ≤ 1040) or float64, holding the exact integers.
    """
    K = q.shape[0]
    dt = np.float32 if K <= _EXACT_F32_K else np.float64
    return np.matmul(xq.astype(dt, copy=False), q.astype(dt))


class QuantizedLinear(Module):
    """Y = (X Q) ⊙ s + b (w8) or Y = (X_q Q) ⊙ (a sᵀ) + b (w8a8), for inference.

    ``q: (d_in, d_out)`` int8, ``scale: (d_out,)`` float32, ``b: (d_out,)`` float32 or None (a
    float parameter, saved as ``<layer>.b`` as before). ``x: (..., d_in)`` float32 ->
    ``(..., d_out)`` float32.
    """

    def __init__(self, q, scale, b, scheme):
        super().__init__()
        self.scheme = check_scheme(scheme)
        self.q, self.scale = q, scale
        self.b = self.add_param("b", b) if b is not None else None

    @classmethod
    def from_linear(cls, layer, scheme):
        q, s = quantize_tensor(np.asarray(layer.params["W"], np.float32), axis=0)
        b = layer.params.get("b")
        return cls(q, s, None if b is None else np.array(b, np.float32), scheme)

    @property
    def W(self):
        """The dequantized weight Q ⊙ s, float32 (computed on access)."""
        return dequantize_tensor(self.q, self.scale, 0)

    def forward(self, x):
        float_array("x", x, min_ndim=1)
        if x.shape[-1] != self.q.shape[0]:
            raise ValueError(f"x: last axis must match the weight's first: x {x.shape}, W {self.q.shape}")
        x2 = x.reshape(-1, self.q.shape[0]).astype(np.float32, copy=False)       # (N, d_in)
        if self.scheme == "w8":
            y = x2 @ self.q.astype(np.float32)                                  # (N, d_out)
            y *= self.scale
        else:
            xq, a = quantize_rows(x2)
            y = int_matmul(xq, self.q)                                          # exact integers
            y = (y * a).astype(np.float32) * self.scale                         # ⊙ a sᵀ
        if self.b is not None:
            y += self.b
        return y.reshape(*x.shape[:-1], self.q.shape[1])                         # (..., d_out)

    def rows(self, x):
        """The rows ``x: (N, d_in)`` of one decoding step (``tformer.decoding.kv_cache``): ``forward``, whose
        int8 arithmetic is the layer's in every step."""
        return self.forward(x)

    def backward(self, dy):
        raise RuntimeError("QuantizedLinear: a quantized model is for inference only (no backward)")


class QuantizedEmbedding(Module):
    """E = Q[tokens] ⊙ s[tokens]: an int8 table ``(V, C)`` with one float32 step per row."""

    def __init__(self, q, scale):
        super().__init__()
        self.q, self.scale = q, scale

    @classmethod
    def from_embedding(cls, layer, scheme=None):
        return cls(*quantize_tensor(np.asarray(layer.params["W"], np.float32), axis=1))

    @property
    def W(self):
        """The dequantized table Q ⊙ s, float32 (for code that slices it, e.g. TinyGPT's positions)."""
        return dequantize_tensor(self.q, self.scale, 1)

    def forward(self, tokens):
        int_array("tokens", tokens)
        index_range("tokens", tokens, 0, self.q.shape[0])
        return self.q[tokens].astype(np.float32) * self.scale[tokens][..., None]   # (B, T, C)

    def backward(self, dE):
        raise RuntimeError("QuantizedEmbedding: a quantized model is for inference only (no backward)")


_KINDS = {"linear": (Linear, QuantizedLinear, 0), "embedding": (Embedding, QuantizedEmbedding, 1)}


def _quantizable(model):
    """``[(path, kind, module)]`` for every Linear / Embedding (or already quantized one) of
    ``model``, depth first (``Module.named_layers``): what int8 swaps with ``Module.replace``."""
    kinds = {cls: k for k, (float_cls, q_cls, _) in _KINDS.items() for cls in (float_cls, q_cls)}
    return [(path, next(k for cls, k in kinds.items() if isinstance(m, cls)), m)
            for path, m in model.named_layers(*kinds)]


def _weight_shape(module):
    return tuple(module.q.shape) if hasattr(module, "q") else tuple(module.params["W"].shape)


def quantize_model(model, scheme="w8"):
    """Replace every ``Linear`` (LM head included) by a ``QuantizedLinear`` and every
    ``Embedding`` by a ``QuantizedEmbedding``, in place; returns ``model`` (now inference only).

    Call it on a float32 model in eval mode, after training (and not on a model training in mixed
    precision: its float32 masters are what gets quantized either way).
    """
    check_scheme(scheme)
    targets = _quantizable(model)
    if not targets:
        raise ValueError(f"model: no Linear or Embedding layer to quantize in {type(model).__name__}")
    new = []
    for path, kind, module in targets:
        if not isinstance(module, _KINDS[kind][0]):
            raise ValueError(f"model: layer {path!r} is already quantized")
        new.append((path, (QuantizedLinear.from_linear(module, scheme) if kind == "linear"
                           else QuantizedEmbedding.from_embedding(module))))
    for path, q in new:
        model.replace(path, q)
    model.quantization = scheme
    model.eval()
    return model


def dequantized(model):
    """A float32 copy of a quantized ``model`` whose config is its keywords (TinyGPT): every int8
    weight turned back into Q ⊙ s once (the int8 layers compute it again at every call), the
    float parameters copied; in eval mode. A float model gives a float copy."""
    out = type(model)(**model.config)
    layers = {path: module for path, _, module in _quantizable(model)}
    floats = {n: p for n, p, _ in model.named_parameters()}
    for name, p, _ in out.named_parameters():
        path, _, leaf = name.rpartition(".")
        p[...] = layers[path].W if leaf == "W" and path in layers else floats[name]
    return out.eval()


def save_quantized(path, model, step=0, extra=None):
    """Write the quantized ``model`` to ``path`` atomically (see the module docstring). Returns ``path``."""
    scheme = getattr(model, "quantization", None)
    if scheme is None:
        raise ValueError("model: not quantized; call quantize_model(model, scheme) first")
    arrays, layers = {}, {}
    for lpath, kind, module in _quantizable(model):
        if not isinstance(module, _KINDS[kind][1]):
            raise ValueError(f"model: layer {lpath!r} is not quantized")
        arrays[f"int8/{lpath}.W"] = module.q
        arrays[f"scale/{lpath}.W"] = module.scale
        layers[lpath] = {"kind": kind, "shape": list(module.q.shape)}
    for name, p, _ in model.named_parameters():
        arrays[f"model/{name}"] = np.asarray(p, np.float32)
    meta = {"config": dict(getattr(model, "config", {})), "step": int(step), "extra": extra or {},
            "quantized": {"format": FORMAT, "scheme": scheme, "layers": layers}}
    arrays["meta"] = np.array(json.dumps(meta))
    return write_npz(path, arrays)


def _bad(path, msg):
    return ValueError(f"path: {path!r} is not a valid quantized checkpoint for this model: {msg}")


def load_quantized(path, model, config=None):
    """Load the quantized checkpoint ``path`` into ``model`` (a float model of the same config);
    returns the metadata dict.

    Everything is checked before the model is touched: the configuration (against ``config``,
    default ``model.config``), every layer's kind and shape, the int8 arrays, the steps (finite,
    > 0), the values (in [−127, 127]) and the float parameters. On any mismatch it raises
    ValueError naming the layer and leaves ``model`` as it was.
    """
    meta, arrays = read_npz(path)
    info = meta.get("quantized")
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise _bad(path, f"expected quantized format {FORMAT}, got {info!r:.80}")
    scheme = info.get("scheme")
    if scheme not in SCHEMES:
        raise _bad(path, f"scheme {scheme!r} is not one of {list(SCHEMES)}")
    check_config(path, dict(config if config is not None else getattr(model, "config", {})),
                 meta.get("config", {}))
    targets = {t[0]: t for t in _quantizable(model)}
    layers = info.get("layers", {})
    if set(layers) != set(targets):
        raise _bad(path, f"quantized layers {sorted(set(layers) ^ set(targets))} are in only one "
                         f"of the file and the model")
    new = []
    for lpath, (_, kind, module) in targets.items():
        entry = layers[lpath]
        shape = _weight_shape(module)
        if entry.get("kind") != kind or tuple(entry.get("shape", ())) != shape:
            raise _bad(path, f"layer {lpath!r} is a {entry.get('kind')} of shape "
                             f"{tuple(entry.get('shape', ()))} in the file, a {kind} of shape {shape} "
                             f"in the model")
        q, s = arrays.get(f"int8/{lpath}.W"), arrays.get(f"scale/{lpath}.W")
        axis = _KINDS[kind][2]
        if q is None or s is None:
            raise _bad(path, f"layer {lpath!r} lacks its int8 weight or its scale")
        if q.dtype != np.int8 or q.shape != shape:
            raise _bad(path, f"int8/{lpath}.W is {q.dtype} {q.shape}, expected int8 {shape}")
        if s.dtype != np.float32 or s.shape != (shape[1 - axis],):
            raise _bad(path, f"scale/{lpath}.W is {s.dtype} {s.shape}, expected float32 "
                             f"({shape[1 - axis]},)")
        if q.size and int(np.abs(q.astype(np.int16)).max()) > QMAX:
            raise _bad(path, f"int8/{lpath}.W holds −128, outside the symmetric range [−127, 127]")
        if not (np.isfinite(s).all() and (s > 0).all()):
            raise _bad(path, f"scale/{lpath}.W holds a step that is not finite and > 0")
        new.append((lpath, kind, q, s))
    weights = {f"{lpath}.W" for lpath in targets}
    expected = {n: p.shape for n, p, _ in model.named_parameters() if n not in weights}
    floats = {k[6:]: v for k, v in arrays.items() if k.startswith("model/")}
    if set(floats) != set(expected):
        raise _bad(path, f"float parameters missing {sorted(set(expected) - set(floats))}, "
                         f"unexpected {sorted(set(floats) - set(expected))}")
    for n, v in floats.items():
        if v.dtype != np.float32 or v.shape != expected[n] or not np.isfinite(v).all():
            raise _bad(path, f"model/{n} is {v.dtype} {v.shape}, expected finite float32 {expected[n]}")
    # Everything checked: now change the model.
    for lpath, kind, q, s in new:
        b = floats.get(f"{lpath}.b") if kind == "linear" else None
        model.replace(lpath, QuantizedLinear(q, s, b, scheme) if kind == "linear" else QuantizedEmbedding(q, s))
    for n, p, _ in model.named_parameters():
        np.copyto(p, floats[n])
    model.quantization = scheme
    model.eval()
    return meta


def load_model(path, model, config=None):
    """Load checkpoint ``path`` into ``model`` for inference, whichever kind it is: an int8 one
    (``load_quantized``) or a float one (``tformer.training.checkpoint.load_checkpoint``). Returns the
    metadata dict."""
    if "quantized" in read_checkpoint(path)[0]:
        return load_quantized(path, model, config)
    return load_checkpoint(path, model, config=config)
