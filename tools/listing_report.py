"""Measure the code the chapters list (issue 31): how long each ``show_source`` listing is, and
which later-chapter features it shows; with ``--invariants``, how many places check each invariant.

    python tools/listing_report.py [--limit 25] [--through 15] [--json FILE]
    python tools/listing_report.py --invariants [--json FILE]

A listing is re-derived from the names a cell passes to ``show_source``, with tformer.core.source's own
``source_of``, rather than parsed from the stored output: the plain-text output joins the listings
with a blank line, which also occurs inside them, so the boundaries (and the name of each listing)
would be guesses, and the Markdown output needs its links undone. Re-deriving gives each object
exactly as ``show_source`` prints it; the cell's stored text is then compared with the re-derived
text and a chapter whose outputs differ (not re-executed since the code changed) is reported stale.

Counts, per listing (the code as listed, without the ``# tformer/...`` header):
- lines: all lines of the listing;
- code lines: lines holding a Python token that is not a comment, outside docstrings (blank and
  comment-only lines and docstrings excluded; the ``def`` line and decorators count), via ``ast``
  and ``tokenize``. A function's code lines run from its first decorator to its last line, nested
  functions included; a listed class counts each of its methods as a function.
Features are searched in the code only (comments and docstrings removed, string literals kept).
Chapters are named by their files: notebooks 01-07 and 10-15 are the book's first two parts, the
ones issue 31 holds to the limit (``--through 15``).
"""
import argparse
import ast
import io
import json
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tformer.core import source as tsource  # noqa: E402  (the package of this checkout)

#: The later-chapter features of issue 31: a listing in notebooks 01-15 should show none of them.
#: Name -> regular expression searched in each code line (comments and docstrings removed).
#: ``is_low`` is added to the issue's list: the low-precision branches test ``is_low(x.dtype)``
#: and name no float16 in code.
FEATURES = {
    "out=": r"\bout=(?!=)",
    "accumulate": r"\baccumulate\b",
    "parallel": r"\bparallel\b",                         # the module: parallel.run_tasks(...)
    "run_tasks": r"\brun_tasks\b",
    "parallel_for": r"\bparallel_for\b",
    "scratch": r"scratch",
    "float16": r"(?<!b)float16",
    "bfloat16": r"bfloat16",
    "compute_dtype": r"\bcompute_dtype\b",
    "is_low": r"\bis_low\(",                            # the float16/bfloat16 branch's test
    "matmul( (tformer.core.dtypes)": r"(?<![\w.])matmul\(|dtypes\.matmul\b",   # not np.matmul
    "n_kv_heads": r"\bn_kv_heads\b",
    "_grouped": r"_grouped",
    "rope": r"(?i)(?<![a-z])rope(?![a-z])",             # rope, RoPE, apply_rope, rope_cache
    "_TILE": r"\b_TILE\b",
    "is_causal tiles": r"\bis_causal\b|\b_causal_(?:forward|backward)\b|\b_tiles\b",
    "replicas/batch_threads": r"\breplicas\b|\bbatch_threads\b",
    "recompute": r"recompute",
}

#: Invariants and the patterns (searched in tformer/**/*.py, code only) of a line that checks one:
#: its condition, its error message, or a call of the helper that checks it. Hits in one file
#: within PLACE_LINES lines of each other are one place (a condition and its raise). Approximate:
#: a check written in another form is missed, and a helper's callers count as places.
INVARIANTS = {
    "q, k, v have the same rank": [r"\bq\.ndim\s*[!=]=\s*k\.ndim", r"same rank",
                                   r"(?<!def )\bcheck_qkv\("],
    "n_heads divides d_model": [r"%\s*(?:self\.)?n_heads\b", r"divides? (?:d_model|C)\b"],
    "token ids are integer arrays": [r"\bint_array\(\s*\"(?:tokens|prompt|ids|targets|continuat)",
                                     r"expected (?:an )?integer (?:NumPy array|token ids)"],
    "token ids lie in [0, V)": [r"(?<!def )\bindex_range\(", r"\.min\(\) < \w+ or \w+\.max\(\) >=",
                                r"expected values in \["],
    "dlogits has the logits' shape": [r"upstream\(\s*\"dlogits\"", r"\"dlogits: expected shape",
                                      r"getattr\(dlogits, \"shape\""],
    "a backward's dy has its forward output's shape": [r"(?<!def )\bupstream\(",
                                                       r"(?<!def )\b_check_dy\(",
                                                       r"shape_is\(\s*\"d",
                                                       r"\"d\w+: expected shape"],
}
PLACE_LINES = 3
DEFAULT_LIMIT = 25
DEFAULT_THROUGH = 15


