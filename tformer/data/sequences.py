"""The complete Transformer's padded task: reverse (or sort) a variable-length sequence, read as a language model.

One example of length n is the token row

    BOS x_1 … x_n SEP y_1 … y_n EOS PAD … PAD        (length 2·max_len + 3, padded on the right)

with y = reverse(x) (``task="reverse"``) or y = sort(x) (``task="sort"``). The model reads the row
without its last token and predicts the next token everywhere, but the loss counts only the
answer: every target outside ``y_1 … y_n EOS`` is set to PAD and ``cross_entropy(..., ignore_index=PAD)``
skips it (the x_i are random, so predicting them is noise, and PAD is not a word).

Batches are *length-stratified*: a batch of B rows holds the lengths min_len … max_len in turn, so
every batch of the same B has the same number of answer tokens. Then the mean loss of k micro-batches
equals the mean loss of their union, and gradient accumulation reproduces the large batch exactly.

Held out: a fixed hash of (x, n) puts about one sequence in eleven in the held-out bucket. Training
batches never contain such a sequence (they are redrawn), and the evaluation set holds only distinct
such sequences, so exact-match accuracy is measured on inputs the model has never seen.
"""
import numpy as np

from tformer.nn import functional as F
from tformer.decoding.beam import beam_search
from tformer.decoding.generate import greedy

PAD, BOS, SEP, EOS = 0, 1, 2, 3
SPECIALS = ("PAD", "BOS", "SEP", "EOS")
HELDOUT_MOD = 11


