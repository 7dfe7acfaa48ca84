"""ZeRO stage 1: each of p ranks keeps the optimizer state of its shard of the parameters only::

    rank r:  θ[lo_r:hi_r] ← update(θ[lo_r:hi_r], ḡ[lo_r:hi_r]; m_r, v_r)     then  θ ← Allgather_r θ[lo_r:hi_r]

``tformer.training.mpi.DataParallel(model, zero=True)`` reduce-scatters the gradient, so rank r holds
the mean ḡ of its shard; ``ShardedOptimizer`` wraps any elementwise optimizer (AdamW) around that
shard, so each number is updated exactly as the whole-model optimizer would update it, and AdamW's
m and v take 1/p of the memory on each rank. Checkpoints gather the state into the whole-model
layout (``gathered``), so a run of any world size resumes in any other (``load_state_dict``).

Frozen parameters (``Module.freeze``) keep their place in the flat buffers (their gradient there
is zero): a rank's shard is then the runs of trained numbers inside [lo, hi), and only they are
updated and keep state, as the whole-model optimizer would skip the frozen ones.
"""
import numpy as np


class _Shard:
    """The model seen by a ZeRO-1 optimizer: this rank's slice θ[lo:hi] of the flat buffer, with
    the reduced gradient shard as its gradient: one parameter ``"shard"``, or, when some numbers
    of the slice are frozen, one parameter ``"shard.i"`` per run ``(a, b)`` of trained numbers
    (offsets in the slice; none trained: one empty ``"shard"``)."""

    def __init__(self, param, grad, runs=None):
        self.param, self.grad = param, grad
        self.runs = [(0, param.size)] if runs is None else runs

    def named_parameters(self):
        if self.runs in ([(0, self.param.size)], []):
            a, b = self.runs[0] if self.runs else (0, 0)
            yield "shard", self.param[a:b], self.grad[a:b]
            return
        for i, (a, b) in enumerate(self.runs):
            yield f"shard.{i}", self.param[a:b], self.grad[a:b]

    def flat_buffers(self):
        return None


