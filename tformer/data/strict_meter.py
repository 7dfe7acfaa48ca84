"""A stricter judge of iambic pentameter, harder to game than ``tformer.data.meter.scans``.

    scans_strict(line)  <=>  scans(line)                                          ("meter")
                             and no word of line is a letter or a fragment         ("letters")
                             and every word of line is a word of the plays  ("not the plays' words")
                             and some scansion s of line has, on its five strong positions,
                                 #light(s) <= 1  and  #light(s) + #pronouns(s) <= 2
                                                                           ("strong function word")

A *scansion* is one way the line fits ``meter``'s templates (``meter.scansions``: a pronunciation
per word, a template, so a position for each syllable); ``#light(s)`` counts the words of one
syllable on strong positions that are *light* function words, ``#pronouns(s)`` those that are
personal pronouns. The words are ``meter.words(line)``; a word in quotes ("'The") is judged
without them.

Why each rule. The Preference chapter's DPO learned what ``scans`` accepts and English does not:

- **letters**: the dictionary lists every letter ("t" is a syllable to it) and ``meter.words``
  keeps the pieces of a contraction cut off at a line's start (``'d``, ``'s``). Refused: a word
  that is one letter other than *a*, *I*, *O* (``t``, ``'d``, ``m``), and the bare endings
  ``ll st ve re ld lt rt`` (``'ll``, ``'st``). The plays' own short words stay: ``th'``, ``i'``,
  ``o'``, ``'em``, ``'tis``.
- **not the plays' words**: the dictionary holds names and modern words the plays never use.
  Every word must be a word of the 38 plays' *training* text (``all_plays``: the first nine
  tenths of each play), split as this judge splits a line (``meter.words``, quotes stripped, so
  ``call'd`` and ``to-night`` are words; a hyphenated word is also known when each part is);
  the set is built once (about a second) and cached. All words, not a share: allowing one unknown
  word would keep 99.6 % of real lines instead of 95.6 % (below) but lets one junk word into
  every line.
- **strong function word**: ``meter`` lets a word of one syllable stand anywhere, so ten of them
  in any order scan ("What is the we of him this to the world shame?"). Here a beat may fall on
  a function word only as verse allows it, once or twice a line: at most one *light* word
  (``LIGHT``: articles, one-syllable prepositions and conjunctions, auxiliaries and their old
  forms, ``'tis``), and at most two function words in all counting the personal pronouns
  (``PRONOUNS``), which verse stresses often ("Shall **I** com-**pare** thee **to** a
  **sum**-mer's **day**?" has one of each). Strong positions are the even ones of the regular
  line, 1, 4, 6, 8, 10 of the inverted first foot; the feminine 11th is weak.

Calibration (tests/data/test_strict_meter.py asserts these counts). Of the 38 plays' *validation*
text (the last tenth of each play, not in the vocabulary), 4,844 lines scan; of 2,000 of them
drawn with ``random.Random(0)`` the strict judge keeps 1,653 (82.7 %). Each rule alone keeps:
letters 1,998 (two real lines say "behold 's" and "St. George"), the plays' words 1,912
(95.6 %; 1,992 with one unknown word allowed), function words 1,736 (86.8 %). The literal rule
"no function word on a beat" would keep 495 (24.8 %), or 899 (45.0 %) not counting pronouns,
and refuse Sonnet 18's first line ("to" is a beat); counting *be* and *been* as light would
refuse "To be, or not to be, that is the question" (both "be" are beats), so they are not in
``LIGHT`` (the finite forms *is*, *are*, *was* are). Of 22 hacks that ``scans`` accepts (the
chapter's DPO lines with letters or function words on the beats, and salads of the same kind)
the strict judge refuses all 22. It has no grammar: of 500 ten-word salads of one-syllable words
drawn by the plays' word frequencies (``random.Random(0)``), all of which ``scans`` accepts, it
still keeps 179 (35.8 %), and a salad of content words (nouns, verbs, adjectives) in the plays
passes every rule.

Speed: about 15,000 lines a second that ``scans`` accepts (35,000 of the plays' lines, most of
which it refuses at once), each word's answers cached; the vocabulary costs about a second once.
"""
import collections.abc
import functools

from tformer.data import meter

# Function words of one syllable (a word of two, "upon", is held by its stress anyway).
LIGHT = frozenset("""
    a an the
    at by for from in of on to with o'er i' o' till
    and but or nor if that as than though
    am is are was were have has had hath do does did doth dost didst
    shall shalt will wilt would should may might must can canst could 'tis 'twas 'twere
""".split())
PRONOUNS = frozenset("""
    i me my mine we us our you your ye thou thee thy thine he him his she her it its they them
    their 'em
""".split())
LETTERS = frozenset("aio")                                   # the one-letter words
FRAGMENTS = frozenset("ll st ve re ld lt rt".split())        # endings cut from their word
MAX_LIGHT, MAX_FUNCTION = 1, 2                               # on strong positions, per line
REASONS = ("meter", "letters", "not the plays' words", "strong function word")


