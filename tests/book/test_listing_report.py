"""tools/listing_report.py (the measure of the chapters' listings): its counts on a known
listing and a synthetic notebook, and a run over the repository's chapters."""
import importlib.util
import json
from pathlib import Path

from tformer.core.source import show_source

ROOT = Path(__file__).resolve().parents[2]

CODE = '''\
@decorator
def kernel(x, out=None):
    """y = 2 x.

    A docstring line that says float16 and parallel.
    """
    # a comment line: parallel
    y = 2 * x                 # float16 in a comment

    if out is not None:
        out[...] = y
        return out
    return y'''


def _tool():
    spec = importlib.util.spec_from_file_location("listing_report",
                                                  ROOT / "tools" / "listing_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _notebook(path, cells):
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb), encoding="utf-8")


def _code_cell(source, text):
    return {"cell_type": "code", "source": source, "metadata": {}, "execution_count": 1,
            "outputs": [{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                         "data": {"text/plain": text}}]}


def test_code_lines_functions_and_features_of_a_known_listing():
    tool = _tool()
    # 13 lines: decorator, def, 4 docstring lines, comment, y =, blank, if, out[...], 2 returns
    assert sorted(tool.code_mask(CODE)) == [1, 2, 8, 10, 11, 12, 13]
    assert tool.code_mask(CODE)[8] == "    y = 2 * x"                  # its comment cut off
    assert tool.functions_of(CODE, "m.kernel") == [("m.kernel", 7)]
    # in code only: out= in the signature; not the docstring's or comments' float16/parallel
    assert [(f, r) for f, r, _ in tool.feature_hits(CODE)] == [("out=", 2)]
    assert tool.feature_hits(CODE, {"twice": r"2 \*"}) == [("twice", 8, "    y = 2 * x")]


def test_a_synthetic_notebook(tmp_path):
    tool = _tool()
    name = "tformer.core.source.show_source"
    shown = repr(show_source(name))
    lines = len(shown.splitlines())
    path = tmp_path / "03_example.ipynb"
    _notebook(path, [{"cell_type": "markdown", "source": "# An example\n\nText.", "metadata": {}},
                     _code_cell(f"from tformer.core.source import show_source\nshow_source({name!r})",
                                shown),
                     _code_cell(f"show_source(\n    {name!r},\n    {name!r},\n)", "stale text")])
    c = tool.chapter(path, limit=3)
    assert (c["file"], c["number"], c["title"]) == ("03_example.ipynb", 3, "An example")
    assert len(c["listings"]) == 3 and c["cells"] == 2
    assert c["lines"] == 3 * lines and c["largest_cell"] == 2 * lines
    code_lines = len(tool.code_mask(shown))
    assert c["code_lines"] == 3 * code_lines and 0 < code_lines < lines   # the docstring is out
    assert c["longest"] == ("core/source.show_source", code_lines)
    assert c["over_limit"] == [("core/source.show_source", code_lines)]
    assert c["stale"] == [2]                           # the second cell's output is not the code
    assert c["listings"][0]["file"] == "tformer/core/source.py"


def test_the_repository_every_chapter_and_its_listings(tmp_path):
    tool = _tool()
    chapters = tool.report()
    files = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert [c["file"] for c in chapters] == files
    assert all(c["title"] for c in chapters)
    assert sum(len(c["listings"]) for c in chapters) >= 1
    assert all(x["code_lines"] <= x["lines"] for c in chapters for x in c["listings"])
    text = tool.format_report(chapters)
    assert all(f in text for f in files)
    tool.main(["--json", str(tmp_path / "r.json")])
    assert len(json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))) == len(files)


def test_invariants_are_counted_in_the_package():
    tool = _tool()
    places = tool.invariant_places()
    assert set(places) == set(tool.INVARIANTS)
    assert places["n_heads divides d_model"]              # checked somewhere, at least once
    assert all(p.startswith("tformer/") for ps in places.values() for p in ps)
