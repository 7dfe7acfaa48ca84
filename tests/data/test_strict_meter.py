"""The strict judge of iambic pentameter (tformer.data.strict_meter) and meter.scansions, which it
reads: good lines pass, each rule refuses its planted case, the judge never accepts what
meter.scans refuses, bad input, and the calibration on the plays' held-out verse and on hacks."""
import collections
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer.data import meter as M
from tformer.data import strict_meter as S
from tformer.data.all_plays import all_plays_documents
from tformer.data.text import split_sizes
from tformer.data.words import words as letter_runs

GOOD = [
    "Shall I compare thee to a summer's day?",
    "But soft, what light through yonder window breaks?",
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer",
    "The slings and arrows of outrageous fortune,",
    "Nay, answer me: stand, and unfold yourself.",
    "Walks o'er the dew of yon high eastward hill:",
    "For this relief much thanks: 'tis bitter cold,",
]

# Strings that meter.scans accepts and English does not: the Preference chapter's DPO lines
# (book/data/preference.json) with letters and fragments or function words on the beats, and
# hand-written salads of the same kind.
HACKS = [
    "'d great be to t it that they have rich me",
    "What is the we of him this to the world shame?",
    "'Tis he, and that thus he to thee still so",
    " it should not come to say so; the 't she is",
    " to give you speak it to the d so, and am",
    "But speak not for you it that you m not,",
    "'s utmost of a of you, and I am thine.",
    "If that the O, so doth not I fear 'em!",
    "'s goss and a man is a good man a king.",
    "' and ho, or have I. you may, my good lord,",
    "'Who, to the king that I have with son you",
    "t t t t t t t t t t",
    "the the the the the the the the the the",
    "a of the to and in is it you that",
    "to be or not to be that is the of",
    "and I and you and he and she and we",
    "of the of the of the of the of the",
    "'d 'd 'd 'd 'd 'd 'd 'd 'd 'd",
    "b c d e f g h j k l",
    "it is it is it is it is it is",
    "I have the to be in that it is a man",
    "'t is the that and it to me and the king",
]


@pytest.mark.parametrize("line", GOOD)
def test_good_lines_scan_strictly(line):
    assert M.scans(line) and S.scans_strict(line) and S.strict_verdict(line) is None


def test_sonnet_18_has_one_light_word_and_one_pronoun_on_its_beats():
    # Shall I com-PARE thee TO a SUM-mer's DAY: "I" (a pronoun) on 2, "to" (light) on 6
    assert S.strong_function_words("Shall I compare thee to a summer's day?") == (1, 2)
    assert S.strong_function_words("But soft, what light through yonder window breaks?") == (0, 0)
    # "To BE, or NOT to BE, that IS the QUES-tion": were "be" light, every scansion would have
    # two or three light beats ("be" on 2 and 6, "is" on 8; or "to" on 1, "be" on 6, "is" on 8)
    hamlet = "To be, or not to be, that is the question:"
    assert S.strong_function_words(hamlet) == (1, 1)
    assert all(sum(w in S.LIGHT | {"be"} and b - a == 1 and marks[a] == "/"
                   for w, (a, b) in zip(M.words(hamlet), spans)) >= 2
               for marks, spans in M.scansions(hamlet))
    assert S.strong_function_words("Bernardo? Nay, a window of his yonder light") is None


def test_each_rule_refuses_its_planted_case():
    verdict = S.strict_verdict
    assert verdict("Yonder window breaks but soft what light through") == "meter"
    # letters: a letter, a fragment of a contraction, a bare ending
    assert verdict("But soft, what light through yonder window t") == "letters"
    assert verdict("'d soft, what light through yonder window breaks?") == "letters"
    assert verdict("But soft, what light through yonder window 'st") == "letters"
    assert [S.is_fragment(w) for w in ("t", "'d", "'s", "m", "ll", "'st", "a", "i", "o", "'em",
                                       "th'", "i'", "'tis", "to")] == [True] * 6 + [False] * 8
    # words the dictionary knows and the plays do not
    assert verdict("But soft, what light through yonder laptop breaks?") == "not the plays' words"
    assert verdict("But soft, what light through yonder window beeps?") == "not the plays' words"
    # the same ten monosyllables one place later put four function words on the beats
    assert verdict("Long live the king and all his men and you") is None
    assert verdict("And long live the king and all his men and you") == "strong function word"
    assert S.strong_function_words("And long live the king and all his men and you") == (3, 4)
    assert verdict("What is the we of him this to the world shame?") == "strong function word"
    assert set(S.REASONS) == {"meter", "letters", "not the plays' words", "strong function word"}


def test_a_given_vocabulary_replaces_the_plays():
    line = "But soft, what light through yonder window breaks?"
    assert S.scans_strict(line, vocabulary=set(M.words(line)))
    assert S.strict_verdict(line, vocabulary=set(M.words(line)) - {"yonder"}) == \
        "not the plays' words"
    assert S.scans_strict("Walks o'er the dew of yon high eastward hill:",
                          vocabulary={"walks", "o'er", "the", "dew", "of", "yon", "high",
                                      "eastward", "hill"})
    assert S.scans_strict("The sea-maid's music", vocabulary={"the", "sea", "maid's"}) is False
    assert S._known("sea-maid's", {"sea", "maid's"}) and not S._known("sea-maid's", {"sea"})
    assert {"yonder", "call'd", "o'er", "th", "tis", "to-night"} <= S.plays_vocabulary()
    assert "laptop" not in S.plays_vocabulary() and "ing" not in S.plays_vocabulary()