def code_mask(code):
    """``{line number (1-based): code text}`` for each code line of ``code``: the line with its
    comment cut off; docstring, comment-only and blank lines are absent."""
    tree = ast.parse(code)
    doc = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None    # not a lambda's
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            doc.update(range(first.lineno, first.end_lineno + 1))
    lines, rows, cut = code.splitlines(), set(), {}
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}
    for tok in tokenize.generate_tokens(io.StringIO(code + "\n").readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0]] = tok.start[1]
        elif tok.type not in skip:
            rows.update(range(tok.start[0], tok.end[0] + 1))
    return {r: lines[r - 1][:cut.get(r)].rstrip() for r in sorted(rows - doc)}


def functions_of(code, qualname):
    """``[(qualified name, code lines)]`` of the functions in a listing: the listed function, or
    each method of a listed class (``qualname``: the listed object's name, ``module.Class``)."""
    mask = code_mask(code)
    node = ast.parse(code).body[0]
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    nodes = [(qualname, node)] if isinstance(node, defs) else \
        [(f"{qualname}.{n.name}", n) for n in node.body if isinstance(n, defs)]
    out = []
    for name, n in nodes:
        start = min([n.lineno] + [d.lineno for d in n.decorator_list])
        out.append((name, sum(start <= r <= n.end_lineno for r in mask)))
    return out


def feature_hits(code, features=None):
    """``[(feature, listing line, code text)]``: each code line of ``code`` where a feature's
    pattern matches (``features``: name -> regex, default ``FEATURES``)."""
    features = FEATURES if features is None else features
    return [(name, r, text) for r, text in code_mask(code).items()
            for name, pattern in features.items() if re.search(pattern, text)]


def listed_names(cell_source):
    """The string arguments of every ``show_source(...)`` call in a code cell, in order."""
    try:
        tree = ast.parse(cell_source)
    except SyntaxError:                                   # IPython magics: not a listing cell
        return []
    names = []
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        if isinstance(node, ast.Call) and getattr(func, "id", getattr(func, "attr", None)) \
                == "show_source":
            names += [(a.lineno, a.col_offset, a.value) for a in node.args
                      if isinstance(a, ast.Constant)]
    return [n for *_, n in sorted(names)]


def first_line(file, qualname):
    """The line in ``file`` (relative to the repository) where ``qualname`` starts (its first
    decorator), or None if it is not found there."""
    try:
        node = ast.parse((ROOT / file).read_text(encoding="utf-8"))
    except OSError:
        return None
    for part in qualname.split("."):
        found = [n for n in getattr(node, "body", []) if getattr(n, "name", None) == part]
        if not found:
            return None
        node = found[-1]
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def listing(name, features=None):
    """One listing re-derived from its dotted name: a dict with name, file, qualname, code, lines,
    code_lines, functions ``[(module.qualname, code lines)]`` and features
    ``[(feature, file:line, text)]``."""
    file, code = tsource.source_of(name)
    qualname = tsource.anchor_of(name)
    start = first_line(file, qualname)
    hits = [(f, f"{file}:{start + r - 1}" if start else f"{file}:+{r}", text)
            for f, r, text in feature_hits(code, features)]
    return {"name": name, "file": file, "qualname": qualname, "code": code,
            "lines": len(code.splitlines()), "code_lines": len(code_mask(code)),
            "functions": functions_of(code, short_module(file) + "." + qualname), "features": hits}


def short_module(file):
    """``'kernels/linear'`` for ``'tformer/kernels/linear.py'``: the prefix of a function's name in
    the report, so that two functions named ``run`` stay apart."""
    return file.removeprefix("tformer/").removesuffix(".py")


