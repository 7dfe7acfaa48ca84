"""``tformer.data.bpe`` against an independent implementation: HF ``tokenizers``' BPE trainer (Rust).

Both are set up alike as far as ``tokenizers`` allows, and trained locally on the same text
(nothing is downloaded):

- the same pre-tokenisation: ``tokenizers``' ``Split`` pre-tokenizer with ``tformer.data.bpe.PATTERN``
  (matches kept as chunks, ``behavior="isolated"``), run by its own regular-expression engine
  (Oniguruma); ``hf_chunks`` returns its chunks so that a test can hold them equal to
  ``tformer.data.bpe.pretokenize``'s. The two engines agree on ASCII text; on other text their letter
  classes can differ (Oniguruma counts combining marks as word characters, Python does not);
- the same alphabet: ``ByteLevel`` (no prefix space, no regex of its own) turns each byte of a
  chunk into a printable stand-in character (``byte_level_alphabet``), and all 256 of them are the
  trainer's ``initial_alphabet``; no special token, no minimum frequency.

``tokenizers`` breaks a tie between pairs of equal count by the smaller pair of *its* ids, and it
numbers the 256 bytes in the code-point order of their stand-ins (``hf_byte_order``): the printable
bytes ``!``..``~`` first, the space and the control bytes last. ``tformer.data.bpe`` numbers them by
byte value. So the merges agree until the first tie that the two orders break differently;
``tformer_merges(order=hf_byte_order())`` trains ``tformer.data.bpe`` with ``tokenizers``' numbering,
and then every merge agrees.
"""
import json

from tformer.data.bpe import PATTERN, BPETokenizer, check_vocab_size, chunk_counts, encode_chunk, train_merges

REQUIREMENT = "tokenizers==0.23.3"


def byte_level_alphabet():
    """``[str] * 256``: the printable stand-in of each byte value. The bytes that print as
    themselves (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) keep their character; the others (space,
    control bytes, DEL, NBSP, soft hyphen) take U+0100, U+0101, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def hf_byte_order():
    """The byte values in the order of ``tokenizers``' ids: by code point of their stand-ins."""
    chars = byte_level_alphabet()
    return sorted(range(256), key=lambda b: ord(chars[b]))


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError(f"the reference BPE trainer needs {REQUIREMENT}: pip install "
                          f"{REQUIREMENT}") from None
    return tokenizers


def _hf_tokenizer(pattern):
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(pattern), behavior="isolated"),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def _to_bytes(stand_ins, back):
    return bytes(back[c] for c in stand_ins)


def hf_chunks(text, pattern=PATTERN):
    """``tokenizers``' pre-tokenisation of ``text`` (str): its chunks as bytes."""
    back = {c: b for b, c in enumerate(byte_level_alphabet())}
    pieces = _hf_tokenizer(pattern).pre_tokenizer.pre_tokenize_str(text)
    return [_to_bytes(piece, back) for piece, _ in pieces]


def hf_merges(text, vocab_size, pattern=PATTERN):
    """The merges of ``tokenizers``' BPE trainer on ``text`` (str), as ``[(bytes, bytes)]``."""
    tk = _tokenizers()
    tok = _hf_tokenizer(pattern)
    trainer = tk.trainers.BpeTrainer(
        vocab_size=check_vocab_size(vocab_size), min_frequency=0, show_progress=False,
        special_tokens=[], initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    back = {c: b for b, c in enumerate(byte_level_alphabet())}
    pairs = [m.split(" ") if isinstance(m, str) else m for m in merges]
    return [(_to_bytes(a, back), _to_bytes(b, back)) for a, b in pairs]


def tformer_merges(text, vocab_size, order=None, pattern=PATTERN):
    """``tformer.data.bpe``'s merges on ``text`` as ``[(bytes, bytes)]``; ``order``: the byte values in
    the order of the first 256 ids (default: by value; ``hf_byte_order()``: as ``tokenizers``)."""
    order = list(range(256)) if order is None else list(order)
    position = {b: i for i, b in enumerate(order)}
    counts = chunk_counts(text, pattern)
    words = [[position[b] for b in chunk] for chunk in counts]
    merges, tokens = train_merges(words, list(counts.values()), check_vocab_size(vocab_size),
                                  alphabet=[bytes([b]) for b in order])
    return [(tokens[a], tokens[b]) for a, b in merges]


def first_difference(a, b):
    """The index of the first merge at which two lists differ (the shorter's length if one is a
    prefix of the other), or None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def pair_count(text, merges, pair, pattern=PATTERN):
    """How often ``pair`` (two byte strings) occurs as adjacent tokens in ``text`` once the
    ``merges`` (pairs of byte strings, in order) have been made: the count a trainer compares
    at that point."""
    ids, id_merges = {bytes([b]): b for b in range(256)}, []
    for left, right in merges:
        id_merges.append((ids[left], ids[right]))
        ids.setdefault(left + right, len(ids))
    tok = BPETokenizer(id_merges, pattern)
    total = 0
    for chunk, n in chunk_counts(text, pattern).items():
        word = [tok.tokens[i] for i in encode_chunk(chunk, tok.ranks)]
        total += n * sum(1 for p in zip(word, word[1:]) if p == tuple(pair))
    return total
