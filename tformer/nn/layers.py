"""The ``Module`` base and the layers built from the fast kernels (``tformer.fast``).

A module holds ``params`` and ``grads``, two dicts with the same keys. ``forward(x)`` keeps what
``backward(dy)`` needs (one cache, replaced on every call, so nothing grows between steps; each
class names what it keeps in ``saved``);
``backward`` *accumulates* into ``grads`` (``+=``, as micrograd does: residual branches and shared
weights then just work) and returns ``dx``. Only ``zero_grad()`` clears gradients.

``freeze()`` / ``unfreeze()``: PyTorch's ``requires_grad = False`` / ``True``. A frozen parameter
is used by the forward pass and never changed: ``named_parameters()`` yields its gradient as None
(so the optimizers, clipping and the loss scaler skip it), and the ``backward`` of a layer whose
weight is frozen (``is_frozen("W")``) takes its path without dW: dX (and db, if b is trained),
never the product Xᵀ dY.
"""
import copy
import math

import numpy as np

from tformer.kernels.positional import sinusoidal_positions
from tformer.fast import linear as fast_linear
from tformer.fast import activations as fast_act, dropout as fast_dropout, embedding as fast_emb, layernorm as fast_ln
from tformer.fast import decode as fast_decode
from tformer.core.validate import float_array


