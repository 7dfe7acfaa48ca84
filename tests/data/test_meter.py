"""The iambic-pentameter judge (tformer.data.meter): known lines, its licences, the plays' spellings,
bad input, and the judge on real text: Richard II's verse scans far more often than the same lines
with their words shuffled."""
import math
import random

import pytest

from tformer.data import meter as M
from tformer.data.shakespeare import shakespeare_documents


@pytest.mark.parametrize("line,pattern", [
    ("But soft, what light through yonder window breaks?", "x/x/x/x/x/"),
    ("Shall I compare thee to a summer's day?", "x/x/x/x/x/"),
    ("To be, or not to be, that is the question:", "x/x/x/x/x/x"),      # feminine ending
    ("Whether 'tis nobler in the mind to suffer", "/xx/x/x/x/x"),       # inverted first foot, too
    ("The slings and arrows of outrageous fortune,", "x/x/x/x/x/x"),
    ("What, has this thing appear'd again to-night?", "x/x/x/x/x/"),   # -'d, a hyphenated word
    ("Walks o'er the dew of yon high eastward hill:", "x/x/x/x/x/"),     # o'er: one syllable
    ("The undiscover'd country from whose bourn", "x/x/x/x/x/"),
    ("Looking upon the fortune of the king", "/xx/x/x/x/"),           # inverted first foot
    ("Nay, answer me: stand, and unfold yourself.", "x/x/x/x/x/"),    # Hamlet, its second line
])
def test_known_lines_scan(line, pattern):
    assert M.scans(line) and M.scansion(line) == pattern
    assert M.syllables(line) == len(pattern)


@pytest.mark.parametrize("line", [
    "Yonder window breaks but soft what light through",       # "window" 10 would start weak
    "Shall I compare thee to a summer's day in June?",        # 12 syllables
    "But soft, what light through yonder window?",            # 9
    "To be, or not to be, that is the question, friend",      # 12
    "Nay, answer me: stand, and unfold.",                     # 8
    "Bernardo? Nay, a window of his yonder light",            # "Bernardo": not in the dictionary
    "", "   ", "HAMLET:", "FIRST CITIZEN:", "[Aside] and let us once again assail your ears",
    "_Exit_", "Exeunt all but Hamlet and his friends tonight", "Enter KING and QUEEN with all the court",
])
def test_lines_that_do_not_scan(line):
    assert not M.scans(line) and M.scansion(line) is None


def test_the_rule_for_polysyllables_and_monosyllables():
    # "yonder" and "window" = 10: the 1 must fall on a strong (even) position, the 0 on a weak one
    assert M.scansion("And window through the yonder breaks the light") == "x/x/x/x/x/"
    assert not M.scans("But soft yonder what light through window breaks")   # "yonder" on 3-4
    # ten monosyllables scan in any order: each may be weak or strong
    line = "Long live the king and all his men and you"
    rng = random.Random(0)
    for _ in range(20):
        shuffled = line.split()
        rng.shuffle(shuffled)
        assert M.scans(" ".join(shuffled))


def test_the_licences_one_at_a_time():
    assert M.scansion("Looking upon the fortune of the king") == "/xx/x/x/x/"   # /x on 1-2
    assert not M.scans("And looking upon the fortune of the king")     # "upon" 01 on 4-5: no
    assert not M.scans("The fortune looking upon of the king")         # a trochee on 3-4: no
    assert M.scansion("And let us once again assail your ears") == "x/x/x/x/x/"
    assert M.scansion("And let us once again assail your father") == "x/x/x/x/x/x"  # 11th weak
    assert not M.scans("And let us once again assail your guitar")     # gui-TAR: 1 on 11
    assert not M.scans("And let us once again assail your honour's bed")   # 12: no licence


def test_stress_patterns_of_words():
    assert M.stress_patterns("hello") == ("01",)
    assert M.stress_patterns("Hello,") == M.stress_patterns("HELLO!") == ("01",)
    assert M.stress_patterns("fire") == ("10", "1")                    # every pronunciation
    assert M.stress_patterns("xyzzyq") == () and M.stress_patterns("--") == ()


