"""Decoding from token models: greedy (here); sampling and the KV-cache path are added beside it.

A token model is anything with ``forward(tokens: (B, T) ints) -> logits: (B, T, V)``.
"""
import numpy as np

from ._validate import int_array


def greedy(model, prompt, max_new_tokens, stop_token=None):
    """x_{t+1} = argmax_v logits(x_{≤t})_v, appended ``max_new_tokens`` times (full recomputation).

    Shapes: ``prompt: (B, T0)`` ints -> ``(B, T0 + max_new_tokens)`` (fewer if every row emitted
    ``stop_token``). Uses the model in eval mode and restores its mode afterwards.
    """
    int_array("prompt", prompt, ndim=2)
    was_training = model.training
    model.eval()
    try:
        out = prompt.copy()
        done = np.zeros(prompt.shape[0], bool)
        for _ in range(max_new_tokens):
            logits = model.forward(out)                      # (B, T, V)
            nxt = logits[:, -1].argmax(axis=-1)              # (B,)
            if stop_token is not None:
                nxt = np.where(done, stop_token, nxt)
                done |= nxt == stop_token
            out = np.concatenate([out, nxt[:, None].astype(out.dtype)], axis=1)
            if stop_token is not None and done.all():
                break
        return out
    finally:
        model.train(was_training)
