"""A file of preference pairs, read and checked: JSON lines ``{"prompt", "chosen", "rejected"}``
(text) -> ``tformer.tuning.tune.Pairs`` (token ids), or a ``UsageError`` naming the flag, the line, what
was expected and what came.

The file is what ``python -m tformer preference --pairs-out FILE`` writes (``tformer.tuning.pairs.
write_pairs``): UTF-8 without a byte-order mark, one JSON object per line, each with exactly the
three keys, each a non-empty string, the chosen response another text than the rejected one. A
final line break is allowed; an empty line is not (JSON lines has none).

Each prompt and each response is encoded on its own (``encode``: UTF-8 bytes, or a BPE
tokenizer's ``encode``), as the pairs were made: a prompt, then a response sampled after it. A
model of context T reads ``prompt + response`` without its last token, so a pair fits when
``P + R ≤ T + 1`` with R the longer response; a longer prompt is cut on the left (its last tokens,
the nearest to the response, kept), and a response of more than T tokens cannot fit at all.
"""
import json
import os

import numpy as np

from tformer.tuning.tune import Pairs
from tformer.runs.flags import UsageError

KEYS = ("prompt", "chosen", "rejected")
EXPECTED = 'JSON lines {"prompt": text, "chosen": text, "rejected": text}'


class _Duplicate(ValueError):
    pass


def _object(pairs):
    """``object_pairs_hook`` of ``json.loads``: a dict, refusing a key given twice."""
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(f"the key {k!r} twice")
        seen[k] = v
    return seen


def _kind(value):
    """What a JSON value is, in words (for 'got ...')."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false",
             type(None): "null", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _read_text(flag, path):
    """The file's text (UTF-8, no BOM), or a UsageError naming ``flag``."""
    if not os.path.isfile(path):
        why = "a folder" if os.path.isdir(path) else \
            "not a regular file" if os.path.exists(path) else "no such file"
        raise UsageError(f"{flag}: expected a file of {EXPECTED}, got {path!r} ({why})")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"{flag}: expected a readable file of {EXPECTED}, got {path!r} "
                         f"({e.strerror or e})") from None
    if not data.strip():
        raise UsageError(f"{flag}: expected {EXPECTED}, one pair a line, got "
                         f"{'an empty file' if not data else 'a file of white space only'} "
                         f"{path!r}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UsageError(f"{flag}: line {line} of {path!r}: expected UTF-8 text, got the byte "
                         f"0x{data[e.start]:02x} that is not UTF-8 ({e.reason})") from None
    return text


def _fields(flag, path, n, line):
    """The three strings of line ``n``, or a UsageError naming what is wrong with it."""
    where = f"{flag}: line {n} of {path!r}"
    if line.startswith("\ufeff"):
        raise UsageError(f"{where}: expected a JSON object, got a byte-order mark (U+FEFF) "
                         f"before it (save the file as UTF-8 without BOM)")
    if not line.strip():
        raise UsageError(f"{where}: expected a JSON object {{\"prompt\", \"chosen\", "
                         f"\"rejected\"}}, got an empty line")
    try:
        obj = json.loads(line, object_pairs_hook=_object)
    except _Duplicate as e:
        raise UsageError(f"{where}: expected each key once, got {e}") from None
    except (ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise UsageError(f"{where}: expected a JSON object, got text that is not JSON "
                         f"({why})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: expected a JSON object {{\"prompt\", \"chosen\", "
                         f"\"rejected\"}}, got {_kind(obj)}")
    missing = [k for k in KEYS if k not in obj]
    extra = [k for k in obj if k not in KEYS]
    if missing or extra:
        got = ", ".join([f"no {k!r}" for k in missing] + [f"the key {k!r}" for k in extra])
        raise UsageError(f"{where}: expected exactly the keys \"prompt\", \"chosen\", "
                         f"\"rejected\", got {got}")
    for k in KEYS:
        v = obj[k]
        if not isinstance(v, str):
            raise UsageError(f"{where}: expected {k!r} to be a string, got {_kind(v)}")
        if not v:
            raise UsageError(f"{where}: expected a non-empty {k!r}, got \"\"")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise UsageError(f"{where}: expected {k!r} to be text that has a UTF-8 encoding, got "
                             f"the lone surrogate U+{ord(v[e.start]):04X} at character "
                             f"{e.start}") from None
    if obj["chosen"] == obj["rejected"]:
        raise UsageError(f"{where}: expected a chosen response other than the rejected one, got "
                         f"the same text twice ({obj['chosen'][:40]!r})")
    return obj["prompt"], obj["chosen"], obj["rejected"]


def _padded(rows):
    """``(N, max length)`` int64, each row right-padded with 0, and the lengths ``(N,)``."""
    lengths = np.array([r.size for r in rows], dtype=np.int64)
    out = np.zeros((len(rows), int(lengths.max())), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :r.size] = r
    return out, lengths


def read_pairs(flag, path, encode, max_len):
    """``(pairs, cut)``: the pairs of the file ``path`` given as ``flag`` as token arrays
    (``Pairs``), and the number of prompts cut on the left to fit ``max_len``. ``encode``: text ->
    ``(n,)`` token ids. Every line is checked before any is used; a UsageError otherwise."""
    text = _read_text(flag, path)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()                                  # the final line break
    prompts, chosen, rejected, cut = [], [], [], 0
    for n, line in enumerate(lines, 1):
        ids = [np.asarray(encode(s), dtype=np.int64) for s in _fields(flag, path, n, line)]
        for k, name in ((1, "chosen"), (2, "rejected")):
            if ids[k].size > max_len:
                raise UsageError(f"{flag}: line {n} of {path!r}: expected a {name} response of at "
                                 f"most {max_len} tokens (the model's context T = {max_len}, "
                                 f"with one token of the prompt before it), got {ids[k].size}")
        room = max_len + 1 - max(ids[1].size, ids[2].size)
        if ids[0].size > room:
            ids[0], cut = ids[0][-room:], cut + 1
        prompts.append(ids[0])
        chosen.append(ids[1])
        rejected.append(ids[2])
    prompt, prompt_len = _padded(prompts)
    (w, w_len), (l, l_len) = _padded(chosen), _padded(rejected)
    return Pairs(prompt, w, w_len, l, l_len, prompt_len), cut
