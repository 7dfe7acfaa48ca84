"""Gradient-norm monitoring: the history's norm and clip ratio, and ``--log FILE`` of every run."""
import json
import math

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.__main__ import build_parser
from tformer.__main__ import main as cli
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW
from tformer.training.runlog import format_history, read_history, write_history
from tformer.training.train import clip_ratio, train


def _hist():
    return {"step": [1, 2, 3], "loss": [2.0, 1.5, float("nan")], "lr": [0.1, 0.2, 0.3],
            "grad_norm": [4.0, 0.5, float("nan")], "clip_ratio": [0.25, 1.0, float("nan")],
            "time": [0.1, 0.2, 0.3], "eval": [(2, {"acc": 0.5}), (4, {"acc": 0.75})]}


def test_clip_ratio():
    assert clip_ratio(4.0, 1.0) == 0.25 and clip_ratio(0.5, 1.0) == 1.0
    assert clip_ratio(4.0, None) == 1.0 and math.isnan(clip_ratio(float("nan"), 1.0))


@pytest.mark.parametrize("name", ["h.csv", "h.jsonl", "h.json"])
def test_write_and_read_history(tmp_path, name):
    path = write_history(tmp_path / "sub" / name, _hist())
    rows = read_history(path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["grad_norm"] == 4.0 and rows[0]["clip_ratio"] == 0.25
    assert rows[1]["eval_acc"] == 0.5 and rows[3] == {"step": 4, "eval_acc": 0.75}
    assert rows[2].get("loss") is None                       # NaN: null in JSON, empty in CSV
    assert not [p for p in (tmp_path / "sub").iterdir() if p.name.startswith(".tmp-")]


def test_format_rejects_unknown():
    with pytest.raises(ValueError, match="fmt: expected 'csv' or 'jsonl', got 'xml'"):
        format_history(_hist(), "xml")
    with pytest.raises(TypeError, match="path"):
        write_history(None, _hist())


def test_train_history_records_norm_and_clip_ratio(tmp_path):
    model = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, seed=0)
    opt = AdamW(model, lr=1e-2)
    data = np.random.default_rng(0).integers(0, 256, (4, 9))
    hist = train(model, opt, lambda i: (data[:, :-1], data[:, 1:]),
                 lambda m, b: F.cross_entropy(m.forward(b[0]), b[1]), 5, clip_norm=0.5,
                 log_path=tmp_path / "log.jsonl")
    assert len(hist["clip_ratio"]) == 5
    for n, r in zip(hist["grad_norm"], hist["clip_ratio"]):
        assert r == (1.0 if n <= 0.5 else 0.5 / n)
    rows = read_history(tmp_path / "log.jsonl")
    assert [r["grad_norm"] for r in rows] == hist["grad_norm"]


def test_every_run_command_takes_log():
    parser = build_parser()
    systems = parser._subparsers._group_actions[0].choices["run"]._subparsers._group_actions[0].choices
    assert set(systems) >= {"attention", "transformer2", "encoder", "transformer", "tinygpt"}
    for name, p in systems.items():
        assert any(a.dest == "log" for a in p._actions), name


def test_run_transformer_bucketed_with_log(tmp_path, capsys):
    log = tmp_path / "t.csv"
    status = cli(["run", "transformer", "--steps", "4", "--eval-every", "0", "--target", "0",
                  "--max-len", "6", "--d-model", "16", "--n-heads", "2", "--d-ff", "32",
                  "--eval-size", "20", "--beam-width", "2", "--batching", "bucketed",
                  "--max-tokens", "200", "--gradient-checkpointing", "--attention", "flash",
                  "--checkpoint", str(tmp_path / "t.npz"), "--log", str(log), "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0
    assert "bucketed batches:" in out and "% of the positions padding" in out
    rows = read_history(log)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["grad_norm"] > 0 and 0 < r["clip_ratio"] <= 1 for r in rows)
    meta = json.loads(str(np.load(tmp_path / "t.npz")["meta"]))
    assert meta["config"]["gradient_checkpointing"] is True and meta["config"]["attention"] == "flash"


def test_run_transformer_budget_too_small(tmp_path, capsys):
    """A budget below one padded row is the command's usage error naming the flag (exit 2)."""
    with pytest.raises(SystemExit) as e:
        cli(["run", "transformer", "--steps", "1", "--batching", "bucketed", "--max-tokens", "10",
             "--checkpoint", str(tmp_path / "t.npz"), "--no-progress"])
    assert e.value.code == 2
    assert ("error: --max-tokens: expected at least one row of 2·--max-len + 2 = 18 positions, "
            "got 10") in capsys.readouterr().err
    assert not (tmp_path / "t.npz").exists()


@pytest.mark.parametrize("argv", [
    ["attention", "--steps", "3", "--d-model", "4", "--seq-len", "3", "--batch-size", "2",
     "--eval-batches", "1"],
    ["transformer2", "--steps", "3", "--d-model", "4", "--d-ff", "4", "--seq-len", "3",
     "--batch-size", "2", "--eval-batches", "1"],
    ["encoder", "--steps", "2", "--n-train", "32", "--n-test", "8", "--n-layers", "1", "--d-model",
     "16", "--heads", "2", "--d-ff", "32", "--seq-len", "6", "--no-progress"],
    ["tinygpt", "--steps", "3", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--max-len",
     "16", "--batch-size", "4", "--eval-windows", "2", "--eval-every", "0", "--sample-tokens", "4",
     "--temperatures", "1.0", "--gradient-checkpointing", "--no-progress"],
])
def test_every_run_writes_its_log(argv, tmp_path, capsys):
    log = tmp_path / "h.jsonl"
    extra = [] if argv[0] == "encoder" else ["--checkpoint", str(tmp_path / "c.npz")]
    cli(["run", *argv, *extra, "--log", str(log)])
    rows = read_history(log)
    assert rows and all(math.isfinite(r["grad_norm"]) for r in rows if "grad_norm" in r)
    assert rows[-1]["step"] >= 2