class Module:
    """Base class: parameters, gradients, children, train/eval mode, state dicts.

    The seams a strategy (recomputation, the batch cut, precision, freezing, LoRA, int8, decoding)
    uses in place of a layer's private fields: ``modules()`` / ``named_modules()`` (the tree,
    walked once and kept until it changes), ``replace(path, new)`` (swap a layer;
    ``named_layers(*types)`` finds them), ``param_attributes()`` and ``bind(attr, array)`` (what
    a parameter attribute points at), ``share_parameters(source)`` (a replica), ``flat_layout()``
    (where each parameter lives in the flat buffers; ``frozen_mask()`` the frozen places),
    ``freeze(*keys)`` / ``unfreeze(*keys)`` and ``is_frozen(key)`` (the choice a layer's backward
    reads), and what a layer's forward keeps for its backward, declared by its class in ``saved``
    and reached through ``saved_values()``, ``keep(**values)`` and ``clear_saved()``.
    """

    #: The attributes ``forward`` keeps for ``backward`` (each layer class declares its own).
    saved = ()

    _tree_version = 0       # changes whenever a child is set or replaced in any module tree

    def __init__(self):
        object.__setattr__(self, "params", {})
        object.__setattr__(self, "grads", {})
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_param_attrs", {})    # attribute -> parameter key (self.W -> "W")
        object.__setattr__(self, "_frozen", {})         # frozen key -> its gradient's home (see freeze)
        object.__setattr__(self, "_walk", None)         # (tree version, named modules, modules)
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._children[name] = value
            Module._tree_version += 1
        key = next((k for k, p in self.params.items() if value is p), None)
        if key is not None:                 # ``self.W = self.add_param("W", ...)`` names a parameter
            self._param_attrs[name] = key
        else:
            self._param_attrs.pop(name, None)
        object.__setattr__(self, name, value)

    def __deepcopy__(self, memo):
        """A copy of the module tree. NumPy copies each view of a flat buffer as an array of its
        own, so the copy of a flattened module is flattened again (``flatten_parameters``): one
        buffer of parameters and one of gradients, as the original had, with their values (a frozen
        parameter's place zero)."""
        new = object.__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            object.__setattr__(new, name, None if name == "_walk" else copy.deepcopy(value, memo))
        if self.flattened() and self.flat_buffers() is not None:
            new.flatten_parameters()
        return new

    def param_attributes(self):
        """``[(attribute, key)]``: the attributes that name a parameter (``self.W`` for
        ``params["W"]``), as declared by assignment. What the forward pass reads is the attribute,
        so whatever computes with other arrays than ``params`` (flat views, low-precision copies,
        a replica sharing the model's arrays) rebinds these, and only these."""
        return list(self._param_attrs.items())

    def add_param(self, name, value):
        """Register ``value`` as parameter ``name`` with a zero gradient of the same shape and dtype."""
        value = np.ascontiguousarray(value)
        self.params[name] = value
        self.grads[name] = np.zeros_like(value)
        return value

    def named_parameters(self, prefix=""):
        """Yield ``(qualified_name, param, grad)`` for this module's parameters, then its children's;
        ``grad`` is None for a frozen parameter (PyTorch's ``p.grad`` of ``requires_grad=False``)."""
        for path, m in self.named_modules():
            head = f"{prefix}{path}." if path else prefix
            for name, p in m.params.items():
                yield head + name, p, None if name in m._frozen else m.grads[name]

    def freeze(self, *keys):
        """Freeze parameters (``requires_grad = False``): ``keys`` of this module (e.g. ``"W"``),
        or, with none, every parameter of this module and its children. Returns the module.

        A frozen parameter θ still computes the forward pass; ∂L/∂θ is never needed, so:

        - ``named_parameters()`` yields its gradient as None: an optimizer keeps no state for it
          and never updates or decays it, gradient clipping and the loss scaler leave it out;
        - the ``backward`` of a layer whose weight W is frozen reads that choice
          (``is_frozen("W")``) and runs its ``backward_without_dW``: dX = dY Wᵀ, and db if b is
          still trained. For a linear layer that skips one of the backward pass's two products
          (N·C_in·C_out multiply-adds); a frozen embedding skips its scatter-add;
        - ``grads[key]`` becomes a scratch array of its own that nothing reads (a model that adds a
          gradient itself, as TinyGPT does for W_pe, writes there), while the parameter's place in
          the flat gradient buffer stays zero: the buffers' layout does not depend on what is
          frozen (MPI, ZeRO-1, the thread replicas and mixed precision share it), and whatever sums
          or scans the whole buffer (the all-reduce, the loss scaler's check, ZeRO-1's norm)
          finds exact zeros there.

        A tied weight is one parameter: freeze it in every module that holds it (``freeze()`` on
        the model does). Unknown ``keys`` raise ValueError naming them.
        """
        for m, ks in self._keys_to_switch(keys):
            for key in ks:
                if key not in m._frozen:
                    home = m.grads[key]
                    home.fill(0)                        # its place in the flat buffer: zero from now on
                    m._frozen[key] = home
                    m.grads[key] = np.zeros(home.shape, home.dtype)     # the scratch array
        return self

    def unfreeze(self, *keys):
        """Train frozen parameters again (``requires_grad = True``): ``keys`` of this module, or,
        with none, every parameter of this module and its children. Returns the module. Each
        gradient starts from zero in its place of the flat buffer; an optimizer made while the
        parameter was frozen has no state for it (make a new one)."""
        for m, ks in self._keys_to_switch(keys):
            for key in ks:
                if key in m._frozen:
                    m.grads[key] = m._frozen.pop(key)
        return self

    def _keys_to_switch(self, keys):
        """``[(module, keys)]`` that ``freeze``/``unfreeze`` act on: ``keys`` of this module, or,
        with none, every parameter of this module and its children. Unknown keys: ValueError."""
        unknown = [k for k in keys if k not in self.params]
        if unknown:
            raise ValueError(f"keys: expected parameters of {type(self).__name__} among "
                             f"{sorted(self.params)}, got {unknown}")
        return [(self, keys)] if keys else [(m, tuple(m.params)) for m in self.modules()]

    def gradient_arrays(self):
        """Every gradient array this module holds: ``grads`` (a frozen parameter's entry is its
        scratch array) and the places of its frozen parameters in the flat gradient buffer."""
        return list(self.grads.values()) + list(self._frozen.values())

    def is_frozen(self, key):
        """True if parameter ``key`` of this module is frozen: what a layer's ``backward`` reads
        to leave out the gradient of a frozen weight."""
        return key in self._frozen

    def num_parameters(self):
        """Total number of scalar parameters (an array shared by two modules, a tied weight, once)."""
        return sum(p.size for _, p, _ in self._unique_parameters())

    def zero_grad(self):
        """Set every gradient to zero, in place (one fill of the flat buffer, if there is one)."""
        flat = self.flat_buffers()
        if flat is not None:
            flat[1].fill(0)
            return
        for _, _, g in self.named_parameters():
            if g is not None:                          # a frozen parameter has no gradient
                g.fill(0)

    def named_modules(self):
        """``(("", self), (path, module), ...)``: every module of the tree, depth first, with its
        path (``"blocks.0.attn"``). Walked once and kept until a child is set or replaced in any
        module tree (``__setattr__``, ``replace``)."""
        walk = self._walk
        if walk is None or walk[0] != Module._tree_version:
            found = []

            def visit(m, path):
                found.append((path, m))
                for name, child in m._children.items():
                    visit(child, f"{path}.{name}" if path else name)
            visit(self, "")
            walk = (Module._tree_version, tuple(found), tuple(m for _, m in found))
            object.__setattr__(self, "_walk", walk)
        return walk[1]

    def modules(self):
        """Every module of the tree, this one first, depth first (``named_modules`` without the paths)."""
        walk = self._walk
        if walk is None or walk[0] != Module._tree_version:
            self.named_modules()
            walk = self._walk
        return walk[2]


    def named_children(self):
        """``[(name, child)]``: the modules directly below this one."""
        return list(self._children.items())

    def replace(self, path, new):
        """Put module ``new`` where the module at ``path`` is (``"blocks.0.attn.qkv"``: names of
        children, list items by their index), in place: the child, its attribute, its list item.
        Returns the module it replaced. LoRA and int8 swap their layers through this."""
        if not isinstance(new, Module):
            raise TypeError(f"new: expected a Module, got {type(new).__name__}")
        *head, name = path.split(".")
        parent = self
        for part in head:
            parent = parent._children.get(part)
            if parent is None:
                break
        if parent is None or name not in parent._children:
            raise ValueError(f"path: {path!r} names no module of {type(self).__name__}")
        old = parent._children[name]
        parent._children[name] = new
        if name in vars(parent):
            object.__setattr__(parent, name, new)
        if isinstance(parent, ModuleList):
            parent._items[int(name)] = new
        Module._tree_version += 1
        return old

    def named_layers(self, *types):
        """``[(path, module)]``: the modules below this one that are instances of ``types``,
        depth first, leaving out those inside one already found (the ``Linear`` inside a
        ``LoRALinear``): the layers a strategy swaps with ``replace`` (LoRA, int8)."""
        found = []
        for path, m in self.named_modules():
            if path and isinstance(m, types) and not any(path.startswith(f + ".") for f, _ in found):
                found.append((path, m))
        return found

    def bind(self, attr, array):
        """Point parameter attribute ``attr`` (one of ``param_attributes()``, e.g. ``"W"``) at
        ``array``: what the forward pass reads from now on (a low-precision copy, the model's array
        in a replica); ``params`` keeps the parameter itself. ValueError for another attribute."""
        if attr not in self._param_attrs:
            raise ValueError(f"attr: expected a parameter attribute of {type(self).__name__} among "
                             f"{sorted(self._param_attrs)}, got {attr!r}")
        object.__setattr__(self, attr, array)

    def share_parameters(self, source):
        """Make this tree (a ``copy.deepcopy`` of ``source``'s) compute with ``source``'s parameters:
        each ``params`` entry and parameter attribute becomes ``source``'s array (not a copy), the
        gradients stay this tree's own (after ``flatten_parameters``, its flat buffer of gradients
        beside ``source``'s of parameters). Returns ``[(source module, module, attribute)]``: the
        attributes to ``bind`` again when ``source``'s are rebound (mixed precision)."""
        bindings = []
        for src, m in zip(source.modules(), self.modules()):
            m.params.update(src.params)
            for attr, _ in src.param_attributes():
                bindings.append((src, m, attr))
                object.__setattr__(m, attr, getattr(src, attr))
        if source._flat_state() is not None and self._flat_state() is not None:
            # source's parameters beside this tree's gradients, in this tree's (equal) layout
            object.__setattr__(self, "_flat", (source._flat_state()[0], *self._flat_state()[1:]))
        return bindings

    def _flat_state(self):
        return self.__dict__.get("_flat")

    def flattened(self):
        """True once ``flatten_parameters`` has run on this module (``flat_buffers()`` says whether
        every parameter still lives there)."""
        return self._flat_state() is not None

    def saved_values(self):
        """What this module's forward keeps for its backward: the values of the attributes its
        class declares in ``saved`` (None where nothing is kept)."""
        return [getattr(self, name, None) for name in self.saved]

    def keep(self, **values):
        """Set what this module keeps for its backward: ``values`` for names among ``saved``, None
        for the others. A step computed beneath the layer (decoding's one-token step) leaves the
        layer as its own forward would."""
        unknown = sorted(set(values) - set(self.saved))
        if unknown:
            raise ValueError(f"values: expected names among {list(self.saved)}, got {unknown}")
        for name in self.saved:
            object.__setattr__(self, name, values.get(name))

    def clear_saved(self):
        """Drop what this module and every module below it keep for their backward (set to None)."""
        for m in self.modules():
            for name in m.saved:
                if getattr(m, name, None) is not None:
                    object.__setattr__(m, name, None)

    def flatten_parameters(self):
        """Move every parameter into one contiguous buffer and every gradient into another.

        Afterwards each parameter (and the attribute that names it, e.g. ``self.W``) is a view of
        its slice of the flat buffer, with the same values, so the model computes exactly what it
        did. An optimizer then updates all parameters with one sweep over the flat arrays instead
        of one dozen NumPy calls per parameter, and ``zero_grad`` is one fill: llm.c's layout.
        Arrays shared by several modules (tied weights) get one slice. Every parameter must have
        the same dtype. A frozen parameter keeps its slice of the gradient buffer (zero; its
        ``grads`` entry stays its scratch array, see ``freeze``). Where each parameter lives is
        the table ``flat_layout()``, written here. Returns ``(flat_params, flat_grads)``.
        """
        owners, order = {}, []          # id(param) -> [(module, key, name)], first-seen order
        for path, m in self.named_modules():
            for key, p in m.params.items():
                if id(p) not in owners:
                    owners[id(p)] = []
                    order.append(p)
                owners[id(p)].append((m, key, f"{path}.{key}" if path else key))
        if not order:
            raise ValueError("flatten_parameters: the module has no parameters")
        dtypes = {p.dtype for p in order}
        if len(dtypes) > 1:
            raise ValueError(f"flatten_parameters: parameters must share one dtype, got {sorted(map(str, dtypes))}")
        n = sum(p.size for p in order)
        P, G = np.empty(n, order[0].dtype), np.zeros(n, order[0].dtype)
        offset, layout = 0, {}          # qualified name -> (offset, shape)
        for p in order:
            view_p = P[offset:offset + p.size].reshape(p.shape)
            view_g = G[offset:offset + p.size].reshape(p.shape)
            view_p[...] = p
            for m, key, name in owners[id(p)]:
                layout[name] = (offset, p.shape)
                old = m.params[key]
                m.params[key] = view_p
                if key in m._frozen:                   # its place stays zero; grads[key] its scratch
                    m._frozen[key] = view_g
                else:
                    view_g[...] = m.grads[key]
                    m.grads[key] = view_g
                for attr, k in m.param_attributes():
                    if k == key and getattr(m, attr) is old:
                        object.__setattr__(m, attr, view_p)
            offset += p.size
        object.__setattr__(self, "_flat", (P, G, layout))
        return P, G

    def flat_buffers(self):
        """``(flat_params, flat_grads)`` after ``flatten_parameters()``, if every parameter still
        lives there (nothing added or replaced since), else None."""
        flat = getattr(self, "_flat", None)
        if flat is None:
            return None
        P, G = flat[0], flat[1]
        seen, total = set(), 0
        for m in self.modules():
            for key, p in m.params.items():
                g = m._frozen.get(key, m.grads[key])   # a frozen parameter's place in the buffer
                if p.base is not P or g.base is not G:
                    return None
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.size
        return (P, G) if total == P.size else None

    def flat_layout(self):
        """``{qualified name: (offset, shape)}``: parameter ``name`` (as ``named_parameters`` names
        it; a tied weight under each of its names) is ``P[offset:offset + size].reshape(shape)``
        of the flat buffers, its gradient the same slice of G: llm.c's table, written once by
        ``flatten_parameters``. Anything laid out like P (an optimizer's state, precision's
        copies, a rank's shard) finds a parameter's place here. None when ``flat_buffers()`` is,
        or when the tree's names changed since (``flatten_parameters`` again)."""
        if self.flat_buffers() is None:
            return None
        layout = self._flat[2]
        names = [name for name, _, _ in self.named_parameters()]
        return layout if len(names) == len(layout) and all(n in layout for n in names) else None

    def frozen_mask(self):
        """Freezing seen in the store: a boolean array of the flat buffers' size, True at the
        places of frozen parameters (``freeze``; their gradient there stays zero). None when
        ``flat_layout()`` is."""
        layout = self.flat_layout()
        if layout is None:
            return None
        mask = np.zeros(self._flat[0].size, bool)
        for name, p, g in self.named_parameters():
            if g is None:
                at, _ = layout[name]
                mask[at:at + p.size] = True
        return mask

    def _unique_parameters(self):
        seen = set()
        for name, p, g in self.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p, g

    def train(self, mode=True):
        """Training mode (dropout active) for this module and all children."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        """Evaluation mode (dropout off)."""
        return self.train(False)

    def state_dict(self):
        """``{qualified_name: copy of the parameter}``."""
        return {name: p.copy() for name, p, _ in self.named_parameters()}

    def load_state_dict(self, state):
        """Copy parameters in from ``state`` (in place, so optimizers keep their references).

        Raises ValueError naming the parameter on a missing or unexpected key or a shape mismatch.
        """
        copy_state({name: p for name, p, _ in self.named_parameters()}, state)
        return self

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def copy_state(own, state):
    """Copy ``state[name]`` into each array of ``own`` (``{name: array}``), in place, in its dtype.

    Checked in full first: a missing or unexpected key or a shape mismatch raises ValueError
    naming it, and nothing is copied."""
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"state: missing keys {missing}, unexpected keys {unexpected}")
    values = {name: np.asarray(state[name]) for name in own}
    for name, p in own.items():
        if values[name].shape != p.shape:
            raise ValueError(f"state[{name!r}]: expected shape {p.shape}, got {values[name].shape}")
    for name, p in own.items():
        np.copyto(p, values[name].astype(p.dtype, copy=False))


class ModuleList(Module):
    """An indexable list of child modules named ``0``, ``1``, ..."""

    def __init__(self, modules):
        super().__init__()
        self._items = list(modules)
        for i, m in enumerate(self._items):
            self._children[str(i)] = m

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)

    def __getitem__(self, i):
        return self._items[i]


def _rng(rng, seed):
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(seed)


class Linear(Module):
    """Y = X W + b with ``W: (d_in, d_out)``, ``b: (d_out,)``.

    Initialisation: ``W ~ N(0, init_std²)`` when ``init_std`` is given (GPT-2 uses 0.02), else
    PyTorch's ``U(−1/√d_in, 1/√d_in)``; ``b = 0``.
    """

    saved = ("_cache",)

    def __init__(self, d_in, d_out, bias=True, rng=None, dtype=np.float32, init_std=None, seed=0):
        super().__init__()
        rng = _rng(rng, seed)
        if init_std is None:
            bound = 1.0 / math.sqrt(d_in)
            W = rng.uniform(-bound, bound, (d_in, d_out))
        else:
            W = rng.normal(0.0, init_std, (d_in, d_out))
        self.W = self.add_param("W", W.astype(dtype))
        self.b = self.add_param("b", np.zeros(d_out, dtype)) if bias else None
        self._cache = None

    def forward(self, x, out=None):
        """x: (..., d_in) -> (..., d_out); ``out``: an array to write the result into."""
        y, self._cache = fast_linear.linear_forward(x, self.W, self.b, out=out)
        return y

    def backward(self, dy):
        """dy: (..., d_out) -> dx: (..., d_in); accumulates dW (and db), or, W frozen, db alone."""
        if self.is_frozen("W"):
            return self.backward_without_dW(dy)
        # dW and db are added into the running gradients by the kernel, in the thread that
        # computed them (side by side with dX), not afterwards on this one.
        dx, _, _ = fast_linear.linear_backward(dy, self._cache, accumulate=(self.grads["W"], self.grads.get("b")))
        return dx

    def backward_without_dW(self, dy):
        """The backward pass with W frozen (``Module.freeze``): dX = dY Wᵀ, and db = 1ᵀ dY if b is
        still trained; dW = Xᵀ dY, the other N·d_in·d_out multiply-adds, is never formed.

        ``dy: (..., d_out)`` -> ``dx: (..., d_in)``: the kernel's half of
        ``fast.linear.linear_backward`` that runs beside dW, so the same bits."""
        dx, _ = fast_linear.linear_backward_without_dW(dy, self._cache, accumulate=self.grads.get("b"),
                                                       bias=not self.is_frozen("b"))
        return dx

    def rows(self, x):
        """Y = X W + b for the rows ``x: (N, d_in)`` of one decoding step, unsplit, nothing kept
        for a backward pass (``tformer.decoding.kv_cache``): ``forward``'s row function on the same rows,
        so its bits."""
        y = np.empty((x.shape[0], self.W.shape[1]), self.W.dtype)      # (N, d_out)
        fast_linear.forward_rows(x, self.W, self.b, y)
        return y


class Embedding(Module):
    """E = W[tokens] with ``W: (V, C)`` drawn from ``N(0, init_std²)``."""

    saved = ("_cache",)

    def __init__(self, V, C, rng=None, dtype=np.float32, init_std=1.0, seed=0):
        super().__init__()
        rng = _rng(rng, seed)
        self.W = self.add_param("W", rng.normal(0.0, init_std, (V, C)).astype(dtype))
        self._cache = None

    def forward(self, tokens):
        """tokens: (B, T) ints -> (B, T, C)."""
        E, self._cache = fast_emb.embedding_forward(tokens, self.W)
        return E

    def backward(self, dE):
        """Accumulates dW (nothing while W is frozen); tokens have no gradient, so this returns None."""
        if self.is_frozen("W"):
            return self.backward_without_dW(dE)
        self.grads["W"] += fast_emb.embedding_backward(dE, self._cache)
        return None

    def backward_without_dW(self, dE):
        """The backward pass with W frozen (``Module.freeze``): tokens have no gradient and W needs
        none, so there is nothing to compute (no sort, no scatter-add)."""
        return None


class LayerNorm(Module):
    """y = γ ⊙ (x − μ)·rstd + β over the last axis; ``gamma = 1``, ``beta = 0`` at init."""

    saved = ("_cache",)

    def __init__(self, C, eps=1e-5, dtype=np.float32):
        super().__init__()
        self.eps = eps
        self.gamma = self.add_param("gamma", np.ones(C, dtype))
        self.beta = self.add_param("beta", np.zeros(C, dtype))
        self._cache = None

    def forward(self, x):
        y, self._cache = fast_ln.layernorm_forward(x, self.gamma, self.beta, self.eps)
        return y

    def rows(self, x):
        """y for the rows ``x: (N, C)`` of one decoding step (float32/float64), nothing kept for
        a backward pass: ``forward``'s row function on the same rows, so its bits."""
        return fast_decode.layernorm_rows(x, self.gamma, self.beta, self.eps)

    def backward(self, dy):
        dx, dgamma, dbeta = fast_ln.layernorm_backward(dy, self._cache)
        self.grads["gamma"] += dgamma
        self.grads["beta"] += dbeta
        return dx


