"""Hygiene of the committed chapter notebooks (standard library + pytest only).

nbval re-runs each notebook and compares its outputs with the stored ones, but a notebook committed
*without* outputs passes nbval trivially. These tests make sure every notebook was executed top to
bottom in one fresh kernel, stores no error and no machine-specific path, and leaves most of its
outputs for nbval to compare. They also catch the common slip that breaks nbval on a reader's CPU:
a compared cell that prints a number measured by a gradient check, a clock or the memory
allocator (see `measured_prints`). A trained loss printed without a marker cannot be told from a
stable number by reading the code; `make test-nbval-other` catches that one.
"""

import ast
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
MAX_BYTES = 2_000_000
MAX_IGNORED_SHARE = 0.30
MAX_CODE_LINE = 90
MAX_OUTPUT_LINE = 2 * MAX_CODE_LINE
# nbval 0.11 honours a marker only when the comment is exactly the marker (reasons go on the next line)
MARKERS = {"NBVAL_IGNORE_OUTPUT", "NBVAL_RAISES_EXCEPTION", "NBVAL_SKIP", "NBVAL_CHECK_OUTPUT"}
MACHINE_PATH = re.compile(
    r"(/work/|/tmp/|/home/|/root/|/Users/|/usr/local/lib/python|site-packages/|\.venv/)"
)


# Calls whose result depends on the CPU's arithmetic (the worst entry of a finite-difference check)
# or on the machine (clocks, page faults, allocated memory): by dotted name, or by the bare name a
# notebook imports. A function a notebook defines that calls one of them counts as one too.
MEASURING_CALLS = {
    "check_kernel", "check_module", "numerical_grad", "rel_error",
    "time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns", "time.monotonic",
    "time.thread_time", "time.process_time", "timeit.timeit", "timeit.repeat",
    "timeit.default_timer", "perf_counter", "thread_time", "process_time", "default_timer",
    "resource.getrusage", "getrusage", "tracemalloc.get_traced_memory", "get_traced_memory",
    "psutil.Process", "memory_info",
}
GROWING_METHODS = {"append", "extend", "insert", "add", "update", "setdefault"}
# Calls that turn a measured value into a stable one: a count, a type, a truth value.
STABLE_CALLS = {"len", "bool", "isinstance", "type", "all", "any"}
MEASURED_PRINT_HINT = ("print the claim here (`err < 1e-7`) and the number in a cell tagged "
                       "nbval-ignore-output")


def find_notebooks(directory=NOTEBOOK_DIR):
    return sorted(
        p for p in Path(directory).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
    )


IGNORE_TAG = "nbval-ignore-output"
# print("the claim:", True): a literal that repeats an assert, which the reader must skip
LITERAL_PRINT = re.compile(r"print\([^\n]*,\s*(?:True|False)\s*\)")


def ignores_output(cell):
    """Does nbval leave this cell's output out of its comparison: the cell tag (which the book does
    not show) or the comment marker (which it does)?"""
    tags = cell.get("metadata", {}).get("tags", [])
    return IGNORE_TAG in tags or "NBVAL_IGNORE_OUTPUT" in _text(cell.get("source", ""))


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


