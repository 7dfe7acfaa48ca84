"""Nothing that runs is hidden: trace a training step of TinyGPT (its defaults, and with every
option of the modern block), one of the complete Transformer, and the decoding of a few tokens
(``sys.setprofile``), and fail when a function of ``tformer.kernels`` or ``tformer.fast`` that
ran is listed in no chapter or appendix (a ``show_source`` cell names it, its class, or the
function it is nested in).

The few functions that compute nothing of the model (they choose how rows are split across
threads, or check an argument) are exempt, each with its reason."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import tformer
from tformer.nn import functional as F
from tformer.decoding.generate import greedy
from tformer.models.tinygpt import TinyGPT
from tformer.models.transformer import Transformer
from tformer.training.optim import AdamW
from tformer.training.train import train

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import listing_report  # noqa: E402

PACKAGE = Path(tformer.__file__).resolve().parent
TRACED = ("kernels", "fast")

#: Functions that run but compute nothing of the model, with the reason.
EXEMPT = {
    "tformer.fast.decode.no_split": "decides whether the lean decode step applies",
    "tformer.fast._grouped_heads._split_axis": "chooses the axis a kernel splits across threads",
    "tformer.fast._grouped_heads._items": "counts the work items of that axis",
    "tformer.fast._grouped_heads._rows_of": "slices one thread's part of that axis",
    "tformer.fast._grouped_heads.group_size": "H / H_kv, from two shapes",
    "tformer.kernels.rope._check_base": "an argument check",
}


def listed_names(notebooks=ROOT / "notebooks"):
    """Every name a ``show_source`` cell of a chapter or appendix lists."""
    names = set()
    for path in sorted(notebooks.glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                names |= set(listing_report.listed_names("".join(cell["source"])))
    return names


def shown(name, listed):
    """Is ``name`` (``module.qualname``, maybe ``….<locals>.f``) or what holds it listed?"""
    parts = name.split(".<locals>")[0].split(".")
    return any(".".join(parts[:k]) in listed for k in range(len(parts), 1, -1))


def traced(fn):
    """``module.qualname`` of every function of tformer.kernels / tformer.fast that ``fn`` runs."""
    seen = set()
    roots = tuple(str(PACKAGE / d) + "/" for d in TRACED)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(roots):
            code = frame.f_code
            module = Path(code.co_filename).relative_to(PACKAGE).with_suffix("")
            seen.add("tformer." + ".".join(module.parts) + "." + code.co_qualname)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _train_step(model):
    rng = np.random.default_rng(0)
    V = model.config["vocab_size"]
    x, y = rng.integers(0, V, (4, 16)), rng.integers(0, V, (4, 16))
    train(model, AdamW(model), lambda i: (x, y),
          lambda m, b: F.cross_entropy(m.forward(b[0]), b[1]), 1, clip_norm=1.0,
          progress_bar=False)


WORKLOADS = {
    "TinyGPT": lambda: _train_step(TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=16)),
    "TinyGPT, modern block": lambda: _train_step(TinyGPT(
        d_model=32, n_heads=4, n_layers=2, max_len=16, norm="rmsnorm", positions="rope",
        mlp="swiglu", n_kv_heads=2, tie_embeddings=True)),
    "the complete Transformer": lambda: _train_step(Transformer(
        64, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=16, dropout=0.1)),
    "decoding": lambda: greedy(TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=16),
                               np.arange(8)[None], 4),
}


def hidden(fn, listed):
    return sorted(n for n in traced(fn) if n not in EXEMPT and not shown(n, listed))


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_every_function_a_step_runs_is_shown(workload):
    assert hidden(WORKLOADS[workload], listed_names()) == []


def test_exempt_functions_still_exist():
    """An exemption for a function that is gone would hide its successor's name."""
    import importlib
    for name in EXEMPT:
        module, _, qual = name.rpartition(".")
        assert hasattr(importlib.import_module(module), qual), name


def test_a_planted_unshown_function_is_found(monkeypatch):
    """A function in tformer/fast that no chapter lists, put on the path of the step, is named."""
    from tformer.fast import linear
    source = ("def hidden_linear(x, W, b=None, **kw):\n"
              "    return real(x, W, b, **kw)\n")
    scope = {"real": linear.linear_forward}
    exec(compile(source, str(PACKAGE / "fast" / "linear.py"), "exec"), scope)
    monkeypatch.setattr(linear, "linear_forward", scope["hidden_linear"])
    assert hidden(WORKLOADS["TinyGPT"], listed_names()) == ["tformer.fast.linear.hidden_linear"]
