"""Dynamic batching: length-bucketed batches under a token budget::

    pool p   = the next P examples of a seeded stream (a shuffled dataset, or lengths drawn afresh)
    sort the pool by length n, cut it into consecutive batches b with |b| · max_{i∈b} T(n_i) ≤ N_tok
    shuffle the order of the pool's batches

A fixed batch of B rows is padded to the longest row the task can have; a bucketed batch holds rows
of nearly one length, padded only to its own longest, and holds more of them when they are short,
so that every batch costs about the same ``N_tok = max_tokens`` positions. Everything is a pure
function of ``(seed, step)``: a resumed run sees the same batches.

Sorting inside a step instead (``split_by_length``, ``SortedTask``) keeps the fixed batch::

    step batch (B rows) -> sort by length, cut into micro-batches j with B_j · T_j ≤ N_tok
    L = Σ_j w_j · L_j,   w_j = N_j / N          (N_j counted targets of micro-batch j, N = Σ_j N_j)

so the step's loss and gradient are those of the whole padded batch (``train`` runs the
micro-batches in turn and starts each backward from w_j · ∂L_j/∂z), with less padding.
"""
import numpy as np

from tformer.core.validate import int_array
from tformer.data.sequences import PAD


def check_budget(max_tokens, longest=None):
    """``max_tokens``: a positive integer, at least ``longest`` (one row of the longest length)."""
    if isinstance(max_tokens, (bool, np.bool_)) or not isinstance(max_tokens, (int, np.integer)):
        raise TypeError(f"max_tokens: expected a positive integer, got {max_tokens!r}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens: expected a positive integer, got {max_tokens}")
    if longest is not None and max_tokens < longest:
        raise ValueError(f"max_tokens: a budget of {max_tokens} tokens is smaller than one sequence "
                         f"of {longest} tokens; expected at least {longest}")
    return int(max_tokens)


def default_budget(batching, batch_size, seq_len):
    """The token budget ``--max-tokens`` defaults to: a fixed batch's ``B·T`` positions for
    ``bucketed`` (a step costs about what a fixed step costs); an eighth of it, at least one
    row, for ``sorted`` (the micro-batches of one fixed batch)."""
    if batching == "sorted":
        return max(seq_len, batch_size * seq_len // 8)
    return batch_size * seq_len


def bucket(row_lengths, max_tokens, rng=None):
    """Indices of ``row_lengths`` cut into batches: sorted by length, each batch's padded size
    ``len(batch) · max(row_lengths[batch]) ≤ max_tokens``; the batch order shuffled by ``rng``.

    ``row_lengths: (P,)`` positive ints (the padded row length T(n) of each example) -> a list of
    index arrays that together hold every index once.
    """
    lengths = np.asarray(row_lengths)
    int_array("row_lengths", lengths, ndim=1)
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"row_lengths: expected positive lengths, got min {lengths.min()}")
    max_tokens = check_budget(max_tokens, int(lengths.max()) if lengths.size else None)
    order = np.argsort(lengths, kind="stable")                   # shortest first
    batches, start = [], 0
    for i in range(1, lengths.size + 1):
        # rows order[start:i+1] would be padded to lengths[order[i]] (the longest so far)
        if i == lengths.size or (i + 1 - start) * int(lengths[order[i]]) > max_tokens:
            batches.append(order[start:i])
            start = i
    if rng is not None:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


