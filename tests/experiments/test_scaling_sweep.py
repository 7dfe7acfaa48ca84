"""The IsoFLOP sweep (python -m tformer scaling-sweep) at a tiny budget: plan, FLOPs, resume."""
import argparse
import json

import numpy as np
import pytest

from tformer.bench.flops import train_step_flops
from tformer.experiments import scaling_sweep as S
from tformer.runs.flags import UsageError


def parse(*argv):
    p = argparse.ArgumentParser()
    S.add_arguments(p)
    args = p.parse_args(list(argv))
    S.check_args(args)
    return args


def test_flops_per_token_is_the_performance_chapters_count():
    for shape in S.SHAPES:
        cfg = S.model_config(shape, 1024, 64)
        assert S.flops_per_token(shape, 1024, 64) * 12 * 64 == train_step_flops(cfg, 12, 64)
        L, C = shape
        assert S.flops_per_token(shape, 1024, 64) == 6 * S.weights(shape, 1024) + 12 * L * 64 * C


def test_plan_spends_each_budget_within_half_a_step_and_spreads_the_sizes_around_20():
    runs = S.plan([1e12, 1e13], [1024], [0], 5)
    assert len(runs) == 10 and len({r["key"] for r in runs}) == 10
    for r in runs:
        step = r["flops_per_token"] * r["batch_size"] * r["block_size"]
        assert abs(r["flops"] - r["budget"]) <= 0.5 * step + 1e-6 * r["budget"]
    for budget in (1e12, 1e13):
        ratios = [r["tokens"] / r["n_weights"] for r in runs if r["budget"] == budget]
        assert min(ratios) < 2 and max(ratios) > 20 and ratios == sorted(ratios, reverse=True)
    small, large = ([S.SHAPES.index(tuple(r["shape"])) for r in runs if r["budget"] == b]
                    for b in (1e12, 1e13))
    assert large[-1] > small[-1]                   # a larger budget reaches larger models


def test_a_tiny_sweep_writes_its_runs_and_a_rerun_skips_them(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    argv = ["--budgets", "1.2e10", "--sizes", "1", "--shapes", "2x64", "--vocab-sizes", "300",
            "--out", str(out), "--no-progress"]
    assert S.main(parse(*argv)) == 0
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert run["shape"] == [2, 64] and run["vocab_size"] == 300 and run["seed"] == 0
    assert run["steps"] == round(1.2e10 / (run["flops_per_token"] * 12 * 64))
    assert np.isfinite(run["val_nats_per_char"]) and 2.0 < run["val_nats_per_char"] < 6.5
    assert run["seconds"] > 0 and run["cpu_seconds"] > 0 and run["commit"] is not None
    assert data["corpora"]["300"]["yardstick_chars"] == 108_790
    before = out.read_text()
    assert S.main(parse(*argv)) == 0                      # resumed: nothing left to run
    assert "1 runs already in" in capsys.readouterr().out and out.read_text() == before
    with pytest.raises(UsageError, match="another corpora"):
        S.main(parse(*[("320" if a == "300" else a) for a in argv]))   # another tokenizer


def test_an_unreadable_or_unwritable_out_is_a_usage_error(tmp_path):
    with pytest.raises(ValueError, match="--out"):
        parse("--out", str(tmp_path))                                  # a folder
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="--out"):
        S.load_previous(str(bad), {})