class Dropout(Module):
    """Inverted dropout with drop probability ``p``; the identity in eval mode."""

    saved = ("_cache",)

    def __init__(self, p, rng=None, seed=0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"p: expected a drop probability in [0, 1), got {p}")
        self.p = p
        self.rng = _rng(rng, seed)
        self._cache = None

    def forward(self, x):
        y, self._cache = fast_dropout.dropout_forward(x, self.p, self.rng, self.training)
        return y

    def backward(self, dy):
        return fast_dropout.dropout_backward(dy, self._cache)


class Activation(Module):
    """An elementwise activation by name: ``relu``, ``relu2`` (ReLU squared), ``gelu`` (tanh form),
    ``gelu_exact``, ``swish``, ``sigmoid``."""

    saved = ("_cache",)

    KERNELS = {
        "relu": (fast_act.relu_forward, fast_act.relu_backward, {}),
        "relu2": (fast_act.relu2_forward, fast_act.relu2_backward, {}),
        "gelu": (fast_act.gelu_forward, fast_act.gelu_backward, {"approximate": "tanh"}),
        "gelu_exact": (fast_act.gelu_forward, fast_act.gelu_backward, {"approximate": "none"}),
        "swish": (fast_act.swish_forward, fast_act.swish_backward, {}),
        "sigmoid": (fast_act.sigmoid_forward, fast_act.sigmoid_backward, {}),
    }

    def __init__(self, name):
        super().__init__()
        if name not in self.KERNELS:
            raise ValueError(f"name: expected one of {sorted(self.KERNELS)}, got {name!r}")
        self.name = name
        self._fwd, self._bwd, self._kw = self.KERNELS[name]
        self._cache = None

    def forward(self, x):
        y, self._cache = self._fwd(x, **self._kw)
        return y

    def backward(self, dy, out=None):
        """dy -> dx; with ``out`` (GELU only), dx is written into it (it may be ``dy`` itself)."""
        if out is None:
            return self._bwd(dy, self._cache)
        return self._bwd(dy, self._cache, out=out)


