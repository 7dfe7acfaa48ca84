"""Which words a sample writes: the share of them that are words of the corpus.

    words(text)  = the runs of letters [A-Za-z]+ of every line that is not a speaker's name, lower-cased
    share(s, W)  = |{w ∈ words(s) : w ∈ W}| / |words(s)|          (counted with repetition)

A play's text names its speaker on a line of its own, in capitals and ending in a colon
("FIRST CITIZEN:"); a model copies those names well, and they would flatter the share, so they
are left out. An apostrophe or a hyphen ends a run ("'tis" gives "tis", "o'er" gives "o" and
"er"), the same cut in the corpus and in the sample, so a word is judged by its letters alone.
``W`` is ``corpus_words`` of the text a model trained on or of all 38 plays: a word is "real" if
it occurs anywhere there.
"""
import re

_LETTERS = re.compile(rb"[A-Za-z]+")
_SPEAKER = re.compile(rb"^[A-Z][A-Z0-9 ,.'&-]*:$")


def _lines(text):
    if isinstance(text, str):
        text = text.encode("utf-8", errors="replace")
    if not isinstance(text, (bytes, bytearray)):
        raise TypeError(f"text: expected str or bytes, got {type(text).__name__}")
    return bytes(text).split(b"\n")


def is_speaker(line):
    """True for a speaker's line: capitals (and spaces, digits, ``,.'&-``) ending in a colon."""
    return bool(_SPEAKER.match(line.strip()))


def words(text):
    """The lower-cased letter runs of ``text`` (str or bytes), speaker lines left out, in order."""
    return [w.decode("ascii").lower() for line in _lines(text) if not is_speaker(line)
            for w in _LETTERS.findall(line)]


def corpus_words(texts):
    """The set of ``words`` of every text in ``texts`` (str or bytes each)."""
    vocab = set()
    for t in texts:
        vocab.update(words(t))
    return vocab


def share(text, vocab):
    """``(known, total)``: how many of the ``words`` of ``text`` are in ``vocab``, of how many."""
    ws = words(text)
    return sum(w in vocab for w in ws), len(ws)