class BucketSampler:
    """``indices(step) -> (positions, row lengths)``: batch ``step`` (0, 1, ...) of a stream of pools.

    Either ``lengths`` (the row length of every example of a finite dataset; pools are consecutive
    slices of a stream of seeded epochs, each a permutation of the dataset; ``positions`` are then
    dataset indices), or ``draw_lengths(pool) -> (P,)`` row lengths of a generated pool (an
    endless task; ``positions`` index that pool). ``pool_size`` P: examples sorted together.
    """

    def __init__(self, max_tokens, lengths=None, draw_lengths=None, pool_size=1024, seed=0):
        if (lengths is None) == (draw_lengths is None):
            raise ValueError("lengths, draw_lengths: expected exactly one of the two")
        if isinstance(pool_size, bool) or not isinstance(pool_size, (int, np.integer)) or pool_size < 1:
            raise ValueError(f"pool_size: expected a positive integer, got {pool_size!r}")
        self.max_tokens = check_budget(max_tokens)
        self.lengths = None if lengths is None else np.asarray(lengths)
        if self.lengths is not None:
            int_array("lengths", self.lengths, ndim=1)
            check_budget(max_tokens, int(self.lengths.max()))
        self.draw_lengths, self.pool_size, self.seed = draw_lengths, int(pool_size), int(seed)
        self._pools = []                   # [(examples, row lengths, batches)] of pools 0, 1, ...
        self._ends = []                    # cumulative number of batches after each pool

    def pool_lengths(self, p):
        """``(examples, row lengths)`` of pool ``p``: dataset indices (or None) and their lengths."""
        if self.draw_lengths is not None:
            return None, np.asarray(self.draw_lengths(p))
        N, P = self.lengths.size, self.pool_size
        stream = [np.random.default_rng([self.seed, e]).permutation(N)
                  for e in range(p * P // N, ((p + 1) * P - 1) // N + 1)]
        first = (p * P // N) * N
        idx = np.concatenate(stream)[p * P - first:(p + 1) * P - first]
        return idx, self.lengths[idx]

    def _pool(self, p):
        while len(self._pools) <= p:
            q = len(self._pools)
            idx, lengths = self.pool_lengths(q)
            batches = bucket(lengths, self.max_tokens, np.random.default_rng([self.seed, q, 1]))
            self._pools.append((idx, lengths, batches))
            self._ends.append((self._ends[-1] if self._ends else 0) + len(batches))
        return self._pools[p]

    def indices(self, step):
        """``(positions, row lengths)`` of batch ``step``: positions in the dataset (finite) or in
        its pool (generated), and the row length of each."""
        if step < 0:
            raise ValueError(f"step: expected a non-negative integer, got {step}")
        p = 0
        while True:
            idx, lengths, batches = self._pool(p)
            if step < self._ends[p]:
                b = batches[step - (self._ends[p] - len(batches))]
                return (b if idx is None else idx[b]), lengths[b]
            p += 1


def pad_sequences(sequences, pad_id=0):
    """Rows of a list of 1-D token sequences, right-padded with ``pad_id`` to the longest:
    ``(B, T_max)`` int64."""
    T = max((len(s) for s in sequences), default=0)
    out = np.full((len(sequences), T), pad_id, dtype=np.int64)
    for i, s in enumerate(sequences):
        out[i, :len(s)] = s
    return out


def padding_share(inputs, pad_id=0):
    """Share of the positions of ``inputs: (B, T)`` that hold ``pad_id``."""
    inputs = np.asarray(inputs)
    return float((inputs == pad_id).mean()) if inputs.size else 0.0


class BucketedTask:
    """Batches of a ``SequenceTask`` drawn by a ``BucketSampler``: ``batch(step)`` is the task's
    batch of those lengths, trimmed to its own longest row ``T = 2·n_max + 2``.

    The lengths of pool p are drawn uniformly in ``min_len … max_len`` (seeded by (seed, p));
    the symbols of batch ``step`` come from ``task.batch(step, ...)`` as for fixed batches.
    """

    def __init__(self, task, max_tokens, pool_size=1024, seed=0):
        self.task = task
        check_budget(max_tokens, task.seq_len)

        def draw(p):
            rng = np.random.default_rng([seed, p, 2])
            return 2 * rng.integers(task.min_len, task.max_len + 1, pool_size) + 2   # T(n)
        self.sampler = BucketSampler(max_tokens, draw_lengths=draw, pool_size=pool_size, seed=seed)

    def batch(self, step):
        """Dict of ``inputs``, ``targets`` ``(B_step, T_step)`` and ``lengths``, as ``task.batch``."""
        _, rows = self.sampler.indices(step)
        n = rows // 2 - 1                                           # T(n) = 2n + 2
        b = self.task.batch(step, n.size, lengths=n)
        T = 2 * int(n.max()) + 2
        return {"inputs": b["inputs"][:, :T], "targets": b["targets"][:, :T], "lengths": n}


def row_lengths(targets, pad):
    """``T_i`` = 1 + the last position of row i whose target counts (not ``pad``; 1 if none):
    ``targets: (B, T)`` -> ``(B,)``. Under a causal mask with right padding, the positions after
    it neither count in the loss nor reach the positions before it, so the row can stop there."""
    counted = np.asarray(targets) != pad                                     # (B, T)
    last = counted.shape[1] - 1 - np.argmax(counted[:, ::-1], axis=1)
    return np.where(counted.any(axis=1), last + 1, 1)


def split_by_length(batch, max_tokens, pad=0):
    """One step's ``batch`` cut into micro-batches: its rows sorted by length (``row_lengths``),
    cut by ``bucket`` so that ``B_j · T_j ≤ max_tokens``, each trimmed to its own longest row T_j.

    ``batch``: dict of ``inputs``, ``targets`` ``(B, T)`` and any other per-row ``(B, ...)``
    arrays -> a list of such dicts (shortest rows first), each with ``weight`` w_j = N_j / N, its
    share of the batch's counted targets: Σ_j w_j · L_j is the whole batch's mean loss L.
    """
    x, y = batch["inputs"], batch["targets"]
    if x.ndim != 2 or y.shape != x.shape:
        raise ValueError(f"batch: expected inputs and targets of one shape (B, T), got "
                         f"{x.shape} and {y.shape}")
    T = row_lengths(y, pad)
    n_total = int((y != pad).sum())
    out = []
    for idx in bucket(T, max_tokens):                          # no shuffle: shortest first
        t = int(T[idx].max())
        mb = {k: v[idx] for k, v in batch.items()
              if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == x.shape[0]}
        mb["inputs"], mb["targets"] = x[idx, :t], y[idx, :t]
        mb["weight"] = int((mb["targets"] != pad).sum()) / n_total if n_total else 0.0
        out.append(mb)
    return out


class SortedTask:
    """The fixed batches of a ``SequenceTask``, each sorted by length and cut into micro-batches
    of at most ``max_tokens`` padded positions (``split_by_length``): ``batch(step)`` is the list
    of micro-batches of ``task.batch(step, batch_size)``, a pure function of (seed, step)."""

    def __init__(self, task, batch_size, max_tokens):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
        self.task, self.batch_size = task, int(batch_size)
        self.max_tokens = check_budget(max_tokens, task.seq_len)

    def batch(self, step):
        """List of micro-batch dicts (``inputs``, ``targets``, ``lengths``, ``weight``)."""
        return split_by_length(self.task.batch(step, self.batch_size), self.max_tokens, PAD)


def counting(source, count, pad):
    """``step -> batch`` like ``source``, adding to ``count`` as it goes: ``real`` tokens (not
    ``pad``), padded ``positions`` (B·T), ``rows`` (B) and ``batches``, for padding shares and
    tokens per second of a run. ``count`` is a dict that holds those four keys. A batch that is a
    list of micro-batches (``SortedTask``) counts each micro-batch as a batch."""
    def batch(i):
        b = source(i)
        for m in (b if isinstance(b, list) else [b]):
            x = m["inputs"]                                                  # (B, T)
            count["real"] += int((x != pad).sum())
            count["positions"] += x.size
            count["rows"] += x.shape[0]
            count["batches"] += 1
        return b
    return batch