def test_function_words():
    assert S.function_kind("the") == S.function_kind("'The") == S.function_kind("'tis") == "light"
    assert S.function_kind("thee") == S.function_kind("'em") == "pronoun"
    assert S.function_kind("be") is None and S.function_kind("window") is None
    assert S.LIGHT.isdisjoint(S.PRONOUNS)
    assert all(len(w.strip("'")) <= 6 and " " not in w for w in S.LIGHT | S.PRONOUNS)


WORDS = ["the", "a", "to", "of", "and", "I", "thee", "love", "king", "light", "soft", "window",
         "yonder", "summer's", "compare", "t", "'d", "laptop", "upon", "o'er", "'tis", "Bernardo"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12))
def test_the_strict_judge_never_accepts_what_scans_refuses(words):
    line = " ".join(words)
    verdict = S.strict_verdict(line)
    assert (verdict == "meter") == (not M.scans(line))
    assert not S.scans_strict(line) or M.scans(line)
    assert (verdict is None) == S.scans_strict(line)


def test_bad_input_names_the_argument():
    for call in (S.scans_strict, S.strict_verdict, S.strong_function_words, M.scansions):
        with pytest.raises(TypeError, match="line: expected str, got int"):
            call(3)
    with pytest.raises(TypeError, match="line: expected str, got bytes"):
        S.scans_strict(b"But soft")
    with pytest.raises(ValueError, match="line: expected a single line"):
        S.scans_strict("But soft, what light\nthrough yonder window breaks?")
    for bad in (3, "the words", b"words"):
        with pytest.raises(TypeError, match="vocabulary: expected a set of lower-case words"):
            S.scans_strict("But soft", vocabulary=bad)
    for call in (S.is_fragment, S.function_kind):
        with pytest.raises(TypeError, match="word: expected str, got NoneType"):
            call(None)


def _lines(texts):
    return [line for text in texts for line in text.decode("ascii").split("\n")
            if line.strip() and not M._SPEAKER.fullmatch(line.strip())]


@pytest.fixture(scope="module")
def plays():
    """(training texts, validation lines) of the 38 plays, cut as TextData cuts them."""
    documents = all_plays_documents()
    cuts = [split_sizes(len(raw), 0.1)[0] - 1 for _, raw in documents]
    return ([raw[:c] for (_, raw), c in zip(documents, cuts)],
            _lines(raw[c:] for (_, raw), c in zip(documents, cuts)))


def test_scansions_are_the_ways_that_scans_finds(plays):
    _, lines = plays
    for line in lines[:3000]:
        ways = M.scansions(line)
        assert bool(ways) == M.scans(line)
        if ways:
            assert ways[0][0] == M.scansion(line)
            for marks, spans in ways:
                assert len(marks) in (10, 11) and len(spans) == len(M.words(line))
                assert spans[0][0] == 0 and spans[-1][1] == len(marks)
                assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert M.scansions("Looking upon the fortune of the king") == \
        (("/xx/x/x/x/", ((0, 2), (2, 4), (4, 5), (5, 7), (7, 8), (8, 9), (9, 10))),)
    assert M.scansions("HAMLET:") == M.scansions("") == M.scansions("Bernardo is here") == ()


def test_calibration_on_the_plays_held_out_verse_and_on_hacks(plays):
    train, val_lines = plays
    scanning = [line for line in val_lines if M.scans(line)]
    sample = random.Random(0).sample(scanning, 2000)
    verdicts = collections.Counter(S.strict_verdict(line) for line in sample)
    kept = verdicts[None] / len(sample)
    print(f"{len(scanning)} held-out lines scan; of 2,000 the strict judge keeps {kept:.1%}: "
          f"{dict(verdicts)}")
    assert len(scanning) == 4844 and verdicts["meter"] == 0
    assert verdicts[None] == 1653, verdicts                      # 82.7 %, the docstring's
    # each rule alone, as the docstring says
    letters = sum(not any(map(S.is_fragment, M.words(line))) for line in sample)
    known = [sum(not S._known_in_plays(w) for w in M.words(line)) for line in sample]
    function = [S.strong_function_words(line) for line in sample]
    assert (letters, known.count(0), sum(k <= 1 for k in known)) == (1998, 1912, 1992)
    assert sum(a <= S.MAX_LIGHT and b <= S.MAX_FUNCTION for a, b in function) == 1736
    # the literal rule, no function word on a beat: a quarter kept (under half without the
    # pronouns), and Sonnet 18 refused ("to" is a beat)
    def literal(line, kinds):
        return min(sum(S.function_kind(w) in kinds and b - a == 1 and marks[a] == "/"
                       for w, (a, b) in zip(M.words(line), spans))
                   for marks, spans in M.scansions(line))
    assert sum(literal(line, {"light", "pronoun"}) == 0 for line in sample) == 495
    assert sum(literal(line, {"light"}) == 0 for line in sample) == 899
    assert literal("Shall I compare thee to a summer's day?", {"light"}) == 1
    # every hack scans and is refused
    assert all(map(M.scans, HACKS)) and not any(map(S.scans_strict, HACKS)) and len(HACKS) == 22
    # salads of one-syllable words drawn by the plays' frequencies: all scan; most are refused,
    # not all (the judge has no grammar)
    frequency = collections.Counter(w for text in train for w in letter_runs(text))
    pool = sorted((w, n) for w, n in frequency.items()
                  if any(len(p) == 1 for p in M.stress_patterns(w)) and not S.is_fragment(w))
    words, counts = zip(*pool)
    rng = random.Random(0)
    salads = [" ".join(rng.choices(words, weights=counts, k=10)) for _ in range(500)]
    salad_kept = sum(map(S.scans_strict, salads)) / len(salads)
    print(f"salads: scans keeps {sum(map(M.scans, salads))} of 500, strict {salad_kept:.1%}")
    assert all(map(M.scans, salads)) and sum(map(S.scans_strict, salads)) == 179   # 35.8 %
    assert salad_kept < kept / 2
