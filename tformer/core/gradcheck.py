"""Central-difference gradient checks, in float64, with a random upstream gradient.

For a function ``y = f(x)`` and a random upstream gradient ``g`` (never all ones: through a softmax
an all-ones ``g`` has an exactly zero gradient and would prove nothing), the scalar
``L = ⟨g, f(x)⟩`` has ``∂L/∂x = (backward of f)(g)``, and each entry of that can be estimated as
``(L(x + h eᵢ) − L(x − h eᵢ)) / 2h``, with error O(h²). The error reported is
``max |analytic − numeric| / max(max |analytic|, max |numeric|, tiny)`` per array (a normwise
relative error that does not blow up on entries that are zero), maximised over arrays. An array
whose true gradient is zero (a key bias: softmax ignores a shift shared by all keys) has only
finite-difference noise to compare, so each array's scale is floored at ``FLOOR`` times the largest
gradient of the whole check.
"""
import numpy as np

TINY = 1e-30
FLOOR = 1e-2


def _as_tuple(grads):
    return grads if isinstance(grads, tuple) else (grads,)


def rel_error(a, b, floor=0.0):
    """``max |a − b| / max(max |a|, max |b|, floor, tiny)``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = max(np.abs(a).max(initial=0.0), np.abs(b).max(initial=0.0), floor, TINY)
    return float(np.abs(a - b).max(initial=0.0) / scale)


def _entries(x, rng, max_entries):
    n = x.size
    if max_entries is None or n <= max_entries:
        return range(n)
    return rng.choice(n, size=max_entries, replace=False)


def numerical_grad(scalar_fn, x, h=1e-6, rng=None, max_entries=None):
    """∂L/∂x by central differences, perturbing ``x`` in place (and restoring it).

    Returns ``(numeric, idx)``: estimates at the flat indices ``idx`` (all entries by default,
    else ``max_entries`` of them drawn with ``rng``).
    """
    idx = np.asarray(list(_entries(x, rng, max_entries)), dtype=np.int64)
    flat = x.reshape(-1)
    if not np.shares_memory(flat, x):
        raise ValueError("x: must be contiguous so that it can be perturbed in place")
    out = np.empty(idx.size)
    for n, i in enumerate(idx):
        old = flat[i]
        flat[i] = old + h
        plus = scalar_fn()
        flat[i] = old - h
        minus = scalar_fn()
        flat[i] = old
        out[n] = (plus - minus) / (2 * h)
    return out, idx


def check_kernel(forward, backward, inputs, wrt=None, kwargs=None, seed=0, h=1e-6, max_entries=None):
    """Max relative error between ``backward`` and central differences of ``forward``.

    ``forward(*inputs, **kwargs) -> (y, cache)``; ``backward(g, cache)`` returns one gradient per
    float (differentiable) input, in order (a tuple, or one array); integer inputs such as token
    ids have none. ``wrt`` lists the positions of the inputs to check (default:
    every float input). Inputs must be float64. Returns the largest relative error over them.
    """
    kwargs = kwargs or {}
    rng = np.random.default_rng(seed)
    inputs = [np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x for x in inputs]
    floats = [i for i, x in enumerate(inputs) if isinstance(x, np.ndarray) and x.dtype.kind == "f"]
    wrt = floats if wrt is None else list(wrt)
    for i in wrt:
        if inputs[i].dtype != np.float64:
            raise TypeError(f"inputs[{i}]: gradient checks run in float64, got {inputs[i].dtype}")
    y, cache = forward(*inputs, **kwargs)
    g = np.random.default_rng([seed, 7919]).standard_normal(np.shape(y))
    analytic = _as_tuple(backward(g.copy(), cache))

    def L():
        return float(np.vdot(g, forward(*inputs, **kwargs)[0]))

    pairs = []
    for i in wrt:
        num, idx = numerical_grad(L, inputs[i], h, rng, max_entries)
        pairs.append((np.asarray(analytic[floats.index(i)]).reshape(-1)[idx], num))
    return max(_errors(pairs))


def _errors(pairs):
    top = max((np.abs(a).max(initial=0.0) for a, _ in pairs), default=0.0)
    return [rel_error(a, n, FLOOR * top) for a, n in pairs]


def check_module(module, x, seed=0, h=1e-6, max_entries=None, check_input=True, loss=None):
    """Max relative error of every parameter gradient (and ``dx``) of a Module against central differences.

    Runs ``y = module.forward(x)``, then backward with a random upstream gradient ``g`` (or, with
    ``loss``, ``loss(y) -> (L, dy)`` supplies both the scalar and its gradient), and compares
    each ``grads[name]`` with the numeric derivative of ``⟨g, forward(x)⟩``. ``dx`` is checked when
    ``x`` is a float array and ``check_input`` is true. The module must be deterministic
    (dropout off: ``module.eval()`` or p = 0) and in float64. ``x`` is perturbed in place, so a
    ``loss`` whose target is ``x`` itself (reconstruction) must hold a copy of it.
    Frozen parameters (``Module.freeze``) have no gradient and are not checked.
    Returns a dict ``{name: relative error}``; ``max(d.values())`` is the headline number.
    """
    rng = np.random.default_rng(seed)
    y = module.forward(x)
    if loss is None:
        g = np.random.default_rng([seed, 7919]).standard_normal(np.shape(y))

        def L():
            return float(np.vdot(g, module.forward(x)))
        dy = g.copy()
    else:
        _, dy = loss(y)

        def L():
            return float(loss(module.forward(x))[0])
    module.zero_grad()
    dx = module.backward(dy)
    analytic = {name: grad.copy() for name, _, grad in module.named_parameters()
                if grad is not None}                  # a frozen parameter has no gradient
    pairs = {}
    for name, param, _ in module.named_parameters():
        if name not in analytic:
            continue
        if param.dtype != np.float64:
            raise TypeError(f"{name}: gradient checks run in float64, got {param.dtype}")
        num, idx = numerical_grad(L, param, h, rng, max_entries)
        pairs[name] = (analytic[name].reshape(-1)[idx], num)
    if check_input and isinstance(x, np.ndarray) and x.dtype.kind == "f":
        num, idx = numerical_grad(L, x, h, rng, max_entries)
        pairs["input"] = (np.asarray(dx).reshape(-1)[idx], num)
    return dict(zip(pairs, _errors(list(pairs.values()))))
