"""One home per equation (issue 52): softmax, log-softmax, a sequence's log-probability and
cross-entropy's gradient are computed only in ``tformer/kernels/`` (the reference, the equation as
derived) and ``tformer/fast/`` (what runs); every other file calls them there.

Counted by reading the source (``ast``, not a regular expression): a use of an exponential or a
logarithm of NumPy (``np.exp``, ``np.log``, ``np.logaddexp``, ``np.log1p`` …, however NumPy was
imported or renamed) or of SciPy's ``special.logsumexp`` / ``softmax`` / ``log_softmax``, anywhere
in ``tformer/`` outside those two folders, is a place where such an equation could be written again.
``ALLOWED`` names the few that remain, by file and function, each with its reason: statistics of
data and fits to measured losses, no model's distribution. ``math.exp`` / ``math.log`` of one
number (a unit change, a perplexity) are not counted: a softmax needs arrays.

The count is printed; planted uses fail the check, and an allow-list entry no longer needed fails.
"""
import ast
from pathlib import Path

import pytest

import tformer

PACKAGE = Path(tformer.__file__).resolve().parent

#: The folders where the equations live.
HOMES = ("kernels/", "fast/")

#: The calls that would compute a softmax, a log-softmax or a log-probability again.
FORBIDDEN = {f"numpy.{f}" for f in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
                                     "logaddexp", "logaddexp2")} | \
            {f"scipy.special.{f}" for f in ("logsumexp", "softmax", "log_softmax", "expit",
                                             "log_expit")}

#: ``(file, function)``: the uses that remain outside the homes, each with its reason.
ALLOWED = {
    ("data/text.py", "unigram_entropy"): "a byte statistic: −Σ p log₂ p of the text's frequencies",
    ("data/text.py", "unigram_cross_entropy"): "a byte statistic: the context-free baseline, bits",
    ("experiments/long_run.py", "effective_tokens"): "the data-repetition law's decay e^{−R/R*}",
    ("experiments/long_run.py", "predict_plan"): "the fitted law's log residuals (bootstrap)",
    ("experiments/scaling_fit.py", "_lse"): "the Chinchilla fit's log-sum-exp of its three terms",
    ("experiments/scaling_fit.py", "fit"): "the fit runs on ln N, ln D, ln L of measured runs",
    ("experiments/scaling_fit.py", "constants"): "the fitted constants back from their logs",
    ("experiments/scaling_fit.py", "isoflop_minimum"): "a parabola in ln N, its minimum back",
}


