"""Every flag is declared once: the flag strings passed to ``add_argument`` in ``tformer/``,
counted by ast. A flag two commands share is declared in ``tformer/runs/flag_groups.py`` and added
by each command with its own default; a second ``add_argument("--steps", ...)`` fails here."""
import argparse
import ast
import collections
import os
import shutil

import pytest

import tformer
from tformer.runs import flag_groups, flags

ROOT = os.path.dirname(tformer.__file__)

# Names that two commands use for different things: (places, why). Nothing else is declared twice.
ALLOWED = {
    "--target": (3, "decoding: a checkpoint to measure; run encoder: the MSE whose first epoch is "
                    "reported; run transformer: the exact match under which the exit status is 1"),
    "--lengths": (2, "many-processes: all-reduce buffer sizes N, one comma-separated list; "
                     "online-softmax: sequence lengths T"),
    "--sizes": (2, "bench: names of the benchmark's model sizes; scaling-sweep: how many model "
                   "shapes per budget"),
    "--modes": (2, "decoding: greedy or sampling; memory: fixed, bucketed or sorted batches"),
    "--task": (2, "run transformer: reverse or sort symbols; run transformer2: copy the max row "
                  "of U(0, 1) or N(0, 1) inputs"),
}


def declarations(root=ROOT):
    """``({flag: [file:line, ...]}, [add_argument calls whose flags are not string literals])``
    over every ``.py`` file under ``root``."""
    found, hidden = collections.defaultdict(list), []
    for folder, _, names in os.walk(root):
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            where = os.path.relpath(path, root)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "add_argument" and node.args):
                    continue
                names_ = [a for a in node.args if not isinstance(a, ast.Starred)]
                if len(names_) != len(node.args) or not all(
                        isinstance(a, ast.Constant) and isinstance(a.value, str) for a in names_):
                    hidden.append(f"{where}:{node.lineno}")
                    continue
                for a in names_:
                    if a.value.startswith("-"):
                        found[a.value].append(f"{where}:{node.lineno}")
    return found, hidden


def duplicates(found):
    """The flags declared in more places than ``ALLOWED`` says (or allowed but not found so)."""
    return {flag: places for flag, places in found.items()
            if len(places) != ALLOWED.get(flag, (1,))[0]}


def test_every_flag_is_declared_once():
    found, hidden = declarations()
    print(f"\n{len(found)} flags, {sum(map(len, found.values()))} declarations:")
    for flag, places in sorted(found.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {len(places):2d} {flag:22s} {' '.join(places) if len(places) > 1 else ''}".rstrip())
    assert len(found) >= 100                           # the commands were found
    assert hidden == [], f"flags passed to add_argument other than as strings: {hidden}"
    assert duplicates(found) == {}, duplicates(found)
    for flag, (places, _) in ALLOWED.items():
        assert len(found[flag]) == places, (flag, found[flag])


def test_a_planted_duplicate_is_found(tmp_path):
    """The lint fails on a second ``--steps`` (or a flag passed by a variable)."""
    root = tmp_path / "tformer"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns("__pycache__"))
    assert duplicates(declarations(str(root))[0]) == {}
    with open(root / "runs" / "two_layer.py", "a", encoding="utf-8") as f:
        f.write('\n\ndef planted(p):\n    p.add_argument("--steps", type=int, default=1)\n'
                '    flag = "--lr"\n    p.add_argument(flag)\n')
    found, hidden = declarations(str(root))
    assert list(duplicates(found)) == ["--steps"]
    assert len(found["--steps"]) == 2
    assert len(hidden) == 1 and hidden[0].startswith(os.path.join("runs", "two_layer.py") + ":")


def test_a_flag_takes_only_the_ranges_listed_with_it():
    p = argparse.ArgumentParser()
    flag_groups.add_training_flags(p, lr=flag_groups.Flag(1e-3, type=flags.positive_learning_rate),
                                   eval_every=flag_groups.Flag(5, type=flags.positive_int))
    assert p.parse_args([]).lr == pytest.approx(1e-3, abs=0)
    with pytest.raises(TypeError, match="expected one of the flag's ranges"):
        flag_groups.add_training_flags(argparse.ArgumentParser(),
                                       steps=flag_groups.Flag(3, type=flags.nonnegative_int))
    with pytest.raises(ValueError, match="off by default"):
        flag_groups.add_output_flags(argparse.ArgumentParser(), no_progress=True)
