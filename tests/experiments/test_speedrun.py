"""The speedrun's parts (tformer/experiments/speedrun.py): the configurations it builds, the PyTorch
twin of a run, n_s and the verdicts, the pilot's choice of length, and a miniature of the whole
command, resumed."""
import argparse
import json

import numpy as np
import pytest

from tformer.experiments import speedrun as S
from tformer.experiments.shakespeare import RECIPE, build as recipe_build, schedule as recipe_schedule
from tformer.training.muon import MuonAdamW
from tformer.training.optim import AdamW


def test_the_base_is_the_recipe():
    """The speedrun starts from the Shakespeare chapter's recipe: its model, optimizer, data and
    learning rate at every step."""
    model, opt, data = S.build(S.BASE, 0)
    m0, o0, d0 = recipe_build(0)
    for (n, p, _), (n0, p0, _) in zip(model.named_parameters(), m0.named_parameters()):
        assert n == n0 and np.array_equal(p, p0)
    assert isinstance(opt, AdamW) and (opt.lr, opt.weight_decay) == (o0.lr, o0.weight_decay)
    assert np.array_equal(data.batch(7)[0], d0.batch(7)[0])
    lr = S.schedule(S.BASE, S.BASE_STEPS)
    assert all(lr(s) == recipe_schedule(s) for s in (1, 50, 100, 1000, 1999, 2000))


def test_muon_config_and_trapezoid():
    """Muon's configuration steps both optimizers; the trapezoid rises, holds and falls to 0."""
    c = dict(S.BASE, optimizer="muon", schedule="trapezoid", cooldown=0.5, min_lr=0.0)
    _, opt, _ = S.build(c, 0)
    assert isinstance(opt, MuonAdamW) and opt.lr == c["muon_lr"] and opt.adamw.lr == c["lr"]
    lr = S.schedule(c, 1100)                       # warm-up 100, hold to 600, down to 0 at 1100
    assert lr(50) == pytest.approx(0.01) and lr(100) == lr(600) == 0.02
    assert lr(850) == pytest.approx(0.01) and lr(1100) == 0.0


@pytest.mark.torch_parity
@pytest.mark.parametrize("optimizer, rtol", [("adamw", 1e-4), ("muon", 1e-2)])
def test_the_torch_twin_trains_the_same_run(optimizer, rtol):
    """A few steps of the PyTorch twin follow tformer's (float32; torch.optim.Muon orthogonalises
    in bfloat16, hence the looser tolerance for Muon): the side-by-side run is the same run."""
    from tformer.runs.tinygpt import forward_loss
    from tformer.training.train import train
    c = dict(S.BASE, optimizer=optimizer)
    model, opt, data = S.build(c, 3)
    hist = train(model.train(), opt, data.batch, forward_loss, 8, clip_norm=c["clip"],
                 lr_schedule=S.schedule(c, 200), progress_bar=False)
    step, _ = S.torch_trainer(c, 3, 200)
    theirs = [step(i) for i in range(1, 9)]
    np.testing.assert_allclose(theirs, hist["loss"], rtol=rtol)
    assert hist["loss"][-1] < hist["loss"][0] - 0.05          # and it learns


def test_reached_is_the_first_evaluation_at_or_below_the_target():
    r = {"val": [[100, 1.9], [110, 1.76], [120, 1.77], [130, 1.70]]}
    assert S.reached(r, 1.76) == 110 and S.reached(r, 1.7) == 130 and S.reached(r, 1.6) is None


def test_welch_and_the_verdict():
    assert S.welch_less([1, 1, 1], [2, 2, 2]) == 0.0 and S.welch_less([2, 2, 2], [1, 1, 1]) == 1.0
    p = S.welch_less([10.0, 11.0, 12.0], [20.0, 21.0, 23.0])
    assert 0 < p < 0.01
    # against a constant: the one-sample t, t = (11 − 12)/(1/√3), 2 degrees of freedom
    from scipy import stats
    assert S.welch_less([10.0, 11.0, 12.0], [12.0] * 3) == pytest.approx(
        stats.t.cdf(-np.sqrt(3), 2), rel=1e-12)
    inc = S.score({"reached": [100, 100, 100], "kept": True}, 1.0)
    assert inc["times"] == [100.0] * 3
    faster = S.score({"reached": [60, 70, 80], "kept": False}, 1.0, inc)
    assert faster["kept"] and faster["p"] < S.ALPHA
    slower_steps = S.score({"reached": [60, 70, 80], "kept": False}, 2.0, inc)
    assert not slower_steps["kept"]                            # fewer steps, dearer ones
    missed = S.score({"reached": [60, None, 80], "kept": False}, 1.0, inc)
    assert not missed["kept"] and "times" not in missed
    lo, hi = S.t_interval([1.0, 2.0, 3.0])[1:]
    assert hi - lo == pytest.approx(2 * 4.302653 / np.sqrt(3), rel=1e-6)