def _check_str(value, name):
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected str, got {type(value).__name__}")


def _bare(word):
    """``word`` without the quotes around it ("'The" -> "the"), unless the quote is its own
    (``'tis``, ``th'``, ``i'``, ``o'``, ``'em``)."""
    return word if word in LIGHT or word in PRONOUNS or word == "th'" else word.strip("'")


@functools.lru_cache(maxsize=None)
def is_fragment(word):
    """True for a word (as ``meter.words`` splits a line; any case) that is a letter other than
    *a*, *I*, *O*, or a bare ending of a contraction (``'d``, ``t``, ``'ll``, ``st``): the
    module's rule "letters"."""
    _check_str(word, "word")
    bare = word.lower().strip("'")
    return (len(bare) == 1 and bare not in LETTERS) or bare in FRAGMENTS


@functools.lru_cache(maxsize=None)
def function_kind(word):
    """``"light"``, ``"pronoun"`` or None: the class of a word (as ``meter.words`` splits a
    line; any case, quotes around it ignored)."""
    _check_str(word, "word")
    bare = _bare(word.lower())
    return "light" if bare in LIGHT else "pronoun" if bare in PRONOUNS else None


@functools.cache
def plays_vocabulary():
    """The words of the 38 plays' training text as ``meter.words`` splits its lines (speakers'
    names left out), quotes stripped: a frozenset, built once (about a second) and cached."""
    from tformer.data.all_plays import all_plays_documents
    from tformer.data.text import split_sizes
    from tformer.data.words import is_speaker
    found = set()
    for _, raw in all_plays_documents():
        train = raw[: split_sizes(len(raw), 0.1)[0] - 1]                   # TextData's cut
        for line in train.split(b"\n"):
            if not is_speaker(line):
                found.update(w.strip("'") for w in meter.words(line.decode("ascii")))
    return frozenset(found)


def _known(word, vocabulary):
    bare = word.strip("'")
    return bare in vocabulary or ("-" in bare and all(
        p.strip("'") in vocabulary for p in bare.split("-") if p.strip("'")))


@functools.lru_cache(maxsize=None)
def _known_in_plays(word):
    return _known(word, plays_vocabulary())


def _check_vocabulary(vocabulary):
    if vocabulary is not None and (isinstance(vocabulary, (str, bytes))
                                   or not isinstance(vocabulary, collections.abc.Container)):
        raise TypeError(f"vocabulary: expected a set of lower-case words or None, "
                        f"got {type(vocabulary).__name__}")


def strong_function_words(line):
    """The fewest function words on strong positions over ``meter.scansions(line)``, as
    ``(light, light + pronouns)`` of the scansion that passes the rule if one does (else the
    one with the fewest light, then fewest in all); None when the line does not scan."""
    found = meter.words(line)
    kinds = [function_kind(w) for w in found]
    best = None
    for marks, spans in meter.scansions(line):
        light = function = 0
        for kind, (start, stop) in zip(kinds, spans):
            if kind and stop - start == 1 and marks[start] == "/":
                light += kind == "light"
                function += 1
        if light <= MAX_LIGHT and function <= MAX_FUNCTION:
            return light, function
        best = min(best or (light, function), (light, function))
    return best


def strict_verdict(line, vocabulary=None):
    """None when ``line`` scans strictly, else the first rule that refuses it, one of
    ``REASONS``: "meter" (``meter.scans`` refuses it), "letters", "not the plays' words",
    "strong function word". ``vocabulary``: a set of lower-case words to use instead of
    ``plays_vocabulary()``."""
    _check_str(line, "line")
    _check_vocabulary(vocabulary)
    if not meter.scans(line):
        return "meter"
    found = meter.words(line)
    if any(is_fragment(w) for w in found):
        return "letters"
    known = _known_in_plays if vocabulary is None else (lambda w: _known(w, vocabulary))
    if not all(known(w) for w in found):
        return "not the plays' words"
    light, function = strong_function_words(line)
    if light > MAX_LIGHT or function > MAX_FUNCTION:
        return "strong function word"
    return None


def scans_strict(line, vocabulary=None):
    """True when ``line`` scans as iambic pentameter by the module's rule: ``meter.scans``, no
    letters, the plays' words only, few function words on the beats."""
    return strict_verdict(line, vocabulary) is None