@pytest.mark.parametrize("word,patterns", [
    ("'tis", ("1",)), ("th'", ("",)), ("o'er", ("1",)), ("e'en", ("1",)), ("ne'er", ("1",)),
    ("'gainst", ("1",)), ("sing'd", ("1",)), ("lov'd", ("1",)), ("appear'd", ("01",)),
    ("remember'd", ("010",)), ("know'st", ("1",)), ("wouldst", ("1",)), ("speaketh", ("10",)),
    ("heav'nly", ("10",)), ("'twere", ("1",)), ("honour", ("10",)), ("offence", ("01",)),
    ("methinks", ("01",)), ("summer's", ("10",)), ("lords'", ("1",)), ("'man", ("1",)),
    ("ever-preserved", ("1001",)), ("o'erhanging", ("210",)), ("sea-maid", ("22",)),
])
def test_the_plays_spellings(word, patterns):
    assert M.stress_patterns(word) == patterns


def test_words_and_syllables():
    assert M.words("But soft! what light--through 'yonder' window?") == \
        ["but", "soft", "what", "light", "through", "'yonder'", "window"]
    assert M.words("O'er the to-night's sea-maid") == ["o'er", "the", "to-night's", "sea-maid"]
    assert M.syllables("To be, or not to be, that is the question") == 11
    assert M.syllables("th' expedition") == 4                          # th' is elided
    assert M.syllables("Bernardo Cassio") is None and M.syllables("") == 0


def test_the_plays_elisions_make_their_lines_scan():
    assert M.scans("For this relief much thanks: 'tis bitter cold,")
    assert not M.scans("For this relief much thanks: it is bitter cold,")
    assert M.scans("Walks o'er the dew of yon high eastward hill:")
    assert not M.scans("Walks over the dew of yon high eastward hill:")


def test_bad_input_names_the_argument():
    for call, name in ((M.scans, "line"), (M.scansion, "line"), (M.syllables, "line"),
                       (M.words, "line"), (M.stress_patterns, "word")):
        with pytest.raises(TypeError, match=f"{name}: expected str, got int"):
            call(3)
    with pytest.raises(TypeError, match="line: expected str, got bytes"):
        M.scans(b"But soft")
    with pytest.raises(ValueError, match="word: expected a single word, got 'two words'"):
        M.stress_patterns("two words")
    with pytest.raises(ValueError, match="line: expected a single line"):
        M.scans("But soft, what light\nthrough yonder window breaks?")


def _verse(play):
    """Lines inside a speech that start with a capital and have 8 to 12 syllables."""
    [(_, raw)] = shakespeare_documents((("histories", play),))
    return [line for speech in raw.decode("ascii").split("\n\n")
            for line in speech.strip("\n").split("\n")[1:]
            if line[:1].isupper() and 8 <= (M.syllables(line) or 0) <= 12]


def test_verse_scans_far_more_often_than_its_words_shuffled():
    verse = _verse("richard-ii")                       # a play written in verse throughout
    rng = random.Random(0)
    shuffled = [" ".join(rng.sample(line.split(), len(line.split()))) for line in verse]
    n = len(verse)
    p, q = sum(map(M.scans, verse)) / n, sum(map(M.scans, shuffled)) / n
    # the same words and syllables, only their order differs: the difference is many standard
    # errors of a difference of two shares wide, not a chance of which lines were drawn
    standard_error = math.sqrt(p * (1 - p) / n + q * (1 - q) / n)
    assert n > 2000 and p - q > 5 * standard_error, (n, p, q, standard_error)
    # a line of monosyllables only is judged by its count, shuffled or not
    mono = [i for i, line in enumerate(verse) if all(max(map(len, M.stress_patterns(w))) <= 1
                                                     for w in M.words(line))]
    assert [M.scans(verse[i]) for i in mono] == [M.scans(shuffled[i]) for i in mono]