def _dotted(node):
    """'a.b.c' for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


class _MeasuredPrints(ast.NodeVisitor):
    """Follows measured values through one notebook's cells, in order, and records every place
    where a cell shows one: an argument of print()/display(), or the cell's last expression.

    A value is measured if it comes from a MEASURING_CALLS call, or from an expression that uses a
    measured name; a comparison (`err < 1e-7`) or a STABLE_CALLS call (`len(errs)`) of it is not.
    """

    def __init__(self):
        self.measured = set()          # names bound to measured values, across cells
        self.functions = set()         # names of notebook functions that measure
        self.found = []                # (line, source of the shown expression) in the current cell

    # -- what carries a measured value
    def _source_call(self, node):
        name = _dotted(node.func)
        return name is not None and (name in MEASURING_CALLS or name.split(".")[-1] in MEASURING_CALLS
                                     or name in self.functions)

    def carries(self, node, local=frozenset()):
        if node is None or isinstance(node, (ast.Constant, ast.Lambda)):
            return False
        if isinstance(node, (ast.Compare, ast.BoolOp)) or (
                isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
            return False                                           # a claim: True or False
        if isinstance(node, ast.Name):
            return node.id in self.measured or node.id in local
        if isinstance(node, ast.Call):
            if self._source_call(node):
                return True
            if _dotted(node.func) in STABLE_CALLS:
                return False
            return any(self.carries(n, local) for n in
                       [node.func, *node.args, *(k.value for k in node.keywords)])
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for gen in node.generators:
                if self.carries(gen.iter, local):
                    local = local | {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
            elts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            return any(self.carries(e, local) for e in elts)
        return any(self.carries(child, local) for child in ast.iter_child_nodes(node))

    # -- bindings
    def _bind(self, target, measured):
        if isinstance(target, ast.Name):
            (self.measured.add if measured else self.measured.discard)(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind(element, measured)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, measured)
        elif measured:                                          # d[key] = measured: d is measured
            while isinstance(target, (ast.Subscript, ast.Attribute)):
                target = target.value
            if isinstance(target, ast.Name):
                self.measured.add(target.id)

    def visit_Assign(self, node):
        self.generic_visit(node)
        for target in node.targets:
            self._bind(target, self.carries(node.value))

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        if node.value is not None:
            self._bind(node.target, self.carries(node.value))

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        if self.carries(node.value):
            self._bind(node.target, True)

    def visit_For(self, node):
        self._bind(node.target, self.carries(node.iter))
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        for alias in node.names:
            if f"{node.module}.{alias.name}" in MEASURING_CALLS or alias.name in MEASURING_CALLS:
                self.functions.add(alias.asname or alias.name)    # from time import perf_counter as pc

    def visit_ExceptHandler(self, node):
        if node.name:
            self.measured.discard(node.name)                    # `except E as err`: a new err
        self.generic_visit(node)

    def visit_withitem(self, node):
        if node.optional_vars is not None:
            self._bind(node.optional_vars, self.carries(node.context_expr))
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        if any(isinstance(n, ast.Call) and self._source_call(n) for n in ast.walk(node)):
            self.functions.add(node.name)
        self.generic_visit(node)

    # -- where a value is shown
    def visit_Call(self, node):
        if (isinstance(node.func, ast.Attribute) and node.func.attr in GROWING_METHODS
                and any(self.carries(a) for a in [*node.args, *(k.value for k in node.keywords)])):
            self._bind(node.func.value, True)                   # times.append(measured)
        if _dotted(node.func) in ("print", "display"):
            for arg in node.args:
                if self.carries(arg):
                    self.found.append((arg.lineno, ast.unparse(arg)))
        self.generic_visit(node)

    def cell(self, source):
        """Visit one cell's source; return where it shows a measured value."""
        self.found = []
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            return []
        self.visit(tree)
        last = tree.body[-1].value if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        shown_by_print = isinstance(last, ast.Call) and _dotted(last.func) in ("print", "display")
        if last is not None and not shown_by_print and self.carries(last):     # the cell's value
            self.found.append((last.lineno, ast.unparse(last)))
        return self.found


def measured_prints(sources):
    """For the code cells' sources of one notebook, in order: per cell, the (line, expression)
    pairs where it shows a value measured by a gradient check, a clock or the allocator."""
    tracker = _MeasuredPrints()
    return [tracker.cell(src) for src in sources]