class ShardedOptimizer:
    """ZeRO stage 1: rank r keeps the optimizer state (AdamW's m and v) of its shard of θ only.

    ``step()`` updates θ[lo:hi] from the reduced gradient shard with the wrapped optimizer (an
    elementwise update, so each number is updated exactly as the whole-model optimizer would),
    then an in-place Allgatherv gives every rank the whole θ. ``lr`` and ``t`` are the wrapped
    optimizer's; ``state_dict`` exists only on rank 0 after ``gathered()``.
    """

    def __init__(self, dp, make):
        self.dp = dp
        self.shard = _Shard(dp.P[dp.lo:dp.hi], dp.g_shard, trained_runs(dp.model, dp.lo, dp.hi))
        self.inner = make(self.shard)

    @property
    def lr(self):
        return self.inner.lr

    @lr.setter
    def lr(self, value):
        self.inner.lr = value

    @property
    def t(self):
        return self.inner.t

    def step(self):
        """Update this rank's shard, then gather the whole θ on every rank."""
        self.inner.step()
        self.gather_parameters()

    def gather_parameters(self):
        """θ[lo_r:hi_r] of every rank r into every rank's flat buffer: one in-place Allgatherv."""
        dp = self.dp
        if dp.world.size > 1:
            from mpi4py import MPI
            counts = np.diff(dp.bounds).tolist()                   # numbers per rank
            dp.world.comm.Allgatherv(MPI.IN_PLACE, [dp.P, (counts, dp.bounds[:-1].tolist())])

    def _names(self):
        """``(name, offset, shape)`` of every trained parameter of the model in the flat buffer
        (the keys of the whole-model optimizer's state: a frozen parameter has none), from the
        buffer's table (``Module.flat_layout``)."""
        layout = _layout(self.dp.model)
        out, seen = [], set()
        for name, p, g in self.dp.model.named_parameters():
            if id(p) in seen or g is None:
                continue
            seen.add(id(p))
            out.append((name, *layout[name]))
        return out

    def _join(self, inner_sd, slot):
        """This rank's slice [lo, hi) of one state slot, from the inner optimizer's runs (zeros
        where the numbers are frozen)."""
        local = np.zeros(self.dp.hi - self.dp.lo, self.dp.P.dtype)
        for (name, _, _), (a, b) in zip(self.shard.named_parameters(), self.shard.runs or [(0, 0)]):
            local[a:b] = inner_sd.pop(f"{slot}.{name}").reshape(-1)
        return local

    def gathered(self):
        """The whole-model ``state_dict`` (the keys the unsharded optimizer would write), gathered
        on rank 0 (every rank must call); None on the other ranks."""
        dp, world = self.dp, self.dp.world
        inner_sd = self.inner.state_dict()
        slots = {}
        for slot in sorted({k.split(".", 1)[0] for k, v in inner_sd.items()
                            if isinstance(v, np.ndarray)}):     # "m.shard" -> "m"
            local = self._join(inner_sd, slot)
            full = np.empty(dp.P.size, local.dtype) if world.is_root else None
            if world.size > 1:
                counts = np.diff(dp.bounds).tolist()
                world.comm.Gatherv(local, None if full is None else
                                   [full, (counts, dp.bounds[:-1].tolist())], root=0)
            else:
                full[...] = local
            slots[slot] = full
        if not world.is_root:
            return None
        sd = dict(inner_sd)
        for slot, full in slots.items():
            for name, at, shape in self._names():
                sd[f"{slot}.{name}"] = full[at:at + int(np.prod(shape))].reshape(shape)
        return _StateDict(sd)

    def load_state_dict(self, sd):
        """Take this rank's shard of a whole-model optimizer ``state_dict`` (any world size wrote it)."""
        dp = self.dp
        own = self.inner.state_dict()
        slots = {k.split(".", 1)[0] for k, v in own.items() if isinstance(v, np.ndarray)}
        inner_sd = {k: v for k, v in sd.items() if "." not in k}
        for slot in slots:
            full = np.zeros(dp.P.size, dp.P.dtype)
            for name, at, shape in self._names():
                key = f"{slot}.{name}"
                if key not in sd:
                    raise ValueError(f"optimizer state: missing key {key!r}")
                value = np.asarray(sd[key])
                if value.shape != tuple(shape):
                    raise ValueError(f"optimizer state {key!r}: expected shape {tuple(shape)}, got {value.shape}")
                full[at:at + value.size] = value.reshape(-1)
            for (name, _, _), (a, b) in zip(self.shard.named_parameters(), self.shard.runs or [(0, 0)]):
                inner_sd[f"{slot}.{name}"] = full[dp.lo + a:dp.lo + b]       # run (a, b) of [lo, hi)
        self.inner.load_state_dict(inner_sd)


def trained_runs(model, lo, hi):
    """``[(a, b)]``: the runs of trained numbers of ``P[lo:hi]`` of the model's flat buffer
    (offsets from ``lo``), in order; ``[(0, hi − lo)]`` when nothing is frozen. A number is
    trained when its parameter is (``Module.frozen_mask``: the frozen places of the store)."""
    _layout(model)                      # raises if the buffers no longer hold the parameters
    trained = ~model.frozen_mask()
    edges = np.flatnonzero(np.diff(np.concatenate([[0], trained[lo:hi].astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


def _layout(model):
    """``model.flat_layout()``, or ValueError when its tree no longer matches its flat buffers."""
    layout = model.flat_layout()
    if layout is None:
        raise ValueError(f"model: its flat buffers no longer hold its parameters as named "
                         f"(a layer added or replaced since); call {type(model).__name__}."
                         f"flatten_parameters() before DataParallel")
    return layout


class _StateDict(dict):
    """What ``save_checkpoint`` needs of an optimizer: ``state_dict()``."""

    def state_dict(self):
        return self