class FakeRunner:
    def __init__(self, finals):
        self.finals, self.asked = finals, []

    def get(self, jobs):
        self.asked += [j[1] for j in jobs]
        return [{"final": self.finals[j[1]]} for j in jobs]


def test_the_pilot_picks_the_shortest_length_that_ends_below_the_margin():
    goal = 2.0
    good = goal - S.MARGIN - 1e-3
    r = FakeRunner({1000: good, 800: good, 600: good, 400: goal})
    assert S.pilot(r, {}, [1000, 800, 600, 400], goal)[0] == 600 and r.asked == [1000, 800, 600, 400]
    r = FakeRunner({1000: good, 800: goal, 600: good, 400: good})
    assert S.pilot(r, {}, [1000, 800, 600, 400], goal)[0] == 1000 and r.asked == [1000, 800]
    r = FakeRunner({1000: goal, 800: goal})
    assert S.pilot(r, {}, [1000, 800], goal)[0] == 1000


def test_a_miniature_speedrun_runs_and_resumes(tmp_path, monkeypatch):
    """The whole command on a few steps, in this process: every stage is measured, re-timed,
    the PyTorch twin runs the final configuration, and a second call trains nothing again."""
    monkeypatch.setattr(S, "WORKERS", 1)
    monkeypatch.setattr(S, "BASE", dict(S.BASE, warmup=5, n_layers=1, d_model=32, n_heads=2))
    monkeypatch.setattr(S, "BASE_STEPS", 40)
    monkeypatch.setattr(S, "STAGES", S.STAGES[:1])
    monkeypatch.setattr(S, "FRACTIONS", (0.75,))
    monkeypatch.setattr(S, "STEPS_PER_ROUND", 2)
    monkeypatch.setattr(S, "MARGIN", 0.0)
    monkeypatch.setattr(S, "CHECKS", 2)
    monkeypatch.setattr(S, "EVAL_WINDOWS", 4)
    monkeypatch.setattr(S, "val_windows", lambda: S.shakespeare_data(64, 12, 0.1, 0).windows("val", 8))
    monkeypatch.setattr(S, "target", lambda path=None: 3.3)
    calls = []
    real = S.run
    monkeypatch.setattr(S, "run", lambda *a, **k: calls.append(a[1:3]) or real(*a, **k))
    out = tmp_path / "speedrun.json"
    args = argparse.Namespace(out=str(out), seeds=[0, 1], no_progress=True, no_torch=False,
                              rounds=2)
    assert S.main(args) == 0
    d = json.loads(out.read_text())
    assert [e["name"] for e in d["table"]] == ["recipe", "muon"]
    assert set(d["tau"]) == {"recipe", "muon", "torch final"}
    assert len(d["torch"]["runs"]) == 2 and d["table"][0]["reached"] == [40, 40]
    n = len(calls)
    assert n == 2 + 1 + 2                   # the recipe's seeds, a pilot, the stage's seeds
    torch_runs = []
    real_torch = S.torch_run
    monkeypatch.setattr(S, "torch_run", lambda *a, **k: torch_runs.append(a) or real_torch(*a, **k))
    assert S.main(args) == 0 and len(calls) == n and torch_runs == []   # nothing trains again
    # the table keeps the stage's verdict and deciding p; its own rounds' p beside them
    again = json.loads(out.read_text())
    stage = next(e for e in again["stages"] if e["name"] == "muon")
    row = again["table"][1]
    assert row["kept"] == stage["kept"] and row.get("p") == stage.get("p")
    assert ("p_retimed" in row) == ("p" in stage)


def test_bad_seeds_and_a_bad_result_file_are_usage_errors(tmp_path):
    args = argparse.Namespace(out=str(tmp_path / "x.json"), seeds=[0, 0])
    with pytest.raises(ValueError, match="--seeds"):
        S.check_args(args)
    args.seeds = [0, S.PILOT_SEED]
    with pytest.raises(ValueError, match="pilot"):
        S.check_args(args)
    (tmp_path / "x.json").write_text("[1, 2]")
    args.seeds = [0, 1]
    with pytest.raises(ValueError, match="--out"):
        S.check_args(args)
