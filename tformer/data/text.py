"""Byte-level text for TinyGPT: a corpus read at run time, a train/validation split, batches.

Nothing is downloaded and no third-party text is stored in the repository. The default corpus is the
source code of a fixed, sorted list of pure-Python standard-library modules, read from the files of the
running interpreter (``importlib.util.find_spec(name).origin``), so every installation of the same
Python version reads the same bytes. ``TextData.from_file`` trains on any file instead (``--text``).

Bytes are the tokens: the vocabulary is the 256 byte values, so any file is valid input and no
tokenizer is learned. A model's cross-entropy ``L`` (in nats per byte, the unit of ``F.cross_entropy``)
converts to bits per byte as ``L / ln 2``, the unit in which the corpus's unigram entropy
``H = −Σ_v p_v log₂ p_v`` is stated: a model that ignores context cannot do better than ``H``.
"""
import hashlib
import importlib.util
import math
import os

import numpy as np

from tformer.nn import functional as F

# Pure-Python modules shipped with every CPython 3.11 (no Tk, no test suite, no frozen modules),
# chosen among those whose source is byte-for-byte the same in 3.11.2 and 3.11.7, so that patch
# releases are unlikely to change the corpus. Sorted: the same bytes in the same order everywhere;
# ``TextData.fingerprint()`` names the bytes read, so a different corpus is easy to spot.
STDLIB_MODULES = (
    "bisect", "cmd", "code", "copy", "csv", "difflib", "email.message", "filecmp", "fnmatch",
    "fractions", "ftplib", "functools", "getopt", "glob", "gzip", "heapq", "hmac", "html.parser",
    "http.cookiejar", "imaplib", "json.decoder", "json.encoder", "linecache", "logging", "mailbox",
    "mimetypes", "numbers", "optparse", "pickle", "poplib", "pprint", "pstats", "queue", "random",
    "reprlib", "sched", "shelve", "shlex", "smtplib", "socketserver", "statistics", "string",
    "textwrap", "tokenize", "uuid", "warnings", "weakref", "xml.dom.minidom",
)


