"""Strategies meet the model through public seams (issue 52): counted by reading the source.

- ``object.__setattr__`` appears only in the module base class (``tformer.nn.layers.Module``): a
  strategy points a parameter attribute elsewhere with ``Module.bind``, swaps a layer with
  ``Module.replace``, drops what a layer keeps with ``Module.clear_saved``.
- No file reads or writes another object's private field: ``obj._name`` (or ``getattr(obj,
  "_name")``), where ``obj`` is not ``self`` / ``cls`` and ``_name`` is a private name that another
  file of the package defines (a ``self._name`` it assigns, a ``_name`` function, class or constant
  of its own) and this file does not. A file may use its own private names on other instances of
  its classes (``Module`` on the modules of its tree). ``ALLOWED`` would list an exception with
  its reason; it is empty.
- No file finds where an array lives by pointer arithmetic (``__array_interface__``): a
  parameter's place in the flat buffers is the table ``Module.flat_layout()``.

The counts are printed; a planted violation of each kind fails the check.
"""
import ast
from pathlib import Path

import numpy as np
import pytest

import tformer

PACKAGE = Path(tformer.__file__).resolve().parent

#: The class whose methods may call ``object.__setattr__``: ``(file, class)``.
BASE = ("nn/layers.py", "Module")

#: Private names a standard library type makes part of its public interface (namedtuple's).
STDLIB = {"_replace", "_asdict", "_fields", "_field_defaults", "_make"}

#: ``(file, name)``: private reads across files that remain, each with its reason.
ALLOWED = {}


def _private(name):
    return name.startswith("_") and not name.endswith("__") and name != "_"


def _is_self(node):
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super")


def _string_access(node):
    """``getattr(obj, "_x")``, ``setattr``, ``hasattr``, ``object.__setattr__``: ``(obj, "_x")`` or None."""
    if not isinstance(node, ast.Call) or len(node.args) < 2:
        return None
    f = node.func
    named = (isinstance(f, ast.Name) and f.id in ("getattr", "setattr", "hasattr", "delattr")) or (
        isinstance(f, ast.Attribute) and f.attr == "__setattr__" and isinstance(f.value, ast.Name)
        and f.value.id == "object")
    key = node.args[1]
    if named and isinstance(key, ast.Constant) and isinstance(key.value, str):
        return node.args[0], key.value
    return None


def _defined(tree):
    """The private names a file defines: functions, classes, constants, ``self._x`` it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Name) and _private(sub.id):
                        names.add(sub.id)
                    elif isinstance(sub, ast.Attribute) and _is_self(sub.value) and _private(sub.attr):
                        names.add(sub.attr)
        else:
            access = _string_access(node)
            if access and _is_self(access[0]) and _private(access[1]):
                names.add(access[1])
    return names


def _parse(root):
    return {p.relative_to(root).as_posix(): ast.parse(p.read_text(), str(p))
            for p in sorted(root.rglob("*.py"))}


def setattr_calls(root, base=BASE):
    """``[(file, line)]`` of ``object.__setattr__`` outside the base class."""
    found = []
    for rel, tree in _parse(root).items():
        inside = set()
        if rel == base[0]:
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.name == base[1]:
                    inside = {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "__setattr__"
                    and isinstance(node.value, ast.Name) and node.value.id == "object"
                    and id(node) not in inside):
                found.append((rel, node.lineno))
    return found


def private_reads(root, allowed=()):
    """``[(file, line, name)]`` of private fields of another file's objects used here."""
    trees = _parse(root)
    defined = {rel: _defined(tree) for rel, tree in trees.items()}
    everywhere = set().union(*defined.values()) - STDLIB
    found = []
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_self(node.value):
                obj, name = node.value, node.attr
            elif _string_access(node) and not _is_self(_string_access(node)[0]):
                obj, name = _string_access(node)
            else:
                continue
            if (name in everywhere and name not in defined[rel] and _private(name)
                    and (rel, name) not in allowed):
                found.append((rel, node.lineno, name))
    return found


def pointer_arithmetic(root):
    """``[(file, line)]`` of every ``__array_interface__`` (an attribute, or a name in a string)."""
    found = []
    for rel, tree in _parse(root).items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "__array_interface__") or (
                    isinstance(node, ast.Constant) and node.value == "__array_interface__"):
                found.append((rel, node.lineno))
    return found


def test_object_setattr_only_in_the_module_base_class():
    found = setattr_calls(PACKAGE)
    print(f"object.__setattr__ outside {BASE[1]}: {len(found)}")
    assert found == []


def test_no_private_field_of_another_file_is_read():
    found = private_reads(PACKAGE, ALLOWED)
    print(f"private reads across files: {len(found)} (allowed: {len(ALLOWED)})")
    assert found == []


def test_no_offset_is_found_by_pointer_arithmetic():
    found = pointer_arithmetic(PACKAGE)
    print(f"__array_interface__ uses: {len(found)}")
    assert found == []


def test_planted_pointer_arithmetic_fails(tmp_path):
    (tmp_path / "optim.py").write_text(
        "def offset(p, P):\n"
        "    return (p.__array_interface__['data'][0] - P.ctypes.data) // P.itemsize\n"
        "def other(p):\n"
        "    return getattr(p, '__array_interface__')\n")
    assert sorted(pointer_arithmetic(tmp_path)) == [("optim.py", 2), ("optim.py", 4)]


