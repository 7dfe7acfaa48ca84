"""Byte-level byte-pair encoding (BPE), trained by hand: text -> token ids -> text.

    text --pre-tokenise--> chunks --UTF-8--> bytes 0..255 --merges, by rank--> token ids

**Training.** Every token starts as one of the 256 byte values (ids 0..255, id = byte value), so
any text has an encoding and nothing is ever unknown. Count every adjacent pair of tokens in the
training text, give the most frequent pair a new id, replace it everywhere, and repeat until the
vocabulary holds ``vocab_size`` tokens. The merges, in order, are the tokenizer.

**Pre-tokenisation: what never merges.** Pairs are counted inside chunks only, never across a
chunk's edge. The text is cut into chunks by ``PATTERN``, tried left to right, first match wins:

- ``" ?[^\\W\\d_]+"``: a run of letters with at most one space before it (``" king"``). Python's
  ``re`` has no ``\\p{L}``; ``[^\\W\\d_]`` (a word character that is neither a decimal digit nor
  ``_``) is its nearest letter class: every ``str.isalpha()`` character, plus the few numerals
  that are not decimal digits (``½``).
- ``" ?\\d+"``: a run of decimal digits, with at most one space before it.
- ``" ?(?:[^\\s\\w]|_)+"``: a run of anything else (punctuation, symbols, ``_``), likewise.
- ``"\\s*[\\r\\n]+"``: whitespace that ends in line breaks (``"\\n\\n"``, ``"  \\n"``), one chunk.
- ``"\\s+(?!\\S)"``, then ``"\\s+"``: any other run of whitespace. The first form leaves the last
  space of a run to the word that follows it, so ``"a   b"`` gives ``"a"``, ``"  "``, ``" b"``.

Every character falls in exactly one class, so the chunks concatenate to the text. No token
spans a word and its punctuation, a letter and a digit, or a newline and a word. Counting runs
over the distinct chunks, each weighted by how often it occurs (``chunk_counts``), as HF
``tokenizers`` does: a million characters hold a few tens of thousands of distinct chunks.

**Tie-break.** Among pairs of equal count, the smallest pair ``(a, b)`` of ids wins (``a`` first,
then ``b``): the order of ``heapq`` on ``(-count, a, b)``. HF ``tokenizers`` breaks ties the same
way in *its* ids, which number the 256 bytes in the code-point order of their printable stand-ins
(``byte_level_alphabet``), not by byte value; ``train_merges(alphabet=...)`` takes that order.

**A merge that makes an existing token.** ``"ab" + "c"`` and ``"a" + "bc"`` are both ``"abc"``: the
second merge reuses the first one's id, as HF ``tokenizers`` does, so every id names one byte
string. The merge still counts in the list, and training goes on until ``vocab_size`` distinct
tokens exist.

**Incremental counting.** A merge changes only the chunks that contain its pair
(``where[pair]``, a set of chunk indices kept with the counts): their pairs before the merge are
subtracted, their pairs after it added, and a pair whose count grew is pushed on the heap. A heap
entry whose count no longer matches is stale and is re-pushed with the current count when it
surfaces (counts of old pairs only fall, so the heap's top is always checked against the truth).
``naive_merges`` recounts everything after every merge; the tests hold the two equal.

**Encoding** applies, inside each chunk, the merge of lowest rank among the chunk's adjacent
pairs, until none applies; on the training text this gives the training's own segmentation.
**Decoding** concatenates the tokens' bytes and reads them as UTF-8. ``decode(encode(s)) == s`` for
every ``str`` (a lone surrogate, which has no UTF-8 form, is refused), and
``decode_bytes(encode(b)) == b`` for every ``bytes`` (invalid UTF-8 included: bytes are split into
chunks through Python's ``surrogateescape``).

**File.** ``save`` writes JSON atomically: ``{"format", "version", "pattern", "merges"}``; the
vocabulary is rebuilt from the merges.
"""
import hashlib
import heapq
import json
import re

import numpy as np

from tformer.core.atomic import write_json

