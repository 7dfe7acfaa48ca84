"""A byte corpus encoded with a BPE tokenizer: the same splits, batches of token ids, bits per byte.

``TokenData.encode(text_data, tokenizer)`` encodes the training and the validation bytes of a
``TextData`` separately (so no token spans the cut), and batches windows of ``T`` *tokens* the way
``TextData`` batches windows of ``T`` bytes (the same ``batch(i)`` and ``windows()``, seeded alike).

**Bits per byte, whatever the tokens.** A model's mean cross-entropy ``L`` over ``N`` predicted
tokens, in nats per token, is a total of ``N·L`` nats for the text those tokens spell. If they spell
``n`` bytes, the cost per byte is

    bits/byte = N·L / (n · ln 2)

(with bytes as tokens, ``N = n`` and this is the ``L / ln 2`` of ``tformer.data.text.bits_per_byte``).
A cross-entropy per token does not compare across vocabularies (a longer token is harder to
guess and says more); per byte of the same validation text it does.
"""
import math

import numpy as np

from tformer.data.text import TextData, evaluate_loss


class TokenData(TextData):
    """``TextData``'s batching over token ids: ``train``/``val`` are ``(N,)`` int32 token arrays.

    ``token_lengths[v]``: the bytes of token ``v`` (for bits per byte).
    """

    def __init__(self, train, val, token_lengths, block_size, batch_size, seed=0, names=()):
        if block_size < 1 or batch_size < 1:
            raise ValueError(f"block_size, batch_size: expected ≥ 1, got {block_size}, {batch_size}")
        self.block_size, self.batch_size, self.seed = int(block_size), int(batch_size), seed
        self.names = list(names)
        self.token_lengths = np.asarray(token_lengths, dtype=np.int64)       # (V,)
        self.train = np.asarray(train, dtype=np.int32)
        self.val = np.asarray(val, dtype=np.int32)
        for split, arr in (("train", self.train), ("val", self.val)):
            if arr.size < self.block_size + 2:
                raise ValueError(f"{split}: the split has {arr.size} tokens, fewer than "
                                 f"block_size + 2 = {self.block_size + 2}; give more text")
            if arr.size and (arr.min() < 0 or arr.max() >= self.token_lengths.size):
                raise ValueError(f"{split}: expected token ids in [0, {self.token_lengths.size}), "
                                 f"got min {arr.min()} and max {arr.max()}")

    @classmethod
    def encode(cls, text_data, tokenizer, block_size=None, batch_size=None, seed=None):
        """Encode ``text_data``'s two splits with ``tokenizer`` (a ``tformer.data.bpe.BPETokenizer``);
        window size, batch size and seed default to ``text_data``'s."""
        lengths = [len(t) for t in tokenizer.tokens]
        return cls(tokenizer.encode(text_data.train.tobytes()),
                   tokenizer.encode(text_data.val.tobytes()), lengths,
                   block_size or text_data.block_size, batch_size or text_data.batch_size,
                   text_data.seed if seed is None else seed, text_data.names)

    @property
    def vocab_size(self):
        return int(self.token_lengths.size)

    def bytes_per_token(self, split="train"):
        """Bytes of text per token of ``split``."""
        data = self._split(split)
        return float(self.token_lengths[data].sum() / data.size)

    def bits_per_byte(self, model, split="val", max_windows=None, batch_size=64):
        """``model``'s cross-entropy on ``split``'s windows in bits per byte of the text they
        predict: N·L / (n·ln 2), N the predicted tokens, n their bytes."""
        x, y = self.windows(split, max_windows)
        nats_per_token = evaluate_loss(model, x, y, batch_size)
        return nats_to_bits_per_byte(nats_per_token, y.size, int(self.token_lengths[y].sum()))


def nats_to_bits_per_byte(nats_per_token, n_tokens, n_bytes):
    """A mean cross-entropy over ``n_tokens`` tokens that spell ``n_bytes`` bytes -> bits per byte."""
    if n_tokens < 1 or n_bytes < 1:
        raise ValueError(f"n_tokens, n_bytes: expected ≥ 1, got {n_tokens}, {n_bytes}")
    return float(nats_per_token) * n_tokens / (n_bytes * math.log(2.0))
