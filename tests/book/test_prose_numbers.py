"""No measured number is typed into a chapter's prose: it is produced from the data.

A chapter that reads a result file of `book/data/` states its numbers from that file (a sentence or
table built by a code cell, `display(Markdown(...))`), never typed beside it: a typed number goes
stale when the file is re-measured, and a typed comparison says more than the numbers do
(DESIGN.md, "Claims are measured"). This test reads every chapter's Markdown cells (and the literal
text of the Markdown a code cell builds) and fails on a number that equals, to its printed digits,
a measured value of a data file the chapter reads. Constants quoted from papers or set by a
configuration, which happen to equal a measured value, go on the short allow-list below, each
with its reason.

What counts as a number here is what a measurement looks like in prose: a decimal (``0.52``,
``1.25``), a percentage (``52 %``), or an integer of at least three significant digits that is not
a power of two (``1,092``, ``137,216``). Integers inside ``$...$`` are the symbols' settings
($T = 64$), not measurements. What counts as measured is every number of the file except its
configuration and provenance (`NOT_MEASURED`).
"""

import ast
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
DATA = ROOT / "book" / "data"

# Keys whose subtrees are settings or provenance, not measurements.
NOT_MEASURED = {
    "provenance", "prediction_provenance", "config", "recipe", "machine", "command", "commit",
    "commit_note", "date", "dirty", "python", "numpy", "malloc", "started", "updated",
    "generation_config", "curve_config", "speed_config", "corpus_fingerprint",
    "loadavg_start", "load_average_start", "load_average_end", "threads", "seeds", "head_width",
    "shape", "sizes", "format", "version", "merges", "pattern",
}

# (notebook, number as printed): why it is typed. Constants of papers and of the sources.
# (notebook, the numbers as printed, why they are typed): constants of papers, of the sources and of
# a scheme, and the givens and worked answers of exercises (each checked by its solution test).
_ALLOWED_GROUPS = [
    ("21_fitting_in_memory", "1.70 0.76 10.7", "exercise 3: the memory equations' prediction at T = 4096"),
    ("22_fewer_bits", "127", "int8's largest magnitude (QMAX), a constant of the scheme"),
    ("23_many_processes", "669,056", "TinyGPT's parameter count, the architecture's (exercise 1)"),
    ("30_shakespeare", "1.88", "nanoGPT's README: the loss it reports for its CPU recipe"),
    ("30_shakespeare", "2.09", "exercise 2: passes over the training text, 500·64·64 / its bytes"),
    ("31_bpe", "3.00 145", "exercises 3 and 4: worked answers (test_31_3, test_31_4)"),
    ("32_lora", "3,072 9,472", "exercise 3: trained numbers r·Σ(C_in + C_out), arithmetic on shapes"),
    ("32_lora", "0.36 0.15 0.21", "exercise 3's own run (test_solutions_writing.py::test_32_3)"),
    ("34_decoding", "3.8", "Leviathan et al.'s Theorem 3.8 (and exercise 1's given logit gap)"),
    ("34_decoding", "3.0 1.0 1.5 0.35 0.25 3.454 2.0 2.8 0.75 1.564 1.583 1.58 3.33 0.1333",
     "exercises' givens and worked answers (tests/book/test_solutions_decoding.py); τ = 1.5 a setting"),
    ("34_decoding", "95", "the confidence level of the intervals"),
    ("35_preference", "95", "the confidence level of the intervals"),
    ("37_grpo", "95", "the confidence level of the intervals"),
    ("36_muon", "2.0315", "Muon's Newton–Schulz coefficient c (Jordan 2024), a constant of the method"),
]
ALLOWED = {(nb, tok): why for nb, toks, why in _ALLOWED_GROUPS for tok in toks.split()}

NUMBER = re.compile(r"(?<![\w.,^{])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?![\w.]\d)")
PERCENT_AFTER = re.compile(r"^(?:\s*[–-]\s*[\d.,]+)?\s*%")
CODE_SPAN = re.compile(r"``?[^`]*``?")
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
LINK_TARGET = re.compile(r"\]\([^)]*\)|<[^>\s]+>|\{[a-z]+\}`[^`]*`")


def _text(value):
    return "".join(value) if isinstance(value, list) else (value or "")


