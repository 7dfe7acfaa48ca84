"""The code a reader reads is the equation: every function a chapter of the first two
parts lists (chapters up to TinyGPT's samples, notebooks numbered up to 15) has at most
``LIMIT`` lines of code besides its docstring, comments and blank lines, and shows none of the
names of a later chapter's features (threads, buffers, low precision, grouped-query attention,
RoPE, causal tiles, replicas, recomputation; the list is ``tools/listing_report.FEATURES``). The
faster versions of these functions live in ``tformer/fast/`` and are listed by the chapters that
teach what makes them faster. A listing whose stored output differs from the code fails too:
the page would show code that is no longer the package's."""
from pathlib import Path

import pytest
from test_listing_report import _tool

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 25
THROUGH = 15


NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.ipynb")
                   if int(p.name.split("_")[0]) <= THROUGH)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_first_parts_listing_is_short_and_shows_no_later_feature(path):
    ch = _tool().chapter(path, limit=LIMIT)
    assert not ch["over_limit"], f"{path.name}: functions over {LIMIT} code lines: {ch['over_limit']}"
    shown = {f: [w for w, _ in hits] for f, hits in ch["features"].items()}
    assert not shown, f"{path.name}: later chapters' features shown: {shown}"
    assert not ch["stale"], f"{path.name}: listing cells {ch['stale']} differ from the code (re-execute)"


def test_the_check_fails_on_a_long_listing_and_a_feature(tmp_path):
    tool = _tool()
    body = "\n".join(f"    y{i} = x + {i}" for i in range(LIMIT + 1))
    code = f"def f(x, out=None):\n    \"\"\"doc.\"\"\"\n{body}\n    return y0\n"
    assert tool.functions_of(code, "f") == [("f", LIMIT + 3)]   # def, the body, return
    assert [h[0] for h in tool.feature_hits(code)] == ["out="]
