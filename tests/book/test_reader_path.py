"""The reader's path: the book calls its systems by what they are and links its
cross-references.

- No "seed 000" ... "seed 004" anywhere a reader looks: the chapters (prose, code and outputs),
  the book's pages, the package's docstrings, comments and messages. The source documents are not
  part of the book; the introduction's table says where each system comes from.
- No typed chapter number ("chapter 12", "ch. 5"): chapters are renumbered when one is added, and
  a typed number then points to the wrong page. A notebook or page links with ``{doc}``; a
  docstring names the chapter's title.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED = re.compile(r"(?i)\bseeds?[ -]?0{2}[0-4]\b")
TYPED = re.compile(r"(?i)(?<!-)\b(?:chapters?|ch\.) ?\d+\b")              # not the flag --chapters 01


def _texts(path):
    """``[(where, text)]`` of a notebook (each cell's source and outputs) or a text file."""
    if path.suffix != ".ipynb":
        return [(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))]
    out = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        parts = ["".join(cell["source"])]
        for o in cell.get("outputs", []):
            parts.append("".join(o.get("text", "")))
            parts.append("".join(o.get("data", {}).get("text/plain", "")))
        out.append((f"{path.name} cell {i}", "\n".join(parts)))
    return out


FILES = (sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md"))
         + sorted((ROOT / "tformer").rglob("*.py")) + [ROOT / "README.md"]
         + sorted((ROOT / "tools").glob("*.py")))


def _hits(pattern):
    return [f"{where}: ...{text[max(0, m.start() - 40):m.end() + 20]!r}..."
            for path in FILES for where, text in _texts(path) for m in pattern.finditer(text)]


def test_no_source_numbers_anywhere_a_reader_looks():
    hits = _hits(SEED)
    assert not hits, f"{len(hits)} mentions of a source by its number:\n" + "\n".join(hits[:40])


def test_no_typed_chapter_numbers():
    hits = _hits(TYPED)
    assert not hits, f"{len(hits)} typed chapter numbers:\n" + "\n".join(hits[:40])


@pytest.mark.parametrize("text,found", [("see chapter 12", True), ("Chapter 3 derives", True),
                                        ("(ch. 5)", True), ("seed 004's head", True),
                                        ("seeds 000/001", True), ("the chapter on softmax", False),
                                        ("seed=0", False), ("a seed of 1337", False)])
def test_the_patterns(text, found):
    assert bool(SEED.search(text) or TYPED.search(text)) == found


def test_a_notebooks_links_carry_their_titles():
    """JupyterLab's MyST renderer shows ``{doc}`05_attention``` as the bare path: in a notebook a
    link names its target, ``{doc}`Scaled dot-product attention <05_attention>```."""
    bare = re.compile(r"\{doc\}`[^`<]*`")
    hits = [f"{path.name} cell {i}: {m.group()}"
            for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
            for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"])
            if cell["cell_type"] == "markdown"
            for m in bare.finditer("".join(cell["source"]))]
    assert not hits, "links without a title:\n" + "\n".join(hits)
