"""Hygiene of the committed chapter notebooks (standard library + pytest only).

nbval re-runs each notebook and compares its outputs with the stored ones, but a notebook committed
*without* outputs passes nbval trivially. These tests make sure every notebook was executed top to
bottom in one fresh kernel, stores no error and no machine-specific path, and leaves most of its
outputs for nbval to compare.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
MAX_BYTES = 2_000_000
MAX_IGNORED_SHARE = 0.30
# nbval 0.11 honours a marker only when the comment is exactly the marker (reasons go on the next line)
MARKERS = {"NBVAL_IGNORE_OUTPUT", "NBVAL_RAISES_EXCEPTION", "NBVAL_SKIP", "NBVAL_CHECK_OUTPUT"}
MACHINE_PATH = re.compile(
    r"(/work/|/tmp/|/home/|/root/|/Users/|/usr/local/lib/python|site-packages/|\.venv/)"
)


def find_notebooks(directory=NOTEBOOK_DIR):
    return sorted(
        p for p in Path(directory).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
    )


def _text(value):
    return "".join(value) if isinstance(value, list) else (value or "")


def _output_text(output):
    """All the text an output would show: streams, text/* MIME data and tracebacks."""
    parts = [_text(output.get("text", ""))]
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            parts.append(_text(value))
    parts.extend(output.get("traceback", []))
    return "\n".join(parts)


def notebook_problems(nb, size=0):
    """Return a list of readable problems of one notebook, given as a dict (nbformat 4 JSON)."""
    problems = []
    if size > MAX_BYTES:
        problems.append(f"file is {size:,} bytes, over the {MAX_BYTES:,} limit (shrink the figures)")
    code = [c for c in nb.get("cells", [])
            if c.get("cell_type") == "code" and _text(c.get("source", "")).strip()]
    counts = [c.get("execution_count") for c in code]
    never = [i for i, n in enumerate(counts) if n is None]
    if never:
        problems.append(f"{len(never)} of {len(code)} non-empty code cells were never executed "
                        f"(code cells {never[:10]}); run `make execute NB=...`")
    elif counts != list(range(1, len(counts) + 1)):
        problems.append(f"execution counts are {counts}, not 1..{len(counts)}: the notebook was "
                        "not run top to bottom in one fresh kernel; run `make execute NB=...`")
    with_output = ignored = 0
    for i, cell in enumerate(code):
        src = _text(cell.get("source", ""))
        if "NBVAL_SKIP" in src:
            problems.append(f"code cell {i}: NBVAL_SKIP hides the cell from nbval")
        for line in src.splitlines():
            marker = line.strip().lstrip("#").strip()
            if line.strip().startswith("#") and marker.startswith("NBVAL_") and marker not in MARKERS:
                problems.append(f"code cell {i}: nbval ignores the marker line {line.strip()!r}: "
                                "a marker must be alone on its line (give the reason on the next)")
        outputs = cell.get("outputs", [])
        if outputs:
            with_output += 1
            ignored += "NBVAL_IGNORE_OUTPUT" in src
        for out in outputs:
            if out.get("output_type") == "error":
                problems.append(f"code cell {i}: stored error output "
                                f"{out.get('ename')}: {out.get('evalue')} (to show an error on "
                                "purpose, catch it and print its message)")
            match = MACHINE_PATH.search(_output_text(out))
            if match:
                problems.append(f"code cell {i}: output shows a machine-specific path "
                                f"({match.group(0)!r}...)")
    if with_output and ignored / with_output > MAX_IGNORED_SHARE:
        problems.append(f"{ignored} of {with_output} code cells with output are marked "
                        f"NBVAL_IGNORE_OUTPUT (over {MAX_IGNORED_SHARE:.0%}): nbval checks too little")
    return problems


NOTEBOOKS = find_notebooks()


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks found under {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_notebook_hygiene(path):
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        pytest.fail(f"{path.relative_to(ROOT)} is not readable as JSON: {e}")
    problems = notebook_problems(nb, size=path.stat().st_size)
    assert not problems, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


# --- the checker itself: it must flag a bad notebook, or the tests above prove nothing ----------

def _cell(source, count=None, outputs=()):
    return {"cell_type": "code", "source": source, "execution_count": count,
            "metadata": {}, "outputs": list(outputs)}


def _stream(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


def _good_notebook():
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "source": "# Title", "metadata": {}},
        _cell("import numpy as np", 1),
        _cell("print(1 + 1)", 2, [_stream("2\n")]),
        _cell("", None),  # empty cells are never executed, and that is fine
        _cell(["x = 3\n", "x"], 3, [{"output_type": "execute_result", "execution_count": 3,
                                     "data": {"text/plain": "3"}, "metadata": {}}]),
    ]}


def test_checker_accepts_a_good_notebook():
    assert notebook_problems(_good_notebook()) == []


def test_checker_flags_a_never_executed_notebook():
    nb = _good_notebook()
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["execution_count"] = None
            cell["outputs"] = []
    problems = notebook_problems(nb)
    assert len(problems) == 1 and "never executed" in problems[0]


@pytest.mark.parametrize("spoil, expected", [
    (lambda nb: nb["cells"][2].update(execution_count=7), "not 1..3"),
    (lambda nb: nb["cells"].reverse(), "not 1..3"),
    (lambda nb: nb["cells"][2]["outputs"].append(
        {"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": []}),
     "stored error output"),
    (lambda nb: nb["cells"][2]["outputs"].append(
        _stream("/usr/local/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning", "stderr")),
     "machine-specific path"),
    (lambda nb: nb["cells"][4]["outputs"][0]["data"].update(
        {"text/html": "<pre>/work/main/.venv/lib/x.py</pre>"}), "machine-specific path"),
    (lambda nb: nb["cells"][1].update(source="# NBVAL_SKIP\nimport numpy as np"), "NBVAL_SKIP"),
    (lambda nb: [nb["cells"][i].update(source="# NBVAL_IGNORE_OUTPUT\n1") for i in (2, 4)],
     "NBVAL_IGNORE_OUTPUT"),
    (lambda nb: nb["cells"][2].update(source="# NBVAL_IGNORE_OUTPUT - timing\n1"), "alone on its line"),
])
def test_checker_flags_each_problem(spoil, expected):
    nb = _good_notebook()
    spoil(nb)
    problems = notebook_problems(nb)
    assert any(expected in p for p in problems), problems


def test_checker_flags_a_large_notebook():
    problems = notebook_problems(_good_notebook(), size=MAX_BYTES + 1)
    assert any("over the" in p for p in problems), problems
