"""The package's layers, bottom to top, and the checker that holds the imports to them.

Each layer is one folder of ``tformer/``: the folders are the layers. A module may import from
its own folder or from a folder below, never from one above, and no chain of imports may come
back to where it started. Every import counts: at the top of a module and inside a function (a
lazy import is a dependency all the same). ``tests/house/test_imports.py`` runs the checker on
``tformer``.

This list is the package map's one copy: what each folder holds is its ``__init__.py``'s first
paragraph, and ``package_map()`` renders both into the block of ``README.md`` that
``tests/house/test_imports.py`` holds equal to it (``python tools/package_map.py --write`` rewrites it).

Why some modules sit where they do:
- ``core.parallel`` (the thread pool) is below the kernels: every kernel splits its rows with it;
  ``core.provenance``, ``core.cpu`` and ``core.timing`` (where and how a number was measured) are
  below everything that measures: the experiments and the bench.
- ``nn.recompute`` (gradient checkpointing) is a stack of blocks that a model builds on its
  keyword, so it sits with the layers, below the models; ``training.batch_threads`` (the batch cut
  across threads) wraps any model from outside, and the training loop runs it.
- ``decoding.quantize`` (int8) sits with decoding: an int8 model is one to decode with.
- ``data`` sits above ``decoding``: a sequence task scores a model by decoding it; the tokenizer
  (``data.bpe``) is data's own.
- ``tuning`` (DPO and SFT on preference pairs, and the pairs) sits above ``data``: its pairs are
  sampled from a model and scored by a judge.
- The bench is below the experiments: an experiment borrows the bench's FLOP count and its
  PyTorch twin; the bench measures, and reads nothing of the experiments.
  ``python -m tformer`` (``__main__``) registers every command, so it is the top.
"""
import ast
import fnmatch
import os

# The folders, bottom first: (name, module patterns). fnmatch patterns on dotted module names.
FOLDERS = ["core", "kernels", "fast", "nn", "models", "training", "decoding", "data", "tuning",
           "runs", "bench", "experiments"]
LAYERS = ([("core", ["tformer", "tformer.core", "tformer.core.*"])]
          + [(f, [f"tformer.{f}", f"tformer.{f}.*"]) for f in FOLDERS[1:]]
          + [("entry point", ["tformer.__main__"])])


def layer_of(module, layers=LAYERS):
    """The index of ``module``'s layer: the first whose patterns name it exactly, else the first
    whose wildcard matches it; None if none does."""
    for exact in (True, False):
        for i, (_, patterns) in enumerate(layers):
            for p in patterns:
                if (p == module) if exact else fnmatch.fnmatchcase(module, p):
                    return i
    return None


def modules(root, package):
    """``{dotted name: file}`` of every ``.py`` file under ``root``, the folder of ``package``."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                found[".".join([package, *rel])] = os.path.join(folder, name)
    return found


def _targets(module, path, node, known):
    """The modules of ``known`` that the import statement ``node`` in ``module`` names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for _ in range(max(node.level - 1, 0)):
            base = base.rpartition(".")[0]
        source = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
        names = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source
                 for a in node.names]
    return {n for n in names if n in known and n != module}


def import_graph(root, package):
    """``{module: set of modules of the package it imports}``, every import statement of every
    module read with ``ast`` (those inside functions too)."""
    known = modules(root, package)
    graph = {}
    for module, path in known.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        graph[module] = set().union(*(_targets(module, path, n, known) for n in ast.walk(tree)
                                      if isinstance(n, (ast.Import, ast.ImportFrom))))
    return graph


def circles(graph):
    """Every import circle, each as a list ``[a, b, ..., a]``: one per strongly connected group
    of two or more modules (Tarjan's algorithm), found from its smallest name."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v), on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_around(graph, group) for group in groups]


def _path_around(graph, group):
    """A circle through the smallest module of ``group``, by breadth-first search inside it."""
    start = min(group)
    came = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while came[path[-1]] is not None:
                        path.append(came[path[-1]])
                    return list(reversed(path)) + [start]             # start ... v start
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle through {start} in {sorted(group)}")


def upward(graph, layers=LAYERS):
    """``[(module, its layer, imported module, that layer)]`` for every import from a higher
    layer, and ``[module]`` for the modules no layer names."""
    names = [name for name, _ in layers]
    unplaced = sorted(m for m in graph if layer_of(m, layers) is None)
    up = [(m, names[layer_of(m, layers)], t, names[layer_of(t, layers)])
          for m in sorted(graph) for t in sorted(graph[m])
          if m not in unplaced and t not in unplaced and layer_of(t, layers) > layer_of(m, layers)]
    return up, unplaced


def _first_paragraph(path):
    """The first paragraph of the docstring of the file at ``path``, on one line."""
    with open(path, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read(), path)) or ""
    return " ".join(doc.split("\n\n")[0].split())


def package_map(root, width=100):
    """The package map, bottom to top: per folder of ``FOLDERS`` (its path under ``root``, the
    package's folder), what it holds (its ``__init__.py``'s first paragraph) and its modules, as
    the fenced block README.md shows."""
    import textwrap
    lines = []
    for folder in FOLDERS:
        where = os.path.join(root, folder)
        names = sorted(n[:-3] for n in os.listdir(where)
                       if n.endswith(".py") and n != "__init__.py")
        what = _first_paragraph(os.path.join(where, "__init__.py")).replace("``", "`")
        lines += textwrap.wrap(what, width, initial_indent=f"tformer/{folder}/".ljust(22),
                               subsequent_indent=" " * 22)
        lines += textwrap.wrap("modules: " + ", ".join(names), width,
                               initial_indent=" " * 22, subsequent_indent=" " * 31)
    lines.append("tformer/__main__.py".ljust(22) + "python -m tformer: every command, registered")
    return "\n".join(lines)