def test_the_allow_list_is_still_needed():
    used = {(rel, name) for rel, _, name in private_reads(PACKAGE)}
    assert set(ALLOWED) <= used, f"no longer needed: {sorted(set(ALLOWED) - used)}"


@pytest.mark.parametrize("kind", ["setattr", "attribute", "getattr"])
def test_a_planted_violation_fails(tmp_path, kind):
    (tmp_path / "nn").mkdir()
    (tmp_path / "nn" / "layers.py").write_text(
        "class Module:\n"
        "    def __init__(self):\n"
        "        object.__setattr__(self, '_children', {})\n"
        "        self._cache = None\n"
        "    def walk(self, other):\n"
        "        return other._children\n")                 # its own name on another instance: fine
    body = {"setattr": "def f(m):\n    object.__setattr__(m, 'W', 1)\n",
            "attribute": "def f(m):\n    return m._cache\n",
            "getattr": "def f(m):\n    return getattr(m, '_children', None)\n"}[kind]
    (tmp_path / "strategy.py").write_text(body)
    assert private_reads(tmp_path) == [] or kind != "setattr"
    if kind == "setattr":
        assert setattr_calls(tmp_path) == [("strategy.py", 2)]
    else:
        assert setattr_calls(tmp_path) == []
        assert [(r, n) for r, _, n in private_reads(tmp_path)] == [
            ("strategy.py", "_cache" if kind == "attribute" else "_children")]


# --- the seams themselves ---------------------------------------------------------------------

KEPT = ("_cache", "att", "_rope", "_saved")     # the names the package's layers keep state under


def test_every_layer_declares_what_its_forward_keeps():
    """A class that assigns ``self._cache`` (or attention's ``att`` / ``_rope``, recomputation's
    ``_saved``) lists it in ``saved``, so that ``clear_saved`` and the replicas see it."""
    import importlib
    missing = []
    for rel, tree in _parse(PACKAGE).items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            kept = {t.attr for n in ast.walk(cls) if isinstance(n, ast.Assign) for t0 in n.targets
                    for t in ast.walk(t0) if isinstance(t, ast.Attribute) and _is_self(t.value)
                    and t.attr in KEPT}
            if kept:
                mod = importlib.import_module("tformer." + rel[:-3].replace("/", "."))
                declared = getattr(getattr(mod, cls.name), "saved", ())
                missing += [(rel, cls.name, k) for k in sorted(kept - set(declared))]
    assert missing == []


def _tiny(**kw):
    from tformer.models.tinygpt import TinyGPT
    return TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=0, **kw)


def test_clear_saved_drops_what_every_layer_kept():
    model = _tiny(positions="rope")
    model.forward(np.arange(16).reshape(2, 8) % 256)
    kept = [v for m in model.modules() for v in m.saved_values() if v is not None]
    assert len(kept) > 10
    model.clear_saved()
    assert all(v is None for m in model.modules() for v in m.saved_values())
    attn = model.blocks[0].attn
    attn.keep(att=np.ones(1))
    assert attn.att is not None and attn.saved_values()[0] is None
    with pytest.raises(ValueError, match="names among"):
        attn.keep(W=1)


def test_replace_swaps_a_layer_and_the_walk_follows():
    from tformer.nn.layers import Linear
    model = _tiny()
    walk = model.named_modules()
    assert model.named_modules() is walk                       # kept, not walked again
    new = Linear(16, 48, seed=1)
    old = model.replace("blocks.1.attn.qkv", new)
    assert old is not new and model.blocks[1].attn.qkv is new
    assert dict(model.named_modules())["blocks.1.attn.qkv"] is new
    assert any(name.startswith("blocks.1.attn.qkv.") for name, _, _ in model.named_parameters())
    model.blocks[0].extra = Linear(2, 2)                      # a child set by assignment
    assert "blocks.0.extra" in dict(model.named_modules())
    for bad in ("blocks.7.attn", "nothing", "blocks.1.attn.qkv.W"):
        with pytest.raises(ValueError, match="names no module"):
            model.replace(bad, Linear(2, 2))


def test_bind_points_only_a_parameter_attribute():
    from tformer.nn.layers import Linear
    lin = Linear(3, 2)
    copy16 = lin.W.astype(np.float16)
    lin.bind("W", copy16)
    assert lin.W is copy16 and lin.params["W"].dtype == np.float32
    with pytest.raises(ValueError, match="parameter attribute"):
        lin.bind("eps", 1.0)


def test_a_training_step_walks_no_tree():
    """The tree is walked when it changes, not at every step: the walk's tuple survives a step."""
    from tformer.nn import functional as F
    from tformer.training.optim import AdamW
    from tformer.training.train import train
    model = _tiny()
    model.flatten_parameters()
    x = np.arange(32).reshape(4, 8) % 256
    walk = model.named_modules()
    train(model, AdamW(model), lambda i: (x, x), lambda m, b: F.cross_entropy(m.forward(b[0]), b[1]),
          2, clip_norm=1.0, progress_bar=False)
    assert model.named_modules() is walk