def _aliases(tree):
    """Local name -> the dotted module or object it was imported as (``np`` -> ``numpy``,
    ``exp`` -> ``numpy.exp``, ``special`` -> ``scipy.special``), from every import in the file."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names[a.asname] = a.name
                else:                                   # ``import scipy.special`` binds ``scipy``
                    top = a.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node, aliases):
    """``np.exp`` -> ``numpy.exp`` (through the file's imports), or None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _functions(tree):
    """id(node) -> the name of the outermost function (or class) holding it, "" at module level."""
    owner = {}
    for top in tree.body:
        name = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else ""
        for node in ast.walk(top):
            owner[id(node)] = name
    return owner


def uses(root, homes=HOMES):
    """``[(file, line, function, name)]`` of every use of a ``FORBIDDEN`` name outside ``homes``."""
    found = []
    for path in sorted(Path(root).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(homes):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        aliases, owner = _aliases(tree), _functions(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                hits = [f"{node.module}.{a.name}" for a in node.names]    # ``from numpy import exp``
            elif isinstance(node, (ast.Attribute, ast.Name)):
                hits = [_dotted(node, aliases)]
            else:
                continue
            found += [(rel, node.lineno, owner.get(id(node), ""), h) for h in hits if h in FORBIDDEN]
    return found


def outside(root, allowed=ALLOWED):
    return [u for u in uses(root) if (u[0], u[2]) not in allowed]


def test_exp_and_log_are_written_only_in_kernels_and_fast():
    everywhere = uses(PACKAGE)
    left = outside(PACKAGE)
    print(f"np.exp/np.log/logaddexp/logsumexp/softmax outside kernels/ and fast/: {len(left)} "
          f"(allowed: {len(everywhere) - len(left)} uses in {len(ALLOWED)} functions)")
    assert left == [], "compute these in tformer/kernels (reference) and tformer/fast (what " \
                       "runs), or add (file, function) to ALLOWED with a reason: " + repr(left)


def test_the_allow_list_is_still_needed():
    used = {(rel, fn) for rel, _, fn, _ in uses(PACKAGE)}
    assert set(ALLOWED) <= used, f"no longer needed: {sorted(set(ALLOWED) - used)}"


PLANTED = {
    "np_exp.py": "import numpy as np\n\ndef probs(z):\n    e = np.exp(z - z.max())\n    return e / e.sum()\n",
    "renamed.py": "import numpy\nimport numpy as xp\n\ndef f(z):\n    return numpy.log(z), xp.logaddexp(0, z)\n",
    "from_import.py": "from numpy import exp as e\n\ndef f(z):\n    return e(z)\n",
    "scipy_special.py": "import scipy.special\nfrom scipy import special as sp\n\n"
                        "def f(z):\n    return scipy.special.logsumexp(z), sp.softmax(z)\n",
    "out_arg.py": "import numpy as np\n\ndef f(z, out):\n    np.exp(z, out=out)\n    g = np.log1p\n",
}


def test_a_planted_np_exp_and_its_disguises_fail_and_the_homes_do_not(tmp_path):
    (tmp_path / "decoding").mkdir()
    for name, text in PLANTED.items():
        (tmp_path / "decoding" / name).write_text(text)
    for home in ("kernels", "fast"):                     # the homes may write it
        (tmp_path / home).mkdir()
        (tmp_path / home / "softmax.py").write_text(PLANTED["np_exp.py"])
    (tmp_path / "data").mkdir()                          # an allowed function, and one beside it
    (tmp_path / "data" / "text.py").write_text(
        "import numpy as np\n\ndef unigram_entropy(p):\n    return -(p * np.log2(p)).sum()\n\n"
        "def other(z):\n    return np.log2(z)\n")
    (tmp_path / "fine.py").write_text("import math\nimport numpy as np\n\n"
                                      "def f(x):\n    return math.log(2.0) * np.sqrt(x), np.maximum(x, 0)\n")
    found = outside(tmp_path)
    print(f"planted: {len(found)} found")
    assert sorted((rel, line, fn, name) for rel, line, fn, name in found) == [
        ("data/text.py", 7, "other", "numpy.log2"),
        ("decoding/from_import.py", 1, "", "numpy.exp"),
        ("decoding/from_import.py", 4, "f", "numpy.exp"),
        ("decoding/np_exp.py", 4, "probs", "numpy.exp"),
        ("decoding/out_arg.py", 4, "f", "numpy.exp"),
        ("decoding/out_arg.py", 5, "f", "numpy.log1p"),
        ("decoding/renamed.py", 5, "f", "numpy.log"),
        ("decoding/renamed.py", 5, "f", "numpy.logaddexp"),
        ("decoding/scipy_special.py", 5, "f", "scipy.special.logsumexp"),
        ("decoding/scipy_special.py", 5, "f", "scipy.special.softmax"),
    ]
    assert outside(tmp_path, allowed={}) != found         # the allowed entropy is a use too


@pytest.mark.parametrize("caller", ["tformer.decoding.samplers", "tformer.decoding.beam",
                                    "tformer.tuning.dpo", "tformer.experiments.decoding",
                                    "tformer.experiments.preference"])
def test_the_callers_import_their_equations_from_fast(caller):
    """The decoders, DPO and the measurements call the homes in ``tformer.fast`` (what runs), not
    the reference kernels (which are the chapters' equations, not tuned to run)."""
    rel = caller.removeprefix("tformer.").replace(".", "/") + ".py"
    tree = ast.parse((PACKAGE / rel).read_text(encoding="utf-8"))
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    modules |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module for a in n.names}
    assert any(m.startswith("tformer.fast") for m in modules), modules
    assert not any(m.startswith("tformer.kernels") for m in modules), modules


def test_the_layers_have_one_entry_point_to_the_mathematics_the_fast_kernels():
    """No module of ``tformer/nn`` but ``functional`` itself imports ``F`` (``tformer.nn.functional``):
    the layers call ``tformer.fast``; ``F`` is the checked entry point for everyone else."""
    import ast
    from pathlib import Path

    import tformer
    nn = Path(tformer.__file__).resolve().parent / "nn"
    users = []
    for path in sorted(nn.glob("*.py")):
        if path.name == "functional.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (
                    node.module == "tformer.nn.functional"
                    or (node.module == "tformer.nn" and any(a.name == "functional" for a in node.names))):
                users.append(path.name)
            elif isinstance(node, ast.Import) and any(a.name == "tformer.nn.functional" for a in node.names):
                users.append(path.name)
    print(f"layer modules that import F: {len(users)}")
    assert users == [], users