PATTERN = r" ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s*[\r\n]+|\s+(?!\S)|\s+"
BYTES = tuple(bytes([i]) for i in range(256))
FORMAT, VERSION = "tformer-bpe", 1


def _check_text(text, name="text"):
    """str or bytes -> str to split (bytes that are not UTF-8 kept as ``surrogateescape``)."""
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="surrogateescape")
    if not isinstance(text, str):
        raise TypeError(f"{name}: expected str or bytes, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name}: expected text that has a UTF-8 encoding, got the lone surrogate "
                         f"U+{ord(text[e.start]):04X} at index {e.start}") from None
    return text


def pretokenize(text, pattern=PATTERN):
    """The chunks of ``text`` (``PATTERN``'s matches, in order), each as UTF-8 bytes."""
    text = _check_text(text)
    return [m.encode("utf-8", errors="surrogateescape") for m in re.findall(pattern, text)]


def chunk_counts(text, pattern=PATTERN):
    """``{chunk bytes: occurrences}``, in order of first occurrence."""
    counts = {}
    for chunk in pretokenize(text, pattern):
        counts[chunk] = counts.get(chunk, 0) + 1
    return counts


def check_vocab_size(vocab_size):
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise TypeError(f"vocab_size: expected an int, got {type(vocab_size).__name__}")
    if vocab_size < 256:
        raise ValueError(f"vocab_size: expected an integer ≥ 256 (the 256 byte values), "
                         f"got {vocab_size}")
    return int(vocab_size)


def most_tokens(text, pattern=PATTERN):
    """The largest vocabulary BPE can learn from ``text``: the 256 bytes and at most n − 1 merges
    per distinct chunk of n bytes (after them the chunk is one token)."""
    return 256 + sum(len(chunk) - 1 for chunk in chunk_counts(text, pattern))


def merge_word(word, pair, new_id):
    """Replace each occurrence of ``pair`` in ``word`` (a list of ids), left to right."""
    a, b = pair
    out, j, n = [], 0, len(word)
    while j < n:
        if j + 1 < n and word[j] == a and word[j + 1] == b:
            out.append(new_id)
            j += 2
        else:
            out.append(word[j])
            j += 1
    return out


def count_pairs(words, counts):
    """``pairs[(a, b)]``: occurrences of the adjacent pair, each word weighted by its count;
    ``where[(a, b)]``: the indices of the words that contain it."""
    pairs, where = {}, {}
    for i, (word, n) in enumerate(zip(words, counts)):
        for pair in zip(word, word[1:]):
            pairs[pair] = pairs.get(pair, 0) + n
            where.setdefault(pair, set()).add(i)
    return pairs, where


def apply_merge(words, counts, pair, new_id, pairs, where, heap):
    """Merge ``pair`` into ``new_id`` in the words that hold it, and update the counts there only:
    minus the pairs of each word before the merge, plus its pairs after; grown counts are pushed."""
    delta = {}
    for i in sorted(where.pop(pair, ())):
        old = words[i]
        new = merge_word(old, pair, new_id)
        if len(new) == len(old):                  # an index left from before: pair no longer here
            continue
        words[i], n = new, counts[i]
        for p in zip(old, old[1:]):
            delta[p] = delta.get(p, 0) - n
        for p in zip(new, new[1:]):
            delta[p] = delta.get(p, 0) + n
            where.setdefault(p, set()).add(i)
    for p, d in delta.items():
        pairs[p] = pairs.get(p, 0) + d
        if pairs[p] <= 0:
            del pairs[p]
        elif d > 0:
            heapq.heappush(heap, (-pairs[p], p))


