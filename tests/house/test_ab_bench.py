"""tools/ab_bench.py (A/B timing of two trees, issue 52's "no slower"): a --quick run of this tree
against itself gives every workload, finite positive ratios and equal calls per step on both
sides; the interval of the paired ratios has the sign test's coverage. No timing is asserted."""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "ab_bench.py"


def _tool():
    spec = importlib.util.spec_from_file_location("ab_bench", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_of_a_tree_against_itself(tmp_path):
    out = tmp_path / "ab.json"
    res = subprocess.run([sys.executable, str(TOOL), "--a", str(ROOT), "--b", str(ROOT), "--quick",
                          "--out", str(out)], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "paired B/A" in res.stdout and "Python calls per step" in res.stdout, res.stdout
    data = json.loads(out.read_text())
    rec = data["provenance"]
    assert {"command", "machine", "date", "load_average", "trees"} <= set(rec), sorted(rec)
    assert rec["trees"]["A"]["path"] == rec["trees"]["B"]["path"] == os.path.realpath(ROOT)
    assert data["rounds"] == 2 and data["threads"] == [1]
    names = ["train small 1t", "train default 1t", "train wide 1t", "gen B=1 1t", "gen B=8 1t"]
    assert list(data["workloads"]) == names
    for name, w in data["workloads"].items():
        for side in "AB":
            assert len(w[side]["rounds"]) == 2 and all(t > 0 for t in w[side]["rounds"]), (name, w)
            assert math.isfinite(w[side]["iqr_over_median"]) and w[side]["iqr_over_median"] >= 0
        p = w["paired"]
        assert math.isfinite(w["ratio"]) and w["ratio"] > 0, (name, w)
        assert 0 < p["low"] <= p["median"] <= p["high"] < math.inf, (name, p)
        assert abs(p["coverage"] - 0.5) < 1e-12 and w["verdict"] == "too few rounds", (name, w)
        calls = w["calls"]                       # the same tree on both sides: the same calls
        assert calls["A"] == calls["B"] and calls["A"]["all"] >= calls["A"]["package"] > 0, calls


def test_interval_of_the_paired_ratios():
    tool = _tool()
    r = [1.0, 0.9, 1.3, 1.1, 0.95, 1.05, 1.2, 0.98]
    low, high, cov = tool.median_interval(r)          # n = 8: only the extremes reach 95 %
    assert (low, high) == (0.9, 1.3) and abs(cov - (1 - 2 / 2 ** 8)) < 1e-12
    r12 = [1 + i / 100 for i in range(12)]            # n = 12: r_(3) .. r_(10), 1 − 2·79/4096
    low, high, cov = tool.median_interval(r12)
    assert (low, high) == (r12[2], r12[9]) and abs(cov - (1 - 2 * 79 / 4096)) < 1e-12
    s = tool.summary([1.0] * 8, [1.2, 1.1, 1.3, 1.2, 1.25, 1.15, 1.2, 1.2])
    assert s["verdict"] == "B slower" and abs(s["ratio"] - 1.2) < 1e-12
    s = tool.summary([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.0], [1.0] * 8)
    assert s["verdict"] == "within noise" and abs(s["A"]["iqr_over_median"] - 0.025) < 1e-12


def test_a_worker_imports_only_its_tree(tmp_path):
    """A tree whose tformer/ is empty has no TinyGPT: the worker must fail, not borrow the
    modules of the checkout an editable install (pip install -e) points every tformer.* at."""
    (tmp_path / "tformer").mkdir()
    (tmp_path / "tformer" / "__init__.py").write_text("")
    spec = dict(kind="train", model=dict(d_model=16, n_heads=2, n_layers=1), B=2, T=8, warmup=0,
                steps=1, calls=False)
    try:
        _tool().run_worker(str(tmp_path), spec, 1)
    except RuntimeError as e:
        assert "TinyGPT: not found" in str(e), str(e)[-2000:]
    else:
        raise AssertionError("a worker ran on a tree without TinyGPT")
