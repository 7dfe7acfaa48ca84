"""Preference pairs from a model's own lines: prompts, continuations, a judge, and the batches of DPO.

    prompt x: the P tokens of a speech that end with a line break
    response y ~ π(· | x): sampled until its first line break (at most R tokens)
    pair (y_w, y_l): two responses to the same x, the judge says yes to y_w and no to y_l

A prompt ends inside a speech, after a line of it and before another line of the same speech, so
the model's next line continues a speech (verse, where the play is in verse). A response runs up
to and including its first token that holds a line break (BPE keeps ``\\n`` a token of its own,
or ``\\n\\n``); the line is the text before that break. A response with no break in R tokens is a
line too long to be one, and is kept as R tokens. The judge is any ``line -> bool``; the book's is
``tformer.data.meter.scans`` (iambic pentameter).

A DPO batch holds the B chosen and the B rejected sequences x·y as 2B rows, right-padded with
token 0 to one length: the inputs are the rows without their last token, the targets the rows
shifted by one, and the mask marks the targets that are response tokens (a causal model never
sees the padding from an earlier position, so it changes nothing).
"""
import json

import numpy as np

PROMPT_TOKENS = 40
RESPONSE_TOKENS = 24


def _is_heading(line):
    """A speaker's name line ("HAMLET:") or an empty line: not a line of a speech."""
    s = line.strip()
    return not s or (s.endswith(":") and s[:-1].replace(" ", "").replace("'", "").isupper())


def prompt_ends(text):
    """Character offsets just after each line break that closes a line of a speech followed by
    another line of the same speech (neither is empty nor a speaker's name)."""
    ends, pos = [], 0
    lines = text.split("\n")
    for a, b in zip(lines[:-1], lines[1:]):
        pos += len(a) + 1
        if not _is_heading(a) and not _is_heading(b):
            ends.append(pos)
    return np.array(ends, dtype=np.int64)


def prompts(text, tokenizer, n, rng, prompt_tokens=PROMPT_TOKENS, context_chars=600):
    """``(n, P)`` token ids: the last P tokens before ``n`` distinct prompt ends of ``text``, drawn
    by ``rng`` (ends with fewer than P tokens before them are skipped), and their offsets ``(n,)``."""
    ends = prompt_ends(text)
    ends = ends[ends >= context_chars]
    if ends.size < n:
        raise ValueError(f"n: expected at most {ends.size} prompts from this text, got {n}")
    picked = np.sort(rng.choice(ends, size=n, replace=False))
    rows = []
    for end in picked:
        ids = tokenizer.encode(text[end - context_chars:end].encode())
        rows.append(ids[-prompt_tokens:])
    return np.array(rows, dtype=np.int64), picked


def newline_tokens(tokenizer):
    """``(V,)`` bool: the tokens whose bytes hold a line break."""
    return np.array([b"\n" in tokenizer.decode_bytes([i]) for i in range(tokenizer.vocab_size)])


def cut_responses(generated, breaks):
    """Each row of ``generated`` ``(N, R)`` cut after its first line-break token: ``lengths (N,)``
    (R where there is none). ``breaks``: ``newline_tokens``."""
    hit = breaks[generated]                                             # (N, R)
    first = hit.argmax(axis=1)
    return np.where(hit.any(axis=1), first + 1, generated.shape[1])


def line_of(tokenizer, response):
    """The text of a response up to its first line break."""
    return tokenizer.decode_bytes(list(response)).decode("utf-8", "replace").split("\n", 1)[0]


def sample_responses(model, prompt_ids, n, rng, temperature=1.0, response_tokens=RESPONSE_TOKENS,
                     batch_rows=256):
    """``n`` sampled continuations of every prompt: ``(M, n, R)`` tokens (each row's tokens after its
    length are the sampler's, unused). The draws come from ``rng`` batch by batch."""
    from tformer.decoding.generate import sample
    rows = np.repeat(prompt_ids, n, axis=0)                             # (M n, P)
    out = []
    for i in range(0, rows.shape[0], batch_rows):
        seq = sample(model, rows[i:i + batch_rows], response_tokens, temperature=temperature, rng=rng)
        out.append(seq[:, prompt_ids.shape[1]:])
    return np.concatenate(out).reshape(prompt_ids.shape[0], n, response_tokens)


def make_pairs(judged):
    """``[(prompt, chosen, rejected)]`` sample indices: per prompt, each yes paired with a no, in
    sample order, while both last. ``judged``: ``(M, n)`` bool, the judge on each sample."""
    pairs = []
    for m, row in enumerate(judged):
        yes, no = np.flatnonzero(row), np.flatnonzero(~row)
        pairs += [(m, int(w), int(l)) for w, l in zip(yes, no)]
    return pairs


def sequences(prompt_ids, responses, lengths, prompt_lengths=None):
    """The rows of prompts and their responses, ``(x, targets, mask)``, ``(N, T)`` each: row n is
    prompt n then response n, right-padded with 0, ``T = max(P_n + length_n) − 1``; the mask marks
    the targets that are response tokens. ``prompt_ids: (N, P)`` (only the first
    ``prompt_lengths[n]`` of row n used; default all P), ``responses: (N, R)``, ``lengths: (N,)``."""
    N, P = prompt_ids.shape
    p_len = (np.full(N, P) if prompt_lengths is None else np.asarray(prompt_lengths))[:, None]
    total = p_len + np.asarray(lengths)[:, None]                           # (N, 1)
    j = np.broadcast_to(np.arange(int(total.max())), (N, int(total.max())))  # position in the row
    from_prompt = np.take_along_axis(prompt_ids, np.minimum(j, P - 1), axis=1)
    from_response = np.take_along_axis(responses, np.clip(j - p_len, 0, responses.shape[1] - 1),
                                       axis=1)
    in_response = (j >= p_len) & (j < total)
    seq = np.where(j < p_len, from_prompt, np.where(in_response, from_response, 0)).astype(np.int64)
    return seq[:, :-1], seq[:, 1:], in_response[:, 1:]


def pair_batch(prompt_ids, chosen, chosen_len, rejected, rejected_len, prompt_lengths=None):
    """One DPO batch: ``(x, targets, mask)`` with the B chosen rows first, then the B rejected."""
    R = max(chosen.shape[1], rejected.shape[1])
    both = np.zeros((2 * prompt_ids.shape[0], R), dtype=np.int64)
    both[:chosen.shape[0], :chosen.shape[1]] = chosen
    both[chosen.shape[0]:, :rejected.shape[1]] = rejected
    p_len = None if prompt_lengths is None else np.concatenate([prompt_lengths, prompt_lengths])
    return sequences(np.concatenate([prompt_ids, prompt_ids]), both,
                     np.concatenate([chosen_len, rejected_len]), p_len)


def write_pairs(path, tokenizer, rows):
    """JSON lines ``{"prompt", "chosen", "rejected"}`` (text) for ``rows`` of token id lists."""
    from tformer.core.atomic import atomic_open
    with atomic_open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({k: tokenizer.decode_bytes(list(v)).decode("utf-8", "replace")
                                for k, v in zip(("prompt", "chosen", "rejected"), r)}) + "\n")