def width_problems(nb):
    """Lines that would not fit a chapter page at a 1280-pixel window.

    The rule: every line of a code cell keeps to ``MAX_CODE_LINE`` (90) characters, which is what
    a code cell of the built book holds at 1280 px without a horizontal scrollbar
    (``_static/tformer.css`` sets the width and the font for it; ``make check-pages`` measures it).
    Stored text output (streams, and results that have no richer form than plain text: a SymPy
    result's LaTeX is what the book shows, not its text/plain) wraps at the page's edge in the book
    instead of scrolling, so its lines may be longer, but at most ``MAX_OUTPUT_LINE`` (2 × 90)
    characters: a line wraps once at most, and a longer printout (a dict, a list of names) is
    printed in lines of its own.
    """
    problems = []
    code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    for i, cell in enumerate(code):
        for n, line in enumerate(_text(cell.get("source", "")).splitlines(), 1):
            if len(line) > MAX_CODE_LINE:
                problems.append(f"code cell {i}, line {n}: {len(line)} characters, over "
                                f"{MAX_CODE_LINE}: {line[:60]!r}...")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = _text(out.get("text", ""))
            elif out.get("output_type") in ("execute_result", "display_data") \
                    and set(out.get("data", {})) == {"text/plain"}:    # shown as plain text
                text = _text(out["data"]["text/plain"])
            else:
                continue
            for line in text.splitlines():
                if len(line) > MAX_OUTPUT_LINE:
                    problems.append(f"code cell {i}: an output line of {len(line)} characters, "
                                    f"over {MAX_OUTPUT_LINE}: {line[:60]!r}...")
    return problems


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
    shown = measured_prints([_text(c.get("source", "")) for c in code])
    for i, cell in enumerate(code):
        src = _text(cell.get("source", ""))
        if LITERAL_PRINT.search(src):
            problems.append(f"code cell {i}: prints a literal True/False after an assert: let the "
                            "assert and the prose carry the claim, or print a stable quantity")
        if "NBVAL_SKIP" in src:
            problems.append(f"code cell {i}: NBVAL_SKIP hides the cell from nbval")
        elif "NBVAL_" in src:
            problems.append(f"code cell {i}: a marker comment the reader sees: use the cell tag "
                            f"{IGNORE_TAG} (or raises-exception) in the cell's metadata instead")
        for line in src.splitlines():
            marker = line.strip().lstrip("#").strip()
            if line.strip().startswith("#") and marker.startswith("NBVAL_") and marker not in MARKERS:
                problems.append(f"code cell {i}: nbval ignores the marker line {line.strip()!r}: "
                                "a marker must be alone on its line (give the reason on the next)")
        outputs = cell.get("outputs", [])
        left_out = ignores_output(cell)
        if outputs:
            with_output += 1
            ignored += left_out
        if outputs and not left_out:
            for line, expr in shown[i]:
                problems.append(f"code cell {i}, line {line}: nbval compares {expr!r}, a value measured "
                                f"by a gradient check, a clock or the allocator, which differs on "
                                f"another CPU: {MEASURED_PRINT_HINT}")
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
                        f"nbval-ignore-output (over {MAX_IGNORED_SHARE:.0%}): nbval checks too little")
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_notebook_lines_fit_the_page(path):
    problems = width_problems(json.loads(path.read_text(encoding="utf-8")))
    assert not problems, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


def test_width_check_flags_a_long_code_line_and_a_long_output_line():
    nb = _good_notebook()
    assert width_problems(nb) == []
    nb["cells"][1]["source"] = "x = " + "1 + " * 22 + "1"                 # 93 characters
    nb["cells"][1]["outputs"] = [_stream("y" * (MAX_OUTPUT_LINE + 1) + "\n")]
    problems = width_problems(nb)
    assert len(problems) == 2
    assert "93 characters, over 90" in problems[0] and "181 characters" in problems[1]
    nb["cells"][1]["source"] = "x = " + "1 + " * 21 + "1"                 # 89 characters: fits
    nb["cells"][1]["outputs"] = [_stream("y" * MAX_OUTPUT_LINE + "\n")]
    assert width_problems(nb) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_notebook_is_valid_nbformat(path):
    """The schema check that JupyterLab and `jupyter trust` apply (e.g. no outputs on a Markdown
    cell): an invalid notebook is reported as an error on every `make lab` start."""
    import nbformat
    nb = nbformat.read(path, as_version=4)
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        pytest.fail(f"{path.relative_to(ROOT)} is not valid nbformat: {e.message}")


