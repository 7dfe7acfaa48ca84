"""The corpus of the scaling experiments: all 38 plays as BPE tokens, measured per character.

    bytes --BPE(V), trained on the training split--> tokens;  train: (N_train,), yardstick: (N_y,)
    nats/char = Σ_n −ln p(y_n | y_<n) / Σ_n bytes(y_n)      over the yardstick's predicted tokens

The training split is the first nine tenths of each of the 38 plays (``tformer.data.all_plays``);
the yardstick is the eight plays' validation text, the characters on which the chapter "TinyGPT
learns Shakespeare" reports 1.763 nats/char. The tokenizer (``tformer.data.bpe``, the book's own
trainer) learns its merges from the training split only. A loss per token does not compare across
vocabularies; the same loss summed and divided by the characters the predicted tokens spell does
(``tformer.data.tokens``), so every run here reports nats per character of the same text.
The ASCII text makes a byte a character.

Evaluation cuts the yardstick's tokens into consecutive, non-overlapping windows of ``T`` tokens
(``TextData.windows``), as the eight-play runs cut their characters into windows of 64: the
first token of each window is predicted from no context. With ``T`` tokens the windows span more
characters than 64, so at equal modelling skill a token model has a little more context.
"""
import time
from dataclasses import dataclass

import numpy as np

from tformer.data.bpe import BPETokenizer
from tformer.data.all_plays import all_plays_data, all_plays_documents, yardstick
from tformer.data.text import evaluate_loss
from tformer.data.tokens import TokenData
from tformer.experiments.bpe_compare import merges_fingerprint


@dataclass
class Corpus:
    """The token splits of one vocabulary: ``tokens`` (``TokenData`` of the training split and of
    all 38 plays' validation text), ``yardstick`` ``(N_y,)`` ids of the eight plays' validation
    text, ``tokenizer`` and what it cost (``info``)."""
    tokens: TokenData
    yardstick: np.ndarray
    tokenizer: BPETokenizer
    info: dict

    def windows(self, T):
        """``(x, y)``, ``(n, T)`` each: the yardstick cut into non-overlapping windows of T tokens."""
        return token_windows(self.yardstick, T)

    def nats_per_char(self, model, T, batch_size=32):
        """The model's loss on the yardstick, in nats per character: N·L / n."""
        return self.windows_nats_per_char(model, *self.windows(T), batch_size)

    def windows_nats_per_char(self, model, x, y, batch_size=32):
        """The model's loss on windows ``(x, y)`` of this vocabulary's tokens, ``(n, T)`` each, in
        nats per character of the tokens predicted: N·L / n."""
        return windows_nats_per_char(model, x, y, self.tokens.token_lengths, batch_size)


def token_windows(ids, T):
    """``(x, y)``, ``(n, T)`` each: token ids ``(N,)`` cut into non-overlapping windows of T tokens
    (n = ⌊(N − 1)/T⌋), y the next token of every position of x."""
    n = (ids.size - 1) // T
    idx = np.arange(n)[:, None] * T + np.arange(T + 1)                  # (n, T + 1)
    w = ids[idx].astype(np.int64)
    return w[:, :-1], w[:, 1:]


def windows_nats_per_char(model, x, y, token_lengths, batch_size=32):
    """The model's loss on windows ``(x, y)``, ``(n, T)`` each, in nats per character of the
    tokens predicted: N·L / n, with ``token_lengths[v]`` the bytes of token v."""
    per_token = evaluate_loss(model, x, y, batch_size)
    return float(per_token * y.size / np.asarray(token_lengths)[y].sum())


def prepare(vocab_size, documents=None):
    """``Corpus`` for a vocabulary of ``vocab_size`` tokens (256: bytes, no merge)."""
    docs = documents or all_plays_documents()
    data = all_plays_data(documents=docs)
    t0 = time.perf_counter()
    tokenizer = BPETokenizer.train(data.train.tobytes(), vocab_size)
    seconds = time.perf_counter() - t0
    tokens = TokenData.encode(data, tokenizer, block_size=1, batch_size=1)
    stick = yardstick(data, docs)
    ids = tokenizer.encode(stick.tobytes()).astype(np.int32)
    info = {"vocab_size": tokenizer.vocab_size, "merges_fingerprint": merges_fingerprint(tokenizer),
            "bpe_seconds": round(seconds, 3), "corpus_fingerprint": data.fingerprint(),
            "plays": len(docs), "train_chars": int(data.train.size), "val_chars": int(data.val.size),
            "yardstick_chars": int(stick.size), "train_tokens": int(tokens.train.size),
            "yardstick_tokens": int(ids.size),
            "chars_per_token_train": round(data.train.size / tokens.train.size, 5),
            "chars_per_token_yardstick": round(stick.size / ids.size, 5)}
    return Corpus(tokens, ids, tokenizer, info)
