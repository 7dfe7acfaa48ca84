"""The source of tformer's own functions and classes, shown in a notebook as a code block.

A chapter's "Where is this in the code" section shows the code it has just verified, read from the
package at the moment the cell runs, so the package stays the one copy. ``show_source(name, ...)``
returns a ``Source`` whose rich display is a fenced Python block (``text/markdown``: highlighted in
the built book and in JupyterLab) and whose plain text is the code itself, which nbval compares.

Above each block is a link to the object in its file, ``../tformer/<module>.py#<qualified name>``,
relative to ``notebooks/`` where the chapters live. In JupyterLab it opens the ``.py`` file; in the
built book, ``book/_ext/source_links.py`` points it at the highlighted page of that module
(``_modules/tformer/<module>.html#<qualified name>``, Sphinx's viewcode) and makes sure that page
has the anchor; ``tools/check_links.py`` fails if it does not lead there.
"""
import ast
import importlib
import importlib.util
import inspect
import textwrap
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


#: Where the chapters live, relative to the repository: the links above each block start from here.
NOTEBOOK_DIR_TO_ROOT = ".."


class Source:
    """The source of one or more objects: ``blocks`` is a list of ``(file, code)`` pairs and
    ``anchors`` the qualified name of each object inside its file (``"Adam._update"``)."""

    def __init__(self, blocks, anchors=None):
        self.blocks = list(blocks)
        self.anchors = list(anchors) if anchors is not None else [None] * len(self.blocks)

    def __repr__(self):
        return "\n\n".join(code for _, code in self.blocks)

    def _repr_markdown_(self):
        parts = []
        for (file, code), anchor in zip(self.blocks, self.anchors):
            if anchor:
                href = f"{NOTEBOOK_DIR_TO_ROOT}/{file}#{anchor}"
                parts.append(f'<a class="tformer-source-link" href="{href}">{file}: {anchor}</a>')
            parts.append(f"```python\n# {file}\n{code}\n```")
        return "\n\n".join(parts)


def _resolve(name):
    """The object named ``tformer.module.attr[.attr]``, importing the longest module prefix."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a dotted name such as 'tformer.nn.functional.softmax_forward',"
                        f" got {type(name).__name__}")
    parts = name.split(".")
    if parts[0] != "tformer" or len(parts) < 2:
        raise ValueError(f"name: expected a dotted name inside tformer ('tformer.module.object'), "
                         f"got {name!r}")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is not None and not module_name.startswith(e.name):
                raise                                        # a missing dependency, not the name
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise ValueError(f"name: {module_name!r} has no {'.'.join(parts[cut:])!r} "
                                 f"(asked for {name!r})")
            obj = getattr(obj, attr)
        return obj
    raise ValueError(f"name: no module of tformer in {name!r}")


def _source_unimported(name, missing):
    """``(file, code)`` of ``name`` read from its module's file without running it: the fallback
    for a module whose optional dependency (``missing``, e.g. torch) is not installed."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        spec = importlib.util.find_spec(".".join(parts[:cut]))
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            break
    else:
        raise ValueError(f"name: no module of tformer in {name!r}")
    path = Path(spec.origin).resolve()
    text = path.read_text(encoding="utf-8")
    node = ast.parse(text)
    for attr in parts[cut:]:
        found = [n for n in getattr(node, "body", []) if getattr(n, "name", None) == attr
                 and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        if not found:
            raise ValueError(f"name: {name!r} not found in {path.name} (read without importing "
                             f"it: {missing!r} is not installed)")
        node = found[-1]
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    code = textwrap.dedent("\n".join(text.splitlines()[start - 1:node.end_lineno])).rstrip("\n")
    return path.relative_to(PACKAGE_ROOT.parent).as_posix(), code


def source_of(name):
    """``(file, code)``: the file relative to the repository and the dedented source of ``name``.

    A module that needs an optional dependency which is missing (``tformer.bench.torch_gpt``
    without torch) is read as text instead, so a chapter shows its code either way.
    """
    try:
        obj = _resolve(name)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] == "tformer":
            raise
        return _source_unimported(name, e.name)
    target = inspect.unwrap(obj)
    try:
        file = Path(inspect.getsourcefile(target)).resolve()
        code = textwrap.dedent(inspect.getsource(target)).rstrip("\n")
    except (TypeError, OSError) as e:
        raise ValueError(f"name: {name!r} is a {type(obj).__name__} without Python source") from e
    if PACKAGE_ROOT not in file.parents:
        raise ValueError(f"name: {name!r} is defined outside tformer, in {file.name}")
    return file.relative_to(PACKAGE_ROOT.parent).as_posix(), code


def anchor_of(name):
    """The qualified name of ``name`` inside the module that defines it: ``'softmax_forward'`` for
    ``'tformer.kernels.softmax.softmax_forward'``, ``'Adam._update'`` for ``'tformer.training.optim.Adam._update'``
    (Sphinx's viewcode uses it as the anchor on the module's highlighted page)."""
    try:
        target = inspect.unwrap(_resolve(name))
    except ModuleNotFoundError:                   # an optional dependency is missing: read as text
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            if importlib.util.find_spec(".".join(parts[:cut])) is not None:
                return ".".join(parts[cut:])
        raise
    qualname = getattr(target, "__qualname__", None)
    if not qualname or "<locals>" in qualname:
        raise ValueError(f"name: {name!r} has no qualified name in its module")
    return qualname


def show_source(*names):
    """The source of each named object (``'tformer.kernels.softmax.softmax_forward'``), in order,
    each with a link to it in its file."""
    if not names:
        raise ValueError("names: expected at least one dotted name, got none")
    return Source([source_of(name) for name in names], [anchor_of(name) for name in names])