def train_merges(words, counts, vocab_size, alphabet=BYTES):
    """Merges ``[(a, b)]`` and tokens ``[bytes]`` (id -> bytes) learned from ``words``.

    ``words``: sequences of ids in ``range(len(alphabet))``; ``counts``: how often each occurs;
    ``alphabet``: the bytes of the first ids. Stops at ``vocab_size`` tokens or when no pair is left.
    """
    tokens = list(alphabet)
    ids = {t: i for i, t in enumerate(tokens)}
    words = [list(w) for w in words]
    pairs, where = count_pairs(words, counts)
    heap = [(-n, p) for p, n in pairs.items()]
    heapq.heapify(heap)                            # most frequent first, then the smallest pair
    merges = []
    while len(tokens) < vocab_size and heap:
        negative, pair = heapq.heappop(heap)
        if pairs.get(pair, 0) != -negative:        # stale: its count fell since it was pushed
            if pair in pairs:
                heapq.heappush(heap, (-pairs[pair], pair))
            continue
        new = tokens[pair[0]] + tokens[pair[1]]
        new_id = ids.setdefault(new, len(tokens))  # "ab"+"c" after "a"+"bc": the same token
        if new_id == len(tokens):
            tokens.append(new)
        merges.append(pair)
        apply_merge(words, counts, pair, new_id, pairs, where, heap)
    return merges, tokens


def naive_merges(words, counts, vocab_size, alphabet=BYTES):
    """``train_merges`` without the bookkeeping: every pair recounted after every merge (slow;
    the tests' reference)."""
    tokens = list(alphabet)
    ids = {t: i for i, t in enumerate(tokens)}
    words, merges = [list(w) for w in words], []
    while len(tokens) < vocab_size:
        pairs, _ = count_pairs(words, counts)
        if not pairs:
            break
        pair = min(pairs, key=lambda p: (-pairs[p], p))
        new = tokens[pair[0]] + tokens[pair[1]]
        new_id = ids.setdefault(new, len(tokens))
        if new_id == len(tokens):
            tokens.append(new)
        merges.append(pair)
        words = [merge_word(w, pair, new_id) for w in words]
    return merges, tokens


def encode_chunk(ids, ranks):
    """One chunk's ids -> its tokens: merge the pair of lowest rank present, until none is.

    ``ranks[(a, b)] = (rank, new_id)``: the merges, in training order.
    """
    ids = list(ids)
    while len(ids) > 1:
        present = [(ranks[p][0], p) for p in zip(ids, ids[1:]) if p in ranks]
        if not present:
            break
        _, pair = min(present)
        ids = merge_word(ids, pair, ranks[pair][1])
    return ids


