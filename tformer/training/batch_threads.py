"""Data parallelism across threads: a training batch cut into parts, each part's whole forward and
backward pass run on one thread, the parts' gradients summed::

    logits[b₀:b₁] = f_θ(tokens[b₀:b₁])   for each part [b₀, b₁) of the B sequences, side by side
    ∂L/∂θ = Σ_parts ∂L/∂θ |part          (L is a sum over tokens, so its gradient is the parts' sum)

It is ``torch.nn.DataParallel`` on the cores of one process, and the data parallelism of the
chapter "Many processes" (``tformer.training.mpi``) without the messages. Like those, it wraps the
model from outside: ``BatchCut(model)`` has the model's ``forward`` and ``backward`` (and passes
every other attribute through), and ``tformer.training.train`` trains through it. Each part needs its own
caches and gradients, so each part after the first runs on a *replica*: a copy of the model's
module tree whose parameter attributes are the model's own arrays (not copies: an optimizer step or
``load_state_dict`` is seen at once) and whose gradients live in a flat buffer of its own. The
first part runs on the model.

Why: a kernel split across threads (``tformer.core.parallel``) pays one hand-off per kernel, dozens per
step, each a thread wake-up of tens of microseconds, and a row-wise kernel of a small model has
little more work than that. Here the threads meet twice per step (after the forward pass and after
the backward pass), and inside a part every kernel runs serially on its thread, BLAS included.

What changes with the thread count: as when a product is split by rows, the last bits. A weight
gradient Xᵀ dY becomes a sum of the parts' products, rounded differently from the one product
(``tests/training/test_replicas.py`` checks the parts against the whole in float32 and float64). At a given
thread count everything is deterministic: the parts are fixed, the sum is taken in part order.

Only a forward pass that draws no random numbers is split (no active dropout): the masks would
otherwise depend on how the batch was cut. Such a model keeps the per-kernel threads.
"""
import copy

import numpy as np

from tformer.core import parallel
from tformer.nn.layers import Dropout

# A part must carry at least this many multiply-adds (tokens × parameters) for the batch to be
# split: below it the two hand-offs of a step cost more than they save. 2²⁴ is about 0.2 ms of
# products on one core here, ten hand-offs' worth.
MIN_PART_MACS = 1 << 24