def test_nbformat_check_flags_outputs_on_a_markdown_cell():
    import nbformat
    nb = nbformat.from_dict(_good_notebook())
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    nbformat.validate(nb)                                   # valid as written
    nb.cells[0]["outputs"] = []
    with pytest.raises(nbformat.ValidationError):
        nbformat.validate(nb)


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
    (lambda nb: [nb["cells"][i]["metadata"].update(tags=["nbval-ignore-output"]) for i in (2, 4)],
     "nbval-ignore-output (over"),
    (lambda nb: nb["cells"][2].update(source="# NBVAL_IGNORE_OUTPUT\n1"), "use the cell tag"),
    (lambda nb: nb["cells"][2].update(source='assert 1 < 2\nprint("one below two:", True)'),
     "literal True/False"),
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


# --- the measured-value check: it must flag each way a measured number reaches nbval ------------

def _notebook(*sources):
    """A notebook executed top to bottom, each cell with one line of output."""
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        _cell(src, i + 1, [_stream("x\n")]) for i, src in enumerate(sources)]}


@pytest.mark.parametrize("sources", [
    ["err = check_kernel(f, b, [x])\nassert err < 1e-7\nprint(f'max error {err:.1e}')"],
    ["errs = check_module(m, x)", "print(f'worst {max(errs.values()):.1e}')"],     # a later cell
    ["errs = check_module(m, x)\nworst = max(errs, key=errs.get)\nprint(f'worst array: {worst}')"],
    ["err = check_kernel(f, b, [x])\nerr"],                                        # the last value
    ["check_module(m, x)"],
    ["errs = {}\nerrs[k] = check_kernel(f, b, [x])", "errs[k] = 0.0\nprint(errs)"],  # stays measured
    ["from tformer.core.gradcheck import check_kernel as ck\ne = ck(f, b, [x])\nprint('%.1e' % e)"],
    ["t0 = time.perf_counter()\nrun()\nprint(f'{time.perf_counter() - t0:.2f} s')"],
    ["times = []\nfor _ in range(3):\n    times.append(timeit.timeit(run, number=1))\nprint(min(times))"],
    ["def cpu_time(fn):\n    t = time.thread_time()\n    fn()\n    return time.thread_time() - t",
     "ms = {n: cpu_time(fn) * 1e3 for n, fn in fns.items()}",
     "print(', '.join(f'{k} {v:.1f} ms' for k, v in ms.items()))"],
    ["print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)"],
])
def test_checker_flags_a_measured_value_that_nbval_compares(sources):
    problems = notebook_problems(_notebook(*sources))
    assert any("a value measured" in p for p in problems), problems
    marked = [s if i < len(sources) - 1 else f"# NBVAL_IGNORE_OUTPUT\n# (measured)\n{s}"
              for i, s in enumerate(sources)]
    problems = notebook_problems(_notebook(*marked))
    assert not any("a value measured" in p for p in problems), problems


@pytest.mark.parametrize("sources", [
    ["err = check_kernel(f, b, [x])\nassert err < 1e-7\nprint(f'below 1e-7: {err < 1e-7}')"],
    ["errs = check_module(m, x)\nprint(f'{len(errs)} arrays, all below 1e-6: {max(errs.values()) < 1e-6}')"],
    ["err = check_kernel(f, b, [x])", "err = 0.5\nprint(f'{err:.1f}')"],          # rebound
    ["err = check_kernel(f, b, [x])", "try:\n    g()\nexcept ValueError as err:\n    print(err)"],
    ["def cpu(f):\n    t = time.thread_time()\n    f()\n    return time.thread_time() - t",
     "t = [cpu(f) for f in fs]\nax.plot(t, label=f'slope {slope(t):.2f}')\nplt.show()"],  # a figure
    ["loss = train(model)\nprint(f'{loss:.4f}')"],  # a trained loss: left to make test-nbval-other
    ["rng = np.random.default_rng(0)\nx = np.repeat(rng.standard_normal(3), 2)\nprint(x)"],
])
def test_checker_accepts_stable_prints(sources):
    problems = notebook_problems(_notebook(*sources))
    assert not any("a value measured" in p for p in problems), problems