class FeedForward(Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, with optional dropout after the activation.

    ``x: (B, T, C)`` -> ``(B, T, C)``; hidden width ``d_ff``. The two-layer transformer: swish, no
    biases; the complete Transformer and the post-LN encoder: ReLU with biases; TinyGPT: GELU
    with biases.
    """

    def __init__(self, d_model, d_ff, activation="relu", bias=True, dropout=0.0, rng=None,
                 dtype=np.float32, init_std=None, seed=0):
        super().__init__()
        rng = _rng(rng, seed)
        self.fc1 = Linear(d_model, d_ff, bias, rng, dtype, init_std)
        self.act = Activation(activation)
        self.drop = Dropout(dropout, rng)
        self.fc2 = Linear(d_ff, d_model, bias, rng, dtype, init_std)

    def forward(self, x):
        return self.fc2(self.drop(self.act(self.fc1(x))))

    def rows(self, x):
        """FFN of the rows ``x: (N, C)`` of one decoding step, with GELU (tanh form) and no
        dropout (eval), nothing kept for a backward pass: each product by its own layer's
        ``rows``, GELU by its row function; the bits of ``forward``."""
        with np.errstate(over="ignore", under="ignore"):    # e^{−2u} → inf or 0: exact limits
            return self.fc2.rows(fast_decode.gelu_rows(self.fc1.rows(x)))

    def backward(self, dy):
        dh = self.drop.backward(self.fc2.backward(dy))                  # (B, T, d_ff)
        return self.fc1.backward(self._activation_backward(dh))

    def _activation_backward(self, dh):
        """The activation's backward pass. dh is fc2's fresh dX (or dropout's fresh product), held
        by nothing else: GELU's gradient overwrites it, one (B, T, d_ff) array fewer per step."""
        if self.act.name == "gelu":
            return self.act.backward(dh, out=dh)
        return self.act.backward(dh)


class SinusoidalPositions(Module):
    """X + PE[:T] with the fixed table of ``kernels.positional.sinusoidal_positions``: no parameters, identity backward."""

    def __init__(self, max_len, C, dtype=np.float32):
        super().__init__()
        self.pe = sinusoidal_positions(max_len, C, dtype)     # (max_len, C), a buffer

    def forward(self, x, offset=0):
        """x: (B, T, C) -> (B, T, C); positions ``offset .. offset+T-1``."""
        float_array("x", x, ndim=3)
        T = x.shape[1]
        if offset + T > self.pe.shape[0]:
            raise ValueError(f"x: {offset + T} positions exceed max_len = {self.pe.shape[0]}")
        return x + self.pe[offset:offset + T].astype(x.dtype, copy=False)   # in x's format

    def backward(self, dy):
        return dy