class BPETokenizer:
    """A byte-level BPE tokenizer: ``merges`` (pairs of ids, in order) and ``pattern``.

    ``BPETokenizer.train(text, vocab_size)`` learns it; ``encode(text) -> (N,) int64`` ids;
    ``decode(ids) -> str``; ``decode_bytes(ids) -> bytes``; ``save(path)`` / ``load(path)``.
    """

    def __init__(self, merges=(), pattern=PATTERN):
        if not isinstance(pattern, str):
            raise TypeError(f"pattern: expected a regular expression as str, got {type(pattern).__name__}")
        self.pattern = pattern
        self.tokens = list(BYTES)                  # id -> bytes
        ids = {t: i for i, t in enumerate(self.tokens)}
        self.merges, self.ranks = [], {}           # ranks[(a, b)] = (rank, new id)
        for rank, pair in enumerate(merges):
            if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                    or not all(isinstance(i, (int, np.integer)) and 0 <= i < len(self.tokens)
                               for i in pair)):
                raise ValueError(f"merges: expected merge {rank} to be a pair of ids in "
                                 f"[0, {len(self.tokens)}), got {pair!r}")
            a, b = int(pair[0]), int(pair[1])
            new = self.tokens[a] + self.tokens[b]
            new_id = ids.setdefault(new, len(self.tokens))
            if new_id == len(self.tokens):
                self.tokens.append(new)
            self.merges.append((a, b))
            self.ranks.setdefault((a, b), (rank, new_id))

    @classmethod
    def train(cls, text, vocab_size, pattern=PATTERN):
        """Learn merges from ``text`` (str or bytes) until ``vocab_size`` tokens (≥ 256) exist."""
        vocab_size = check_vocab_size(vocab_size)
        counts = chunk_counts(text, pattern)
        merges, _ = train_merges(list(counts), list(counts.values()), vocab_size)
        return cls(merges, pattern)

    @property
    def vocab_size(self):
        """The number of distinct tokens: 256 bytes + one per merge that made a new byte string."""
        return len(self.tokens)

    def encode(self, text):
        """``text`` (str or bytes) -> ``(N,)`` int64 token ids."""
        cache, out = {}, []
        for chunk in pretokenize(text, self.pattern):
            if chunk not in cache:
                cache[chunk] = encode_chunk(chunk, self.ranks)
            out.extend(cache[chunk])
        return np.array(out, dtype=np.int64)

    def _check_ids(self, ids):
        arr = np.asarray(ids)
        if arr.dtype == object or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(f"ids: expected integer token ids, got an array of {arr.dtype}")
        arr = arr.ravel()
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            raise ValueError(f"ids: expected token ids in [0, {self.vocab_size}) (the vocabulary), "
                             f"got min {arr.min()} and max {arr.max()}")
        return arr

    def decode_bytes(self, ids):
        """Token ids -> the concatenation of their bytes."""
        return b"".join(self.tokens[i] for i in self._check_ids(ids).tolist())

    def decode(self, ids):
        """Token ids -> str; bytes that are not UTF-8 (a cut character) show as U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def bytes_per_token(self, text):
        """Bytes of ``text``'s UTF-8 per token of its encoding: the compression ratio."""
        n_bytes = sum(map(len, pretokenize(text, self.pattern)))
        return n_bytes / max(1, len(self.encode(text)))

    def save(self, path):
        """Write the tokenizer as JSON, atomically."""
        write_json(path, {"format": FORMAT, "version": VERSION, "pattern": self.pattern,
                          "vocab_size": self.vocab_size, "merges": [list(p) for p in self.merges]})

    def fingerprint(self):
        """SHA-256 (hex) of the pattern and the merges: equal fingerprints, the same tokenizer. A
        checkpoint records its tokenizer's, so that another tokenizer is refused."""
        text = json.dumps({"pattern": self.pattern, "merges": [list(p) for p in self.merges]})
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def load(cls, path):
        """Read a file that ``save`` wrote; anything else (another kind of file, bytes that are
        not UTF-8 JSON, missing or mistyped entries, a pattern that is not a regular expression,
        nesting too deep to read) is a ValueError naming the file and what is wrong."""
        where = f"path: expected a tokenizer's JSON in {path!r}, got"
        with open(path, "rb") as f:
            raw = f.read()
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{where} bytes that are not UTF-8 text (at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} invalid JSON ({e})") from None
        except RecursionError:
            raise ValueError(f"{where} JSON nested too deeply to be a tokenizer") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"path: expected a {FORMAT!r} file in {path!r}, got "
                             f"{data.get('format') if isinstance(data, dict) else type(data).__name__!r}")
        if data.get("version") != VERSION:
            raise ValueError(f"path: expected version {VERSION} of {FORMAT} in {path!r}, "
                             f"got {data.get('version')!r}")
        merges, pattern = data.get("merges"), data.get("pattern")
        if not isinstance(merges, list) or not all(isinstance(p, list) for p in merges):
            raise ValueError(f"path: expected 'merges' in {path!r} to be a list of pairs of ids, "
                             f"got {type(merges).__name__}")
        if not isinstance(pattern, str):
            raise ValueError(f"path: expected 'pattern' in {path!r} to be a regular expression "
                             f"(a string), got {type(pattern).__name__}")
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as e:
            raise ValueError(f"path: expected 'pattern' in {path!r} to be a regular expression, "
                             f"got {pattern[:40]!r} ({e})") from None
        if any(isinstance(i, bool) for p in merges for i in p):
            raise ValueError(f"path: expected 'merges' in {path!r} to hold ids, got a boolean")
        tok = cls([tuple(p) for p in merges], pattern)
        if data.get("vocab_size", tok.vocab_size) != tok.vocab_size:
            raise ValueError(f"path: {path!r} says vocab_size {data['vocab_size']}, its merges "
                             f"make {tok.vocab_size}")
        return tok

    def __repr__(self):
        return f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)})"
