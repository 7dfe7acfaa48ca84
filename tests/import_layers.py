"""The package's layers, bottom to top, and the checker that holds the imports to them.

A module may import from its own layer or from a layer below, never from one above, and no chain
of imports may come back to where it started. Every import counts: at the top of a module and
inside a function (a lazy import is a dependency all the same). ``tests/test_imports.py`` runs
the checker on ``tformer``.

Why some modules sit where they do:
- ``parallel`` (the thread pool) is below the kernels: every kernel splits its rows with it.
- ``scaling.recompute`` (gradient checkpointing) is a stack of blocks that a model builds on its
  keyword, so it sits below the models; ``scaling.batch_threads`` (the batch cut across threads)
  wraps any model from outside and ``train`` uses it, so it sits there too, below training, not
  with the scaling that builds on training (precision, quantize, MPI, ZeRO).
- ``data`` sits above "using a model": a sequence task scores a model by decoding it.
- ``tune`` (DPO and SFT on preference pairs) sits above ``data``: its pairs are rows of
  ``data.pairs``, which samples them from a model.
- The experiments (the commands that write ``book/data/*.json``) and the benchmarks are one
  layer: the bench reruns an experiment's measurement, an experiment borrows the bench's PyTorch
  twin. ``python -m tformer`` (``__main__``) registers every command, so it is the top.
"""
import ast
import fnmatch
import os

# (name, module patterns); fnmatch patterns on dotted module names, bottom layer first.
LAYERS = [
    ("foundation", ["tformer", "tformer._dtypes", "tformer._validate", "tformer.parallel",
                    "tformer.atomic", "tformer.progress", "tformer.rss", "tformer.source",
                    "tformer.gradcheck", "tformer._attention_checks"]),
    ("kernels", ["tformer.kernels", "tformer.kernels.*"]),
    ("fast kernels", ["tformer.fast", "tformer.fast.*"]),
    ("functional", ["tformer.functional"]),
    ("layers", ["tformer.layers"]),
    ("attention and blocks", ["tformer.attention", "tformer.modern_layers", "tformer.blocks",
                              "tformer.lora"]),
    ("how blocks run", ["tformer.scaling", "tformer.scaling.recompute",
                        "tformer.scaling.batch_threads"]),
    ("models", ["tformer.models", "tformer.models.*"]),
    ("training", ["tformer.schedules", "tformer.optim", "tformer.muon", "tformer.runlog",
                  "tformer.checkpoint", "tformer.train", "tformer.lora_file", "tformer.dpo"]),
    ("scaling", ["tformer.scaling.precision", "tformer.scaling.quantize", "tformer.scaling.zero",
                 "tformer.scaling.mpi", "tformer.scaling.step_memory"]),
    ("using a model", ["tformer.kv_cache", "tformer.samplers", "tformer.generate",
                       "tformer.speculative", "tformer.beam", "tformer.bpe",
                       "tformer.bpe_*"]),
    ("data", ["tformer.data", "tformer.data.*"]),
    ("tuning", ["tformer.tune"]),
    ("commands", ["tformer.runs", "tformer.runs.*"]),
    ("experiments and bench", ["tformer.experiments", "tformer.experiments.*", "tformer.bench",
                               "tformer.bench.*"]),
    ("entry point", ["tformer.__main__"]),
]


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
