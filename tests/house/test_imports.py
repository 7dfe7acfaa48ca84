"""No import circles and no upward imports in ``tformer``: the layers of ``tests/import_layers.py``,
checked on the real package, and the checker shown failing on a planted circle and a planted
upward import."""
import os
import sys
import textwrap

import import_layers as il

import tformer


def _package_root():
    return tformer.__path__[0]


def test_tformer_has_no_import_circle():
    assert il.circles(il.import_graph(_package_root(), "tformer")) == []


def test_tformer_imports_only_from_its_own_layer_or_below_and_every_module_has_a_layer():
    up, unplaced = il.upward(il.import_graph(_package_root(), "tformer"))
    assert unplaced == [], f"modules with no layer (add them to LAYERS): {unplaced}"
    assert up == [], "upward imports (module, layer, imports, from layer): " + repr(up)


def test_the_layers_name_every_pattern_once_and_the_bottom_is_the_foundation():
    patterns = [p for _, ps in il.LAYERS for p in ps]
    assert len(patterns) == len(set(patterns))
    assert il.layer_of("tformer.kernels.softmax") < il.layer_of("tformer.nn.functional") \
        < il.layer_of("tformer.models.tinygpt") < il.layer_of("tformer.training.train") \
        < il.layer_of("tformer.decoding.generate") \
        < il.layer_of("tformer.data.text") < il.layer_of("tformer.runs.tinygpt") \
        < il.layer_of("tformer.experiments.ablate") < il.layer_of("tformer.__main__")


def test_the_folders_are_the_layers_and_the_top_level_holds_at_most_ten_modules():
    root = _package_root()
    top = sorted(n for n in os.listdir(root) if n.endswith(".py"))
    folders = sorted(n for n in os.listdir(root)
                     if os.path.isfile(os.path.join(root, n, "__init__.py")))
    print(f"top-level modules: {len(top)} {top}; folders: {len(folders)}")
    assert len(top) <= 10, top
    assert folders == sorted(il.FOLDERS), (folders, il.FOLDERS)
    assert [name for name, _ in il.LAYERS] == il.FOLDERS + ["entry point"]


def test_readme_shows_the_package_map_that_the_layers_and_folders_make():
    sys.path.insert(0, os.path.join(os.path.dirname(_package_root()), "tools"))
    try:
        import package_map
    finally:
        sys.path.pop(0)
    with open(os.path.join(os.path.dirname(_package_root()), "README.md"), encoding="utf-8") as f:
        shown = package_map.readme_block(f.read())
    assert shown == il.package_map(_package_root()), \
        "README's package map is stale: python tools/package_map.py --write"


def _write(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


LAYERS = [("low", ["pkg", "pkg.low", "pkg.low2"]), ("high", ["pkg.high"])]


def test_a_planted_circle_through_an_import_inside_a_function_is_found(tmp_path):
    _write(tmp_path / "pkg", {
        "__init__.py": "",
        "low.py": "from . import low2\n",
        "low2.py": "def f():\n    from .low import g   # lazy, still an edge\n",
        "high.py": "from pkg import low\n"})
    graph = il.import_graph(tmp_path / "pkg", "pkg")
    assert graph == {"pkg": set(), "pkg.low": {"pkg.low2"}, "pkg.low2": {"pkg.low"},
                     "pkg.high": {"pkg.low"}}
    assert il.circles(graph) == [["pkg.low", "pkg.low2", "pkg.low"]]
    assert il.upward(graph, LAYERS) == ([], [])


def test_a_planted_upward_import_and_an_unplaced_module_are_found(tmp_path):
    _write(tmp_path / "pkg", {
        "__init__.py": "",
        "low.py": "import os\n\ndef f():\n    import pkg.high\n",
        "high.py": "from .low import f\n",
        "stray.py": "from .high import *\n"})
    graph = il.import_graph(tmp_path / "pkg", "pkg")
    assert il.circles(graph) == [["pkg.high", "pkg.low", "pkg.high"]]
    up, unplaced = il.upward(graph, LAYERS)
    assert up == [("pkg.low", "low", "pkg.high", "high")]
    assert unplaced == ["pkg.stray"]


def test_circles_on_a_synthetic_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert il.circles(graph) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert il.circles({"a": {"b"}, "b": set()}) == []