class SequenceTask:
    """Reverse or sort sequences of ``min_len … max_len`` symbols drawn from ``n_symbols``.

    Token ids: PAD 0, BOS 1, SEP 2, EOS 3, symbol s -> 4 + s. ``vocab_size = 4 + n_symbols``;
    model inputs have ``T = 2·max_len + 2`` positions.
    """

    def __init__(self, task="reverse", n_symbols=10, min_len=1, max_len=8, seed=0):
        if task not in ("reverse", "sort"):
            raise ValueError(f"task: expected 'reverse' or 'sort', got {task!r}")
        if not 1 <= min_len <= max_len:
            raise ValueError(f"min_len, max_len: expected 1 ≤ min_len ≤ max_len, got {min_len}, {max_len}")
        if n_symbols < 2:
            raise ValueError(f"n_symbols: expected at least 2, got {n_symbols}")
        self.task, self.n_symbols, self.min_len, self.max_len, self.seed = \
            task, int(n_symbols), int(min_len), int(max_len), int(seed)
        self.vocab_size = 4 + self.n_symbols
        self.seq_len = 2 * self.max_len + 2
        self._hash_w = np.random.default_rng(20240).integers(1, 2 ** 20, self.max_len + 1)

    # -- sequences ------------------------------------------------------------------------------

    def answer(self, x, n):
        """y = reverse(x) or sort(x) per row; ``x: (B, max_len)`` symbols (ignored past n) -> (B, max_len)."""
        j = np.arange(self.max_len)[None, :]                                  # (1, L)
        valid = j < n[:, None]                                                # (B, L)
        if self.task == "reverse":
            y = np.take_along_axis(x, np.clip(n[:, None] - 1 - j, 0, None), axis=1)
        else:
            y = np.sort(np.where(valid, x, self.n_symbols), axis=1)          # padding sorts last
        return np.where(valid, y, 0)

    def is_heldout(self, x, n):
        """True for the rows in the held-out bucket: hash(x_1..x_n, n) ≡ 0 (mod 11)."""
        valid = np.arange(self.max_len)[None, :] < n[:, None]
        h = (np.where(valid, x + 1, 0) * self._hash_w[:-1]).sum(axis=1) + n * self._hash_w[-1]
        return h % HELDOUT_MOD == 0

    def _draw(self, rng, n, heldout, redraw_lengths=False):
        """Symbols ``(B, max_len)`` for lengths ``n`` (changed in place if ``redraw_lengths``), redrawn
        until each row is in the wanted split."""
        x = rng.integers(0, self.n_symbols, (n.size, self.max_len))
        wrong = self.is_heldout(x, n) != heldout
        for _ in range(10_000):
            if not wrong.any():
                return x
            if redraw_lengths:
                n[wrong] = rng.integers(self.min_len, self.max_len + 1, int(wrong.sum()))
            x[wrong] = rng.integers(0, self.n_symbols, (int(wrong.sum()), self.max_len))
            wrong = self.is_heldout(x, n) != heldout
        raise RuntimeError(f"could not draw {'held-out' if heldout else 'training'} sequences of "
                           f"lengths {np.unique(n[wrong]).tolist()}; raise n_symbols or min_len")

    def encode(self, x, n):
        """Rows ``BOS x SEP y EOS PAD…``: ``x: (B, max_len)``, ``n: (B,)`` -> ``(B, 2·max_len + 3)``."""
        B, L = x.shape[0], self.max_len
        y = self.answer(x, n)
        j = np.arange(2 * L + 3)[None, :]                                     # (1, 2L+3)
        n_ = n[:, None]
        xi = np.clip(j - 1, 0, L - 1)                                         # x_i sits at 1 + i
        yi = np.clip(j - 2 - n_, 0, L - 1)                                    # y_i sits at n + 2 + i
        row = np.full((B, 2 * L + 3), PAD, dtype=np.int64)
        row = np.where(j == 0, BOS, row)
        row = np.where((j >= 1) & (j <= n_), 4 + np.take_along_axis(x, np.broadcast_to(xi, row.shape), 1), row)
        row = np.where(j == n_ + 1, SEP, row)
        row = np.where((j >= n_ + 2) & (j <= 2 * n_ + 1),
                       4 + np.take_along_axis(y, np.broadcast_to(yi, row.shape), 1), row)
        return np.where(j == 2 * n_ + 2, EOS, row)

    def batch(self, index, batch_size=64, lengths=None):
        """Training batch ``index`` (a pure function of (seed, index)): dict of ``inputs``, ``targets``
        (both ``(B, 2·max_len + 2)``, targets PAD outside the answer) and ``lengths``.

        The lengths cycle through min_len … max_len unless ``lengths`` (B,) gives them.
        """
        rng = np.random.default_rng([self.seed, int(index)])
        if lengths is None:
            n = np.resize(np.arange(self.min_len, self.max_len + 1), batch_size)    # length-stratified
        else:
            n = np.asarray(lengths, dtype=np.int64)
            if n.shape != (batch_size,) or n.min() < self.min_len or n.max() > self.max_len:
                raise ValueError(f"lengths: expected {batch_size} lengths in [{self.min_len}, "
                                 f"{self.max_len}], got {lengths!r}")
        x = self._draw(rng, n, heldout=False)
        row = self.encode(x, n)
        t = np.arange(self.seq_len)[None, :]
        answer = (t >= n[:, None] + 1) & (t <= 2 * n[:, None] + 1)              # predicts y_1 … EOS
        return {"inputs": row[:, :-1], "targets": np.where(answer, row[:, 1:], PAD), "lengths": n}

    def heldout(self, size=500, seed=None):
        """``size`` distinct held-out examples: dict ``{n: (x (m, n), y (m, n))}``.

        Candidates are drawn as training rows are (n uniform, then x) and kept if they are held out
        and not already kept. Short lengths have few sequences (with 10 symbols, about one held-out
        sequence of length 1 and nine of length 2), so the set holds mostly longer ones.
        """
        rng = np.random.default_rng([self.seed if seed is None else seed, 2 ** 31 - 1])
        kept, seen = [], set()
        for _ in range(1000):
            n = rng.integers(self.min_len, self.max_len + 1, size)
            x = rng.integers(0, self.n_symbols, (size, self.max_len))
            x = np.where(np.arange(self.max_len)[None, :] < n[:, None], x, 0)   # zeros past n
            for i in np.flatnonzero(self.is_heldout(x, n)):
                key = (int(n[i]), *x[i, :n[i]].tolist())
                if key not in seen:
                    seen.add(key)
                    kept.append(key)
            if len(kept) >= size:
                break
        kept = kept[:size]
        n = np.array([r[0] for r in kept], dtype=np.int64)                      # (m,)
        x = np.zeros((len(kept), self.max_len), dtype=np.int64)                 # (m, max_len)
        for i, r in enumerate(kept):
            x[i, :r[0]] = r[1:]
        y = self.answer(x, n)
        return {int(k): (x[n == k, :k], y[n == k, :k]) for k in np.unique(n)}

    # -- training and evaluation ----------------------------------------------------------------

    @staticmethod
    def forward_loss(model, batch):
        """Mean cross-entropy over the answer tokens; returns ``(loss, dlogits)`` for ``train``."""
        logits = model.forward(batch["inputs"])                                 # (B, T, V)
        return F.cross_entropy(logits, batch["targets"], ignore_index=PAD)

    def decode(self, model, x, decoder="greedy", beam_width=4, length_penalty=0.6, extra=2):
        """Answers for prompts ``BOS x SEP`` (``x: (m, n)`` symbols) -> ``(m, n + 1 + extra)`` tokens
        after SEP (EOS-filled after EOS). ``decoder``: ``"greedy"`` or ``"beam"``."""
        m, n = x.shape
        prompt = np.concatenate([np.full((m, 1), BOS), 4 + x, np.full((m, 1), SEP)], axis=1)
        steps = min(n + 1 + extra, self.seq_len - prompt.shape[1] + 1)
        if decoder == "greedy":
            out = greedy(model, prompt, steps, stop_token=EOS)
        elif decoder == "beam":
            out = beam_search(model, prompt, beam_width, steps, length_penalty, stop_token=EOS)
        else:
            raise ValueError(f"decoder: expected 'greedy' or 'beam', got {decoder!r}")
        gen = np.full((m, steps), EOS, dtype=np.int64)
        gen[:, :out.shape[1] - prompt.shape[1]] = out[:, prompt.shape[1]:]
        return gen

    def correct(self, gen, y):
        """Exact match per row: the generated tokens are ``4 + y`` followed by EOS."""
        n = y.shape[1]
        return (gen[:, :n] == 4 + y).all(axis=1) & (gen[:, n] == EOS)

    def exact_match(self, model, data, decoder="greedy", beam_width=4, length_penalty=0.6):
        """Fraction of held-out examples answered exactly (``data`` from ``heldout``)."""
        hits = total = 0
        for n, (x, y) in data.items():
            gen = self.decode(model, x, decoder, beam_width, length_penalty)
            hits += int(self.correct(gen, y).sum())
            total += len(y)
        return hits / total

    def show(self, tokens):
        """Readable text of a token row: symbols as digits/letters, specials by name, PAD dropped."""
        sym = "0123456789abcdefghijklmnopqrstuvwxyz"
        words = [SPECIALS[t] if t < 4 else (sym[t - 4] if t - 4 < len(sym) else str(t - 4))
                 for t in np.asarray(tokens).tolist() if t != PAD]
        return " ".join(words)