def data_files(nb):
    """The result files of book/data that a notebook's code cells name (a glob pattern included)."""
    code = "\n".join(_text(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    files = set()
    for name in re.findall(r"""["'](?:[\w./]*/)?([\w*]+\.json)["']""", code):
        files.update(DATA.glob(name))
    return sorted(files)


def measured_values(path):
    """Every finite number of a result file outside its configuration and provenance."""
    out = []

    def walk(x):
        if isinstance(x, dict):
            for key, value in x.items():
                if key not in NOT_MEASURED:
                    walk(value)
        elif isinstance(x, list):
            for value in x:
                walk(value)
        elif isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
            out.append(float(x))

    walk(json.loads(path.read_text()))
    return np.array(out)


def prose(nb):
    """(cell index, text) of every Markdown cell, and the literal text of each Markdown(...) a code
    cell builds (the f-string's constant parts, where a typed number would hide)."""
    for i, cell in enumerate(nb["cells"]):
        source = _text(cell["source"])
        if cell["cell_type"] == "markdown":
            yield i, source
        elif cell["cell_type"] == "code" and "Markdown(" in source:
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Markdown"):
                    parts = [c.value for arg in node.args for c in ast.walk(arg)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                    yield i, " ".join(parts)


def numbers(text):
    """(printed token, value, decimals, as a percentage) of each number that looks measured."""
    text = CODE_SPAN.sub(" ", LINK_TARGET.sub(" ", text))
    math_spans = [m.span() for m in MATH.finditer(text)]
    for m in NUMBER.finditer(text):
        whole, frac = m.group(1), m.group(2)
        plain = whole.replace(",", "") + ("." + frac if frac else "")
        value = float(plain)
        percent = bool(PERCENT_AFTER.match(text[m.end():m.end() + 16]))
        if frac is None and not percent:
            in_math = any(a <= m.start() < b for a, b in math_spans)
            significant = plain.rstrip("0")
            if in_math or len(significant) < 3 or (int(value) & (int(value) - 1)) == 0:
                continue
        elif len(plain.replace(".", "").lstrip("0")) < 2:
            continue
        yield m.group(0), value, len(frac or ""), percent


def typed_numbers(nb, values):
    """The numbers of a notebook's prose that equal a measured value to their printed digits."""
    found = []
    if values.size == 0:
        return found
    for i, text in prose(nb):
        for token, value, decimals, percent in numbers(text):
            scaled = values * 100 if percent else values
            if np.any(np.abs(np.round(scaled, decimals) - value) < 1e-9 * max(1.0, value)):
                found.append((i, token))
    return found


def notebooks():
    return sorted(p for p in NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.stem)
def test_no_typed_measured_number(path):
    nb = json.loads(path.read_text())
    files = data_files(nb)
    values = np.concatenate([measured_values(f) for f in files]) if files else np.array([])
    typed = [(i, tok) for i, tok in typed_numbers(nb, values) if (path.stem, tok) not in ALLOWED]
    assert not typed, (
        f"{path.name} types numbers that its data files ({', '.join(f.name for f in files)}) "
        f"measure; produce them from the data (display(Markdown(f'...'))) or, for a constant "
        f"of a paper, add it to ALLOWED with its reason: "
        + "; ".join(f"cell {i}: {tok}" for i, tok in typed)
    )


def test_a_planted_number_fails():
    """A measured value typed into a chapter's prose is found: the check can fail."""
    path = NOTEBOOKS / "32_lora.ipynb"
    nb = json.loads(path.read_text())
    values = np.concatenate([measured_values(f) for f in data_files(nb)])
    assert values.size > 0
    measured = next(v for v in values if 0.01 < abs(v) < 1000 and round(v, 3) != round(v, 1))
    before = typed_numbers(nb, values)
    planted = f"The method reaches {measured:.3f} here."
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": planted})
    after = typed_numbers(nb, values)
    assert len(after) == len(before) + 1
    assert after[-1] == (len(nb["cells"]) - 1, f"{measured:.3f}")


def test_the_number_rules():
    """What looks measured and what does not."""
    found = {tok for tok, *_ in numbers(
        "a loss of 1.25 and 52 % of 137,216 weights; $T = 4096$, $T = 448$, 2048, 3 seeds, "
        "between 66–72 % and `1.5` and [x](a/1.75.html)"
    )}
    assert found == {"1.25", "52", "137,216", "66", "72"}