def parts(B, n):
    """[b₀, b₁) ranges cutting ``B`` sequences into ``min(n, B)`` parts whose sizes differ by at most 1."""
    n = max(1, min(n, B))
    bounds = [B * i // n for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def draws_random_numbers(model):
    """True when a forward pass of ``model`` in its current mode draws dropout masks."""
    return any(isinstance(m, Dropout) and m.p > 0 and m.training for m in model.modules())


class Replicas:
    """The replicas of ``model`` (``model`` itself first), made on first use and kept.

    ``model`` must have flat parameter and gradient buffers (``Module.flatten_parameters``).
    ``split(B, tokens_per_seq)`` says how to cut a batch (None: not worth it); ``forward`` and
    ``backward`` run the parts through each module's ``forward`` and ``backward`` side by side.
    A replica copies the module tree when it is made: its parameters and mode follow the model's
    at every step, the rest of its configuration is the model's at that moment. The replicas
    live as long as this object (a module tree without activations and one flat gradient buffer
    each).
    """

    def __init__(self, model):
        self.model = model
        self._copies = []              # replicas 1, 2, ... (each: (module, its flat gradients))
        self._bindings = []            # per replica: [(main module, replica module, attribute)]
        self._flat = None              # the model's flat buffers when the copies were made
        self.last = None               # the parts of the last split forward pass (None: not split)
        self._mods = None              # the modules that ran them
        self._checked = None           # the flat buffers split() has just checked

    def split(self, B, tokens_per_seq):
        """The parts to cut ``B`` sequences of ``tokens_per_seq`` tokens into, or None when the
        batch runs whole: one thread, one sequence, too little work per part, dropout masks
        to draw, or no flat buffers."""
        n = parallel.get_num_threads()
        if n == 1 or B < 2 or parallel.inside_part():
            return None
        flat = self.model.flat_buffers()
        if flat is None or draws_random_numbers(self.model):
            return None
        cut = parts(B, n)
        smallest = min(hi - lo for lo, hi in cut)
        if smallest * tokens_per_seq * flat[0].size < MIN_PART_MACS:
            return None
        self._checked = flat
        return cut

    def modules(self, n, flat=None):
        """``[model, replica 1, …, replica n−1]``, each replica's parameter attributes pointing at
        the model's current arrays (what mixed precision or a reload bound them to) and its mode
        the model's. ``flat``: the model's flat buffers, if just checked."""
        flat = self.model.flat_buffers() if flat is None else flat
        if self._flat is None or flat[0] is not self._flat[0] or flat[1] is not self._flat[1]:
            self._copies, self._bindings, self._flat = [], [], flat
        while len(self._copies) < n - 1:
            self._copies.append(self._replicate())
        out = [self.model]
        for (rep, _), bindings in zip(self._copies[:n - 1], self._bindings):
            for main_m, rep_m, attr in bindings:
                if getattr(rep_m, attr) is not getattr(main_m, attr):     # rebound since (precision)
                    rep_m.bind(attr, getattr(main_m, attr))
            if rep.training != self.model.training:
                rep.train(self.model.training)
            out.append(rep)
        return out

    def _replicate(self):
        """A copy of the model's module tree (without its caches) whose parameters are the model's
        arrays and whose gradients are a zeroed flat buffer of its own."""
        main = self.model
        memo = {id(self): None}        # a replica has no replicas of its own
        for m in main.modules():       # nor what the last forward pass kept for its backward
            for value in m.saved_values():
                if value is not None:
                    memo[id(value)] = None
        rep = copy.deepcopy(main, memo)                  # flattened, as main is (Module.__deepcopy__)
        _, G = rep.flat_buffers()                        # the replica's own flat gradients, zeroed
        G.fill(0)
        # The model's arrays, not copies; what the forward pass reads is the model's attribute as
        # it is bound at every step (its float32 parameter, or mixed precision's low-precision copy).
        self._bindings.append(rep.share_parameters(main))
        return rep, G

    def forward(self, tokens, cut, *args):
        """``module.forward(tokens[b₀:b₁])`` for each part side by side, on the model and its
        replicas; returns the parts' outputs joined along the batch, (B, …)."""
        mods = self.modules(len(cut), self._checked)
        self._checked, self.last = None, None            # nothing to differentiate if a part fails
        outs = [None] * len(cut)

        def run(i, m, lo, hi):
            outs[i] = m.forward(tokens[lo:hi], *args)

        parallel.run_tasks(*((lambda i=i, m=m, lo=lo, hi=hi: run(i, m, lo, hi))
                             for i, (m, (lo, hi)) in enumerate(zip(mods, cut))))
        self.last, self._mods = cut, mods
        return np.concatenate(outs)

    def backward(self, dout):
        """``module.backward(dout[b₀:b₁])`` for each part side by side, each into its module's
        gradients (a replica's are zeroed first), then the replicas' gradients added into the
        model's, in part order."""
        cut, self.last = self.last, None
        if cut is None:
            raise RuntimeError("backward: no split forward pass to differentiate")
        mods = self._mods                                # those that ran the forward pass
        extra = [g for _, g in self._copies[:len(cut) - 1]]

        def run(i, lo, hi):
            if i > 0:
                extra[i - 1].fill(0)
            mods[i].backward(dout[lo:hi])

        parallel.run_tasks(*((lambda i=i, lo=lo, hi=hi: run(i, lo, hi))
                             for i, (lo, hi) in enumerate(cut)))
        G = self._flat[1]

        def add(lo, hi):
            for g in extra:                              # Σ in part order: the same bits every run
                G[lo:hi] += g[lo:hi]

        parallel.parallel_for(add, G.size, grain=_SUM_GRAIN)


class BatchCut:
    """``model`` run with each training batch cut across threads.

    ``forward(tokens, *args)``: in training, when ``Replicas.split`` finds the batch worth
    cutting, the parts run side by side (the first on the model, the others on replicas) and
    their outputs are joined; otherwise it is ``model.forward``. ``backward(dout)`` follows the
    forward pass it had. Every other attribute is the model's: ``tformer.training.train`` hands this to
    the loss and the backward pass and keeps the model for the rest.
    """

    def __init__(self, model):
        self.model = model
        self.replicas = Replicas(model)
        self._shape = None                               # the joined output's shape, if cut

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward(self, tokens, *args):
        shape = getattr(tokens, "shape", ())
        cut = self.replicas.split(*shape) if self.model.training and len(shape) == 2 else None
        self.replicas.last = None
        if cut is None:
            return self.model.forward(tokens, *args)
        out = self.replicas.forward(tokens, cut, *args)   # (B, T, V)
        self._shape = out.shape
        return out

    def backward(self, dout):
        if self.replicas.last is None:
            return self.model.backward(dout)
        if getattr(dout, "shape", None) != self._shape:
            raise ValueError(f"dlogits: expected shape {self._shape} (the last forward output's), "
                             f"got {getattr(dout, 'shape', type(dout).__name__)}")
        self.replicas.backward(dout)
        return None


# Elements of the gradient sum per thread: a pass over a million floats (4 MB) is worth a hand-off.
_SUM_GRAIN = 1 << 20
