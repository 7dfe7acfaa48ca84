"""Make a notebook's MyST read the same in JupyterLab as in the built book.

1. ```{literalinclude}``` blocks become code cells that show the same source.

JupyterLab (jupyterlab-myst) cannot read files, so a ``{literalinclude}`` block renders as nothing
in the lab, while the built book shows the code. This rewrites each run of such blocks into a code
cell ``show_source("tformer.module.object", ...)`` (tformer/core/source.py), whose output is the same
code in both readers and is compared by nbval. The Markdown around a block stays where it was, split
into the cells before and after it. Only ``:pyobject:`` is understood; a block with any other option
stops the conversion with an error naming it.

2. A ``{doc}`` reference without a title, which the lab shows as its bare path, gets the title the
book would show (the target's first heading): {doc}`14_tinygpt` -> {doc}`TinyGPT ... <14_tinygpt>`.

    python tools/source_cells.py notebooks/12_encoder.ipynb [...]
    make execute NB="notebooks/12_encoder.ipynb ..."     # the new cells need their outputs

Run it once per notebook; a notebook with no block is left untouched.
"""
import re
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell

BLOCK = re.compile(r"^```+\{literalinclude\}[ \t]+(?P<path>\S+)[ \t]*\n"
                   r"(?P<options>(?::[^\n]*\n)*)```+[ \t]*$", re.M)
OPTION = re.compile(r"^:(?P<key>[\w-]+):[ \t]*(?P<value>.*)$")
IMPORT = "from tformer.core.source import show_source"
MAX_LINE = 90
DOC_REF = re.compile(r"\{doc\}`(?P<target>[^`<>]+)`")


def title_of(target, where):
    """The first '# ' heading of the page {doc}`target` names (relative to the notebook)."""
    for suffix in (".ipynb", ".md"):
        path = where.parent / (target + suffix)
        if path.exists():
            text = (path.read_text(encoding="utf-8") if suffix == ".md" else
                    "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                              if c.cell_type == "markdown"))
            m = re.search(r"^# (.+)$", text, re.M)
            if m is None:
                raise SystemExit(f"{where}: {path} has no '# ' heading to title {{doc}}`{target}`")
            return m[1].strip()
    raise SystemExit(f"{where}: {{doc}}`{target}` names no .ipynb or .md page")


def titled_doc_refs(text, where):
    return DOC_REF.sub(lambda m: f"{{doc}}`{title_of(m['target'].strip(), where)} <{m['target']}>`",
                       text)


def dotted_name(path, options, where):
    """'../tformer/kernels/softmax.py' + ':pyobject: softmax_forward' -> a dotted name."""
    opts = {}
    for line in options.splitlines():
        m = OPTION.match(line)
        if m is None:
            raise SystemExit(f"{where}: cannot read the option line {line!r}")
        opts[m["key"]] = m["value"].strip()
    if set(opts) != {"pyobject"}:
        raise SystemExit(f"{where}: only :pyobject: can be converted, got options {sorted(opts)} "
                         f"in the block for {path}")
    parts = Path(path).with_suffix("").parts
    if "tformer" not in parts or Path(path).suffix != ".py":
        raise SystemExit(f"{where}: expected a .py file inside tformer/, got {path}")
    module = list(parts[parts.index("tformer"):])
    if module[-1] == "__init__":
        module.pop()
    return ".".join(module + [opts["pyobject"]])


def code_source(names, first):
    call = "show_source(" + ", ".join(f'"{n}"' for n in names) + ")"
    if len(call) > MAX_LINE:
        call = "show_source(\n" + "".join(f'    "{n}",\n' for n in names) + ")"
    return f"{IMPORT}\n{call}" if first else call


def split_cell(cell, where, state):
    """The cells that replace one Markdown cell: Markdown and show_source cells, in order."""
    text = cell.source
    pieces, names, pos = [], [], 0
    for m in BLOCK.finditer(text):
        between = text[pos:m.start()]
        if between.strip() and names:
            pieces.append(("code", names))
            names = []
        if between.strip():
            pieces.append(("markdown", between.strip("\n")))
        names.append(dotted_name(m["path"], m["options"], where))
        pos = m.end()
    if not names and not pieces:
        return [cell]
    pieces.append(("code", names))
    if text[pos:].strip():
        pieces.append(("markdown", text[pos:].strip("\n")))
    cells, base = [], cell.get("id", "cell")
    for k, (kind, value) in enumerate(pieces):
        new_id = base if k == 0 else f"{base}-{k}"[:64]
        if kind == "markdown":
            cells.append(new_markdown_cell(value, id=new_id, metadata=cell.metadata if k == 0 else {}))
        else:
            cells.append(new_code_cell(code_source(value, first=not state["imported"]), id=new_id))
            state["imported"] = True
    return cells


def convert(path):
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    state = {"imported": any(IMPORT in c.source for c in nb.cells if c.cell_type == "code")}
    cells, count, titled = [], 0, 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            cells.append(cell)
            continue
        new_source = titled_doc_refs(cell.source, path)
        titled += new_source != cell.source
        cell.source = new_source
        new = split_cell(cell, f"{path} cell {i}", state)
        count += sum(c.cell_type == "code" for c in new)
        cells.extend(new)
    if count or titled:
        nb.cells = cells
        tmp = path.with_suffix(".ipynb.tmp")
        nbformat.write(nb, tmp)
        tmp.replace(path)
    if BLOCK.search("".join(c.source for c in nb.cells if c.cell_type == "markdown")):
        raise SystemExit(f"{path}: a literalinclude block is left")
    print(f"{path}: {count} show_source cell(s), {titled} cell(s) with titled {{doc}} references")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for name in sys.argv[1:]:
        convert(name)
