"""``python -m tformer ablate``: the configurations, the record of each run, the summary, resuming.

Tiny settings on a small text file: what is tested is the bookkeeping (and that a short run
repeats the first steps of a long one exactly, which chapter 26 relies on), not the results.
"""
import json

import numpy as np
import pytest

from tformer.__main__ import main as cli
from tformer.nn.modern_layers import swiglu_hidden
from tformer.experiments import ablate

TINY = ["--d-model", "16", "--n-heads", "4", "--n-layers", "1", "--max-len", "16", "--batch-size", "4",
        "--steps", "6", "--warmup", "2", "--eval-every", "3", "--eval-windows", "4", "--no-progress"]


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "(", ")", ":", "\n", "    ", "x", "=", "+", "1"]
    path.write_text(" ".join(rng.choice(words, 3000)))
    return str(path)


def config(**kw):
    cfg = dict(d_model=16, n_heads=4, n_layers=1, max_len=16, batch_size=4, steps=6, lr=3e-3,
               high_lr=3e-2, min_lr_ratio=0.1, warmup=2, weight_decay=0.1, clip=1.0, eval_every=3,
               eval_windows=4, n_kv_heads=None, seeds=[0], text=None)
    cfg.update(kw)
    return cfg


def test_configurations_change_one_piece_each_and_modern_all():
    plan = {name: (group, lr, kw) for name, group, lr, kw in ablate.configurations(config(d_model=64))}
    assert list(plan) == ["baseline", "rmsnorm", "rope", "swiglu", "gqa", "tied", "modern", "post-norm",
                          "pre-norm, high lr", "post-norm, high lr"]
    singles = ["rmsnorm", "rope", "swiglu", "gqa", "tied"]
    assert plan["baseline"][2] == {} and plan["swiglu"][2] == dict(mlp="swiglu", d_ff=swiglu_hidden(256))
    assert plan["gqa"][2] == dict(n_kv_heads=2)                           # default H / 2
    assert plan["modern"][2] == {k: v for s in singles for k, v in plan[s][2].items()}
    assert all(plan[n][2] != {} and plan[n][1] == 3e-3 for n in singles + ["modern", "post-norm"])
    assert plan["pre-norm, high lr"][1:] == (3e-2, {})
    assert plan["post-norm, high lr"][1:] == (3e-2, dict(norm_position="post"))


def test_short_run_repeats_the_first_steps_of_the_long_one(text):
    cfg = config(text=text, steps=8)
    data = ablate.load_data(cfg, seed=1)
    full = ablate.train_run(cfg, {"positions": "rope"}, 3e-3, 1, data)
    short = ablate.train_run(cfg, {"positions": "rope"}, 3e-3, 1, data, stop=3)
    assert len(full["train_bpb"]) == 8 and short["train_bpb"] == full["train_bpb"][:3]
    assert short["final_val_bpb"] is None and short["val_curve"] == []
    assert [s for s, _ in full["val_curve"]] == [3, 6, 8] and np.isfinite(full["final_val_bpb"])
    assert full["train_bpb"][-1] < full["train_bpb"][0]                   # it learns


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_divergence_is_recorded_not_raised(text):
    cfg = config(text=text, clip=1e30)
    rec = ablate.train_run(cfg, {}, 1e30, 0, ablate.load_data(cfg, 0))
    assert rec["diverged"].startswith("step ") and rec["final_val_bpb"] is None
    assert ablate.summarize({"baseline": [rec]}, ["baseline"])["baseline"]["diverged"] == 1


def test_cli_writes_the_record_and_resumes(text, tmp_path, capsys):
    out = str(tmp_path / "ablation.json")
    args = ["ablate", "--out", out, "--text", text, "--seeds", "0", "1", "--only", "baseline", "rope",
            "post-norm, high lr", *TINY]
    assert cli(args) == 0
    res = json.load(open(out))
    for key in ("command", "commit", "machine", "python", "numpy", "load_average_start",
                "load_average_end", "started", "finished", "wall_seconds", "corpus_fingerprint"):
        assert key in res, key
    assert res["command"].startswith("python -m tformer ablate")
    assert res["config"]["steps"] == 6 and res["config"]["seeds"] == [0, 1]
    assert set(res["runs"]) == {"baseline", "rope", "post-norm, high lr"}
    for name, rs in res["runs"].items():
        assert [r["seed"] for r in rs] == [0, 1]
        for r in rs:
            assert len(r["train_bpb"]) == 6 and r["diverged"] is None and r["model"]["d_model"] == 16
    assert res["runs"]["post-norm, high lr"][0]["lr"] == 3e-2
    assert res["runs"]["post-norm, high lr"][0]["model"]["norm_position"] == "post"
    assert res["runs"]["rope"][0]["model"]["positions"] == "rope"
    s = res["summary"]["rope"]
    finals = [r["final_val_bpb"] for r in res["runs"]["rope"]]
    base = [r["final_val_bpb"] for r in res["runs"]["baseline"]]
    assert s["n"] == 2 and s["mean"] == pytest.approx(np.mean(finals), rel=1e-12)
    assert s["std"] == pytest.approx(np.std(finals, ddof=1), rel=1e-12)
    assert s["diff_mean"] == pytest.approx(np.mean(np.subtract(finals, base)), rel=1e-9)
    assert res["summary"]["gqa"]["n"] == 0                                 # not run
    out1 = capsys.readouterr().out
    assert "rope" in out1 and "bits/byte" in out1
    assert cli(args + ["--resume"]) == 0                                   # everything kept
    assert "nothing to run" in capsys.readouterr().out
    assert json.load(open(out))["runs"] == res["runs"]
    assert cli(args[:-len(TINY)] + TINY[:-1] + ["--only", "gqa", "--resume"]) == 0   # only gqa runs
    again = json.load(open(out))
    assert again["runs"]["rope"] == res["runs"]["rope"] and len(again["runs"]["gqa"]) == 2
    assert "earlier_sessions" not in res
    assert [e["started"] for e in again["earlier_sessions"]] == [res["started"]]
    assert again["earlier_sessions"][0]["command"] == res["command"]


@pytest.mark.parametrize("flags,match", [(["--only", "alibi"], "--only: unknown configurations"),
                                         (["--steps", "0"], "--steps: expected an integer ≥ 1"),
                                         (["--high-lr", "-1"], "--high-lr: expected a finite number ≥ 0"),
                                         (["--seeds", "1", "1"], "--seeds: expected distinct seeds")])
def test_bad_flags_fail_clearly(text, tmp_path, flags, match, capsys):
    """A usage error of ``python -m tformer ablate`` (exit status 2), before any run (issue 53)."""
    with pytest.raises(SystemExit) as e:
        cli(["ablate", "--out", str(tmp_path / "x.json"), "--text", text, *TINY, *flags])
    assert e.value.code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