def chapter(path, limit=DEFAULT_LIMIT, features=None):
    """The report of one notebook: a dict with file, number, title, listings (see ``listing``,
    without code), cells, largest_cell, lines, code_lines, longest ``(qualname, code lines)``,
    over_limit ``[(qualname, code lines)]``, features ``{feature: [(file:line, text)]}`` and stale
    (indices of listing cells whose stored text differs from the re-derived listings)."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    title, listings, cells, stale = None, [], [], []
    for i, cell in enumerate(nb["cells"]):
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and title is None:
            title = next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("# ")), None)
        names = listed_names(text) if cell["cell_type"] == "code" else []
        if not names:
            continue
        these = [listing(n, features) for n in names]
        stored = "".join("".join(o.get("data", {}).get("text/plain", ""))
                         for o in cell.get("outputs", [])
                         if o.get("output_type") == "execute_result")
        if stored != "\n\n".join(x["code"] for x in these):
            stale.append(i)
        cells.append(sum(x["lines"] for x in these))
        listings += these
    functions = dict(f for x in listings for f in x["functions"])
    found = {}
    for x in listings:
        for f, where, text in x["features"]:
            found.setdefault(f, []).append((where, text))
    return {"file": Path(path).name, "number": int(Path(path).name.split("_")[0]), "title": title,
            "listings": [{k: v for k, v in x.items() if k != "code"} for x in listings],
            "cells": len(cells), "largest_cell": max(cells, default=0),
            "lines": sum(x["lines"] for x in listings),
            "code_lines": sum(x["code_lines"] for x in listings),
            "longest": max(functions.items(), key=lambda kv: kv[1], default=None),
            "over_limit": sorted(((q, n) for q, n in functions.items() if n > limit),
                                 key=lambda kv: -kv[1]),
            "features": found, "stale": stale}


def report(notebooks=ROOT / "notebooks", limit=DEFAULT_LIMIT, features=None):
    """``[chapter(...)]`` for every ``notebooks/*.ipynb``, in file order."""
    return [chapter(p, limit, features) for p in sorted(Path(notebooks).glob("*.ipynb"))]


def invariant_places(package=ROOT / "tformer", invariants=None):
    """``{invariant: [file:line, ...]}``: the places in ``package`` (its .py files, code only)
    that check each invariant (``invariants``: name -> regexes, default ``INVARIANTS``)."""
    invariants = INVARIANTS if invariants is None else invariants
    masks = {p: code_mask(p.read_text(encoding="utf-8"))
             for p in sorted(Path(package).rglob("*.py"))}
    out = {}
    for name, patterns in invariants.items():
        places = []
        for p, mask in masks.items():
            last = None
            for r, text in mask.items():
                if any(re.search(pat, text) for pat in patterns):
                    if last is None or r - last > PLACE_LINES:
                        places.append(f"{p.relative_to(Path(package).parent).as_posix()}:{r}")
                    last = r
        out[name] = places
    return out


def format_report(chapters, limit=DEFAULT_LIMIT, through=DEFAULT_THROUGH):
    """The plain-text report of ``report(...)``: one block per chapter, then the totals."""
    out = []
    for c in chapters:
        longest = f"{c['longest'][0]} ({c['longest'][1]})" if c["longest"] else "-"
        out.append(f"{c['file']}  {c['title']}\n  {len(c['listings'])} listings in {c['cells']} "
                   f"cells (largest {c['largest_cell']} lines): {c['lines']} lines, "
                   f"{c['code_lines']} code lines; longest function {longest}")
        if c["over_limit"]:
            out.append(f"  over {limit} code lines: "
                       + ", ".join(f"{q} {n}" for q, n in c["over_limit"]))
        if c["number"] <= through:
            for f, hits in c["features"].items():
                out.append(f"  feature {f}: " + "; ".join(w for w, _ in hits))
        if c["stale"]:
            out.append(f"  STALE: stored output differs from the package in cells {c['stale']}")
    early = [c for c in chapters if c["number"] <= through]
    over = {q for c in early for q, _ in c["over_limit"]}
    longest = max((c["longest"] + (c["file"],) for c in chapters if c["longest"]),
                  key=lambda t: t[1], default=None)
    out.append(f"\nall chapters: {sum(c['lines'] for c in chapters)} lines, "
               f"{sum(c['code_lines'] for c in chapters)} code lines; longest function "
               f"{longest[0]} ({longest[1]} code lines, {longest[2]})" if longest else "")
    big = max(((x["lines"], x["code_lines"], x["name"], c["file"]) for c in chapters
               for x in c["listings"]), default=None)
    if big:
        out.append(f"longest listing: {big[2]} ({big[0]} lines, {big[1]} code lines, {big[3]})")
    out.append(f"chapters up to {through:02d}: {len(over)} functions over {limit} code lines"
               + (": " + ", ".join(sorted(over)) if over else ""))
    feats = sorted({f for c in early for f in c["features"]})
    out.append(f"chapters up to {through:02d}: features shown: " + (", ".join(feats) or "none"))
    return "\n".join(out)


def format_invariants(places):
    """The plain-text report of ``invariant_places(...)``: a count and the places per invariant."""
    return "\n".join(f"{len(p):3d}  {name}\n       " + " ".join(p) for name, p in places.items())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="code lines per function")
    parser.add_argument("--through", type=int, default=DEFAULT_THROUGH,
                        help="the last chapter checked for later-chapter features")
    parser.add_argument("--feature", action="append", nargs=2, metavar=("NAME", "REGEX"),
                        help="a feature to search instead of the default list (repeatable)")
    parser.add_argument("--notebooks", default=ROOT / "notebooks", type=Path)
    parser.add_argument("--invariants", action="store_true",
                        help="count the invariant checks instead")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    if args.invariants:
        data = invariant_places()
        print(format_invariants(data))
    else:
        features = dict(args.feature) if args.feature else None
        data = report(args.notebooks, args.limit, features)
        print(format_report(data, args.limit, args.through))
    if args.json:
        text = json.dumps(data, indent=1, ensure_ascii=False)
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
