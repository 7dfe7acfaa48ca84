"""tformer.core.source.show_source: the code a chapter's "Where is this in the code" section shows."""
import inspect

import pytest

from tformer.kernels import softmax
from tformer.core.source import show_source, source_of


def test_source_of_a_function_and_a_method():
    file, code = source_of("tformer.kernels.softmax.softmax_forward")
    assert file == "tformer/kernels/softmax.py"
    assert code == inspect.getsource(softmax.softmax_forward).rstrip("\n")
    file, code = source_of("tformer.training.optim.AdamW.step")
    assert file == "tformer/training/optim.py" and code.startswith("def step(")   # dedented


def test_display_is_a_fenced_python_block_per_object():
    shown = show_source("tformer.kernels.softmax.softmax_forward",
                        "tformer.kernels.softmax.softmax_backward")
    md = shown._repr_markdown_()
    assert md.count("```python\n# tformer/kernels/softmax.py\n") == 2
    assert repr(shown).startswith("def softmax_forward(") and "def softmax_backward(" in repr(shown)


def test_each_block_links_to_its_object_in_its_file():
    shown = show_source("tformer.fast.softmax._softmax_inplace", "tformer.training.optim.Adam._update",
                        "tformer.fast.activations.relu_forward")
    assert shown.anchors == ["_softmax_inplace", "Adam._update", "relu_forward"]
    md = shown._repr_markdown_()
    # relative to notebooks/: the .py file in JupyterLab; book/_ext/source_links.py points the
    # same link at the highlighted page in the built book
    for href in ("../tformer/fast/softmax.py#_softmax_inplace", "../tformer/training/optim.py#Adam._update",
                 "../tformer/kernels/activations.py#relu_forward"):     # where it is defined
        assert f'<a class="tformer-source-link" href="{href}">' in md
    assert md.index("#Adam._update") < md.index("def _update")


def test_source_links_are_rewritten_to_viewcode_pages():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "book" / "_ext" / "source_links.py"
    spec = importlib.util.spec_from_file_location("source_links", path)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)

    class Env:
        _viewcode_modules = {"tformer.kernels.softmax": ("", {}, {}, "tformer.nn.functional")}

    class App:
        class builder:
            env = Env()

    body = ('<a class="tformer-source-link" href="../tformer/kernels/softmax.py#softmax_forward">'
            '<a class="tformer-source-link" href="../tformer/training/optim.py#Adam._update">'
            '<a class="tformer-source-link" href="../tformer/training/optim.py#Adam._update">')
    context = {"body": body}
    ext.rewrite(App, "notebooks/01_softmax", "page.html", context, None)
    out = context["body"]
    assert 'href="../_modules/tformer/kernels/softmax.html#softmax_forward" ' \
           'id="tformer.nn.functional.softmax_forward"' in out
    assert out.count('href="../_modules/tformer/training/optim.html#Adam._update"') == 2
    assert out.count('id="tformer.training.optim.Adam._update"') == 1          # one id per page


@pytest.mark.parametrize("name, error, words", [
    ("numpy.linalg.norm", ValueError, "inside tformer"),
    ("tformer.kernels.softmax.nope", ValueError, "has no 'nope'"),
    ("tformer.nomodule.x", ValueError, "has no 'nomodule.x'"),
    ("tformer.kernels.softmax.np", ValueError, "defined outside tformer"),
    ("tformer.training.train.math.sqrt", ValueError, "without Python source"),
    (3, TypeError, "got int"),
])
def test_bad_names_say_what_was_expected(name, error, words):
    with pytest.raises(error, match=words):
        show_source(name)


def test_needs_a_name():
    with pytest.raises(ValueError, match="at least one"):
        show_source()


# Chapters whose {literalinclude} blocks are still to be converted (python tools/source_cells.py);
# the lab renders such a block as nothing. Remove a name once its chapter is converted.
PENDING = set()


def test_no_chapter_shows_code_the_lab_cannot_render():
    import json
    import re
    from pathlib import Path

    block = re.compile(r"^```+\{literalinclude\}", re.M)
    with_blocks = set()
    for path in sorted(Path(__file__).resolve().parents[2].glob("notebooks/*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        if any(block.search("".join(c["source"])) for c in cells if c["cell_type"] == "markdown"):
            with_blocks.add(path.stem)
    assert with_blocks <= PENDING, (f"{sorted(with_blocks - PENDING)}: {{literalinclude}} blocks; "
                                    "python tools/source_cells.py notebooks/X.ipynb converts them")
    assert PENDING <= with_blocks, f"{sorted(PENDING - with_blocks)} converted: remove from PENDING"


def test_source_of_a_module_whose_optional_dependency_is_missing(monkeypatch):
    """tformer.bench.torch_gpt needs torch; without torch its code is read from the file, as is."""
    import sys

    from tformer.core.source import source_of
    with_torch = source_of("tformer.bench.torch_gpt.Block")
    monkeypatch.delitem(sys.modules, "tformer.bench.torch_gpt", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)            # import torch now fails
    without = source_of("tformer.bench.torch_gpt.Block")
    assert without == with_torch
    assert without[0] == "tformer/bench/torch_gpt.py" and without[1].startswith("class Block")
    with pytest.raises(ValueError, match="NoSuchThing"):
        source_of("tformer.bench.torch_gpt.NoSuchThing")


def _show_source_cells():
    """``(chapter, cell index, names, stored text/plain)`` of every cell that only calls
    ``show_source`` with literal names."""
    import ast
    import json
    from pathlib import Path

    found = []
    for path in sorted(Path(__file__).resolve().parents[2].glob("notebooks/*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or "show_source(" not in src:
                continue
            calls = [node for node in ast.walk(ast.parse(src)) if isinstance(node, ast.Call)
                     and getattr(node.func, "id", None) == "show_source"]
            if len(calls) != 1 or not all(isinstance(a, ast.Constant) for a in calls[0].args):
                continue
            shown = [o["data"]["text/plain"] for o in cell.get("outputs", [])
                     if o.get("output_type") == "execute_result"]
            found.append((path.stem, i, [a.value for a in calls[0].args],
                          "".join(shown[0]) if shown else None))
    return found


SHOWN = _show_source_cells()


def test_chapters_show_code():
    assert len(SHOWN) > 50


@pytest.mark.parametrize("chapter, cell, names, stored", SHOWN,
                         ids=[f"{c}-cell{i}" for c, i, _, _ in SHOWN])
def test_stored_listing_is_the_current_code(chapter, cell, names, stored):
    """A chapter's stored listing equals the package's code now: a change to a shown function
    needs its chapter re-executed (make execute NB=...), found here before nbval runs."""
    assert stored is not None, f"{chapter} cell {cell}: show_source without a stored output"
    assert stored == repr(show_source(*names)), (
        f"{chapter} cell {cell} shows an older version of {', '.join(names)}: "
        f"re-execute notebooks/{chapter}.ipynb")
