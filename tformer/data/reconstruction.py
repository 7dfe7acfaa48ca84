"""The post-LN encoder's reconstruction task: a fixed set of sequences X that the encoder must give back.

The source states the task (Ŷ ≈ X under the mean squared error) but not its data; this is the data
the book chooses, drawn once from ``seed`` and then kept fixed:

    E ∈ R^{V×d}: rows drawn from N(0, I_d), then standardised (mean 0, variance 1 per row)
    s ∈ {0..V−1}^{N×T}: token ids drawn uniformly;    X[n, t] = E[s[n, t]]      (N, T, d)

Defaults: V = 65 symbols and T = 16 positions (the sizes of the script its source links),
d = 64, N = 256 training sequences, a held-out set of 64 more sequences drawn from the same
table, mini-batches of 32. One **epoch** is one pass over the N training sequences in
⌈N / batch_size⌉ mini-batches, in an order shuffled afresh each epoch.

Why standardised rows: the encoder's output is a LayerNorm output, γ ⊙ x̂ + β with x̂ of mean 0 and
variance 1 per token. A target with the same statistics is reachable exactly; raw N(0, I_d)
rows are not, and would leave an MSE floor of about 1/d + 1/(2d) ≈ 0.023 at d = 64.
"""
import math

import numpy as np

from tformer.nn import functional as F


def standardize_rows(a, eps=0.0):
    """a ← (a − mean(a)) / std(a) over the last axis: mean 0 and (population) variance 1 per row."""
    a = a - a.mean(axis=-1, keepdims=True)
    return a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + eps)


class ReconstructionData:
    """The fixed reconstruction set: ``train: (n_train, T, d)``, ``test: (n_test, T, d)``, ``table: (V, d)``.

    ``batch(i)`` is mini-batch ``i`` counted from 0 over all epochs (``i = epoch·steps_per_epoch + j``),
    a pure function of ``i`` so that a resumed run sees the same data; the target is the batch itself.
    """

    def __init__(self, n_train=256, n_test=64, seq_len=16, d_model=64, vocab_size=65, batch_size=32,
                 seed=0, dtype=np.float32):
        for name, value in (("n_train", n_train), ("n_test", n_test), ("seq_len", seq_len),
                            ("d_model", d_model), ("vocab_size", vocab_size), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if d_model < 2:
            raise ValueError(f"d_model: expected at least 2 (a row must have a variance), got {d_model}")
        self.config = dict(n_train=int(n_train), n_test=int(n_test), seq_len=int(seq_len),
                           d_model=int(d_model), vocab_size=int(vocab_size), batch_size=int(batch_size),
                           seed=int(seed), dtype=np.dtype(dtype).name)
        self.seed, self.batch_size = int(seed), int(batch_size)
        rng = np.random.default_rng([self.seed, 3])                         # 3: this task's stream
        self.table = standardize_rows(rng.standard_normal((vocab_size, d_model))).astype(dtype)   # (V, d)
        self.train_tokens = rng.integers(0, vocab_size, (n_train, seq_len))  # (N, T)
        self.test_tokens = rng.integers(0, vocab_size, (n_test, seq_len))    # (N_test, T)
        self.train = self.table[self.train_tokens]                          # (N, T, d)
        self.test = self.table[self.test_tokens]                            # (N_test, T, d)
        self.steps_per_epoch = math.ceil(n_train / batch_size)

    def epoch_order(self, epoch):
        """The permutation of the training sequences used in ``epoch`` (0-based)."""
        return np.random.default_rng([self.seed, 1, int(epoch)]).permutation(len(self.train))

    def batch(self, i):
        """Mini-batch ``i`` (0-based over all epochs): ``(b, T, d)``.

        ``b = batch_size``, except the last batch of an epoch, which holds what is left.
        """
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
            raise ValueError(f"i: expected a batch index ≥ 0, got {i!r}")
        epoch, j = divmod(int(i), self.steps_per_epoch)
        idx = self.epoch_order(epoch)[j * self.batch_size:(j + 1) * self.batch_size]
        return self.train[idx]                                              # (b, T, d)


def forward_loss(model, x):
    """L = ‖model(X) − X‖² / (B·T·d),  ∂L/∂Ŷ = 2(Ŷ − X)/(B·T·d): the post-LN encoder's loss
    (the mean over every entry).

    The ``forward_loss(model, batch) -> (loss, dout)`` that ``tformer.training.train.train`` expects.
    """
    return F.mse_loss(model.forward(x), x, reduction="mean")


def mse(model, X, batch_size=256):
    """The mean squared reconstruction error of ``model`` over all of ``X: (N, T, d)`` (forward only).

    Evaluated in chunks of ``batch_size`` sequences; the result is the mean over N·T·d entries.
    """
    total = 0.0
    for start in range(0, len(X), batch_size):
        x = X[start:start + batch_size]
        diff = model.forward(x) - x
        total += float(np.vdot(diff, diff))
    return total / X.size


def per_token_error(model, X):
    """‖Ŷ[n, t] − X[n, t]‖₂ for every token: ``(N, T)`` (the post-LN encoder's "per-token embedding error")."""
    diff = model.forward(X) - X
    return np.sqrt(np.einsum("ntd,ntd->nt", diff, diff))