# --- tools/other_arithmetic.py: which arithmetic `make test-nbval-other` forces -------------------

def _other_arithmetic():
    spec = importlib.util.spec_from_file_location("other_arithmetic", ROOT / "tools" / "other_arithmetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("native, forced", [
    ("SapphireRapids", "Haswell"), ("Cooperlake", "Haswell"), ("SkylakeX", "Haswell"),
    ("Haswell", "Sandybridge"), ("Zen", "Sandybridge"), ("Sandybridge", "Nehalem"),
    ("Excavator", "Nehalem"), ("Nehalem", "Core2"), ("Penryn", "Prescott"), ("Prescott", None),
    ("Opteron", None), ("ARMV8", None), ("NeoverseN1", None),
])
def test_other_arithmetic_goes_downward_only(native, forced):
    assert _other_arithmetic().lower_core(native) == forced


# NumPy 2.4's x86-64 dispatch targets on an AVX-512 CPU, on an AVX2 one, and an older NumPy's names
AVX512_TARGETS = ["X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR"]
AVX2_TARGETS = ["X86_V3"]
OLD_TARGETS = ["SSE41", "SSE42", "AVX", "F16C", "FMA3", "AVX2", "AVX512F", "AVX512_SKX"]


@pytest.mark.parametrize("native, dispatched, kept", [
    ("SapphireRapids", AVX512_TARGETS, ["X86_V3"]),
    ("SkylakeX", AVX512_TARGETS, ["X86_V3"]),
    ("SkylakeX", OLD_TARGETS, ["SSE41", "SSE42", "AVX", "F16C", "FMA3", "AVX2"]),
    ("Zen", AVX2_TARGETS, ["X86_V3"]),
    ("Haswell", AVX2_TARGETS, ["X86_V3"]),
    ("Sandybridge", [], []),
    ("Sandybridge", ["SSE41", "SSE42", "AVX"], ["SSE41", "SSE42"]),
])
def test_other_arithmetic_forces_one_encoding(native, dispatched, kept):
    """The forced pair is VEX with VEX or SSE with SSE: never the SSE/AVX transition penalty."""
    tool = _other_arithmetic()
    core = tool.lower_core(native)
    off = tool.disabled_targets(core, dispatched)
    assert [t for t in dispatched if t not in off] == kept
    tool.check_one_encoding(core, kept)                 # raises on a mixed pair


@pytest.mark.parametrize("core, dispatched", [
    ("Sandybridge", []),                     # the old pair on an AVX-512 CPU: AVX BLAS, SSE NumPy
    ("Haswell", ["SSE41", "SSE42"]),
    ("Nehalem", ["X86_V3"]),
    ("Core2", AVX512_TARGETS),
])
def test_other_arithmetic_refuses_mixed_encodings(core, dispatched):
    with pytest.raises(ValueError, match="transition penalty"):
        _other_arithmetic().check_one_encoding(core, dispatched)


def test_other_arithmetic_on_this_machine_is_one_encoding():
    """What `make test-nbval-other` forces here: one encoding, other last bits, not pathological
    (choose() raises otherwise), or a stated reason to skip on a CPU with nothing below it."""
    tool = _other_arithmetic()
    env, reason, brief = tool.choose(dict(os.environ))
    if env is None:
        assert reason and brief is None
        return
    core = env["OPENBLAS_CORETYPE"]
    native = tool.probe({k: v for k, v in os.environ.items() if k not in tool.FORCED_VARS})
    off = env.get("NPY_DISABLE_CPU_FEATURES", "").split()
    tool.check_one_encoding(core, [t for t in native["dispatched"] if t not in off])
    assert tool.core_encoding(core) in brief


def test_other_arithmetic_skips_where_it_cannot_force(monkeypatch):
    tool = _other_arithmetic()
    monkeypatch.setattr(tool.platform, "machine", lambda: "aarch64")
    env, reason, _ = tool.choose({})
    assert env is None and "aarch64" in reason