def encode(text):
    """str -> bytes (UTF-8) -> ``(N,)`` uint8 array of token ids."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    if not isinstance(text, (bytes, bytearray)):
        raise TypeError(f"text: expected str or bytes, got {type(text).__name__}")
    return np.frombuffer(bytes(text), dtype=np.uint8).copy()


def decode(tokens):
    """Token ids (any int array, values in [0, 256)) -> str; invalid UTF-8 shows as U+FFFD."""
    arr = np.asarray(tokens).ravel()
    if arr.size and (arr.min() < 0 or arr.max() > 255):
        raise ValueError(f"tokens: expected byte values in [0, 256), got min {arr.min()} and max {arr.max()}")
    return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def module_source(name):
    """The bytes of the source file of the standard-library module ``name``."""
    spec = importlib.util.find_spec(name)
    origin = getattr(spec, "origin", None)
    if origin is None or not origin.endswith(".py") or not os.path.isfile(origin):
        raise ValueError(f"name: module {name!r} has no Python source file in this installation "
                         f"(origin {origin!r}); train on a file of your own with --text FILE")
    with open(origin, "rb") as f:
        return f.read()


def stdlib_documents(modules=STDLIB_MODULES):
    """``[(name, bytes)]``: the source of each module, in the given (sorted) order."""
    return [(name, module_source(name)) for name in modules]


def unigram_entropy(data):
    """H = −Σ_v p_v log₂ p_v in bits per byte, p_v the frequency of byte v in ``data`` (uint8 array)."""
    data = np.asarray(data)
    if data.size == 0:
        raise ValueError("data: expected at least one byte, got an empty array")
    p = np.bincount(data.ravel().astype(np.int64), minlength=256) / data.size
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def unigram_cross_entropy(train, val):
    """−(1/N) Σ_n log₂ q(val_n) with q the add-one-smoothed byte frequencies of ``train``, bits per byte.

    The loss on held-out text of the context-free model estimated from the training split: the
    baseline a trained TinyGPT must beat. (The floor of every context-free model on that text is
    its own byte entropy; this estimate pays the KL divergence from the train frequencies on top.)
    """
    q = (np.bincount(np.asarray(train).ravel().astype(np.int64), minlength=256) + 1.0)
    q /= q.sum()
    return float(-np.log2(q[np.asarray(val).astype(np.int64)]).mean())


def bits_per_byte(loss_nats):
    """A cross-entropy in nats per byte -> bits per byte: ``L / ln 2``."""
    return float(loss_nats) / math.log(2.0)


def split_sizes(n, val_fraction):
    """``(train, val)``: the bytes of each split ``TextData`` makes of one ``n``-byte document
    (its last ``val_fraction`` held out, each piece followed by a newline)."""
    val = int(round(n * val_fraction))
    return n - val + 1, val + 1


class TextData:
    """A byte corpus split into train and validation, with seeded batches of next-byte targets.

    ``documents``: a list of ``(name, bytes)``. The last ``val_fraction`` of *each* document is held
    out for validation (a single file: its tail), so both splits sample every document alike; the
    pieces are concatenated, each document followed by a newline.
    ``batch(i) -> (x, y)`` are ``(B, T)`` int64 arrays with ``y[:, t] = x[:, t + 1]`` in the corpus:
    ``B = batch_size`` windows of ``T = block_size`` bytes at positions drawn by
    ``np.random.default_rng([seed, i])``, a pure function of ``(seed, i)``.
    """

    def __init__(self, documents, block_size, batch_size, val_fraction=0.1, seed=0):
        if not documents:
            raise ValueError("documents: expected at least one (name, bytes) pair, got none")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction: expected a value in (0, 1), got {val_fraction}")
        if block_size < 1 or batch_size < 1:
            raise ValueError(f"block_size, batch_size: expected ≥ 1, got {block_size}, {batch_size}")
        self.block_size, self.batch_size, self.seed = int(block_size), int(batch_size), seed
        self.val_fraction = val_fraction
        self.names = [name for name, _ in documents]
        train, val = [], []
        for name, raw in documents:
            cut = split_sizes(len(raw), val_fraction)[0] - 1             # the newline aside
            train.append(raw[:cut] + b"\n")
            val.append(raw[cut:] + b"\n")
        self.train = encode(b"".join(train))                      # (N_train,) uint8
        self.val = encode(b"".join(val))                          # (N_val,) uint8
        for split, arr in (("train", self.train), ("val", self.val)):
            if arr.size < self.block_size + 2:
                raise ValueError(f"documents: the {split} split has {arr.size} bytes, fewer than "
                                 f"block_size + 2 = {self.block_size + 2}; give more text")

    @classmethod
    def from_stdlib(cls, block_size, batch_size, val_fraction=0.1, seed=0, modules=STDLIB_MODULES):
        """The default corpus: the source of ``modules`` (``STDLIB_MODULES``), read at run time."""
        return cls(stdlib_documents(modules), block_size, batch_size, val_fraction, seed)

    @classmethod
    def from_file(cls, path, block_size, batch_size, val_fraction=0.1, seed=0):
        """Any file, read as bytes; its last ``val_fraction`` is the validation split."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"path: no such file {path!r}")
        with open(path, "rb") as f:
            return cls([(os.path.basename(path), f.read())], block_size, batch_size, val_fraction, seed)

    def fingerprint(self):
        """The first 12 hex digits of the SHA-256 of train + val: equal fingerprints, equal data."""
        h = hashlib.sha256(self.train.tobytes())
        h.update(self.val.tobytes())
        return h.hexdigest()[:12]

    @property
    def corpus(self):
        """Both splits together, ``(N,)`` uint8."""
        return np.concatenate([self.train, self.val])

    def unigram_entropy(self, split="corpus"):
        """The unigram entropy of ``"corpus"``, ``"train"`` or ``"val"``, bits per byte."""
        return unigram_entropy(self._split(split, allow_corpus=True))

    def _split(self, split, allow_corpus=False):
        if split == "train":
            return self.train
        if split == "val":
            return self.val
        if split == "corpus" and allow_corpus:
            return self.corpus
        raise ValueError(f"split: expected 'train' or 'val'{' or corpus' if allow_corpus else ''}, "
                         f"got {split!r}")

    def batch(self, i, split="train"):
        """``(x, y)``, each ``(B, T)`` int64, from random windows seeded by ``(seed, i)``."""
        data = self._split(split)
        rng = np.random.default_rng([self.seed, int(i)] if split == "train" else [self.seed, 1, int(i)])
        T = self.block_size
        starts = rng.integers(0, data.size - T - 1, size=self.batch_size)     # (B,)
        idx = starts[:, None] + np.arange(T + 1)                               # (B, T + 1)
        window = data[idx].astype(np.int64)                                    # (B, T + 1)
        return window[:, :-1], window[:, 1:]

    def windows(self, split="val", max_windows=None):
        """``(x, y)``: the split cut into consecutive, non-overlapping windows, ``(n, T)`` each.

        With ``max_windows``, that many windows evenly spaced over the split. Deterministic: the
        same windows every call, so evaluations at different steps are comparable.
        """
        data = self._split(split)
        T = self.block_size
        n = (data.size - 1) // T
        starts = np.arange(n) * T
        if max_windows is not None and n > max_windows:
            starts = starts[np.linspace(0, n - 1, max_windows).round().astype(np.int64)]
        idx = starts[:, None] + np.arange(T + 1)                               # (n, T + 1)
        window = data[idx].astype(np.int64)
        return window[:, :-1], window[:, 1:]

    def __repr__(self):
        return (f"TextData({len(self.names)} documents, train {self.train.size:,} bytes, "
                f"val {self.val.size:,} bytes, T={self.block_size}, B={self.batch_size})")


def evaluate_loss(model, x, y, batch_size=64):
    """Mean cross-entropy (nats per byte) of ``model`` on windows ``x, y: (n, T)``, in chunks.

    Every window has the same length, so the mean of the chunk means weighted by their sizes is the
    mean over all ``n·T`` positions.
    """
    total, count = 0.0, 0
    for s in range(0, x.shape[0], batch_size):
        logits = model.forward(x[s:s + batch_size])                           # (b, T, V)
        loss, _ = F.cross_entropy(logits, y[s:s + batch_size])
        n = y[s:s + batch_size].size
        total += loss * n
        count += n
    return total / count
