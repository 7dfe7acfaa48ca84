"""``python -m tformer lora``, shrunk: the file it writes holds what the chapter reads."""
import json

import numpy as np
import pytest

from tformer.__main__ import main as cli
from tformer.experiments import lora_experiment as E
from tformer.experiments import lora_train as L


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setitem(L.BASE, "steps", 20)
    monkeypatch.setitem(L.BASE, "warmup", 5)
    monkeypatch.setattr(L, "EVAL_WINDOWS", 16)
    monkeypatch.setattr(E, "RANKS", (1,))
    monkeypatch.setattr(E, "LR_GRID", {"full": (1e-3,), "lora": (1e-2, 3e-2), "scratch": (3e-3,)})
    monkeypatch.setattr(E, "PILOT", {**E.PILOT, "steps": 10})
    monkeypatch.setattr(E, "CHECK", {**E.CHECK, "base_steps": 5, "steps": 20,
                                     "method": "lora-attn-r1"})


def test_the_file_holds_what_the_chapter_reads(small, tmp_path):
    out = tmp_path / "lora.json"
    assert cli(["lora", "--out", str(out), "--steps", "20", "--seeds", "1", "2",
                "--time-rounds", "3", "--threads", "1"]) == 0
    r = json.loads(out.read_text())
    assert set(r["methods"]) == {"full", "lora-attn-r1", "lora-all-r1", "scratch"}
    for name, m in r["methods"].items():
        assert len(m["runs"]) == 2 and m["val_bpb_min"] <= m["val_bpb_mean"] <= m["val_bpb_max"]
        assert m["optimizer_state_bytes"] == 8 * m["trainable"] and m["step_seconds"] > 0
    assert r["methods"]["lora-attn-r1"]["file_bytes"] < r["methods"]["full"]["file_bytes"] / 10
    assert r["lr_pick"]["full"]["lr"] == 1e-3 and r["lr_pick"]["lora"]["lr"] in (1e-2, 3e-2)
    assert len(r["check"]["losses"]) == 20 and len(r["check"]["base_losses"]) == 5
    # the short configuration starts with the base's first steps
    assert np.allclose(r["check"]["base_losses"], r["base"]["losses"][:5], rtol=0, atol=1e-5)
    for layer in E.SVD_LAYERS:
        assert len(r["delta_w"][layer]["singular_values"]) == min(r["delta_w"][layer]["shape"])
    assert set(r["truncation"]["val_bpb"]) == {"1", "2", "4", "8", "16"}
    assert set(r["inference"]) == {"base", "lora-unmerged", "lora-merged"}
    assert r["provenance"]["command"].startswith("python -m tformer lora")


@pytest.mark.parametrize("flags, message", [
    (["--steps", "5"], "--steps: expected at least 20"),
    (["--seeds", "1"], "--seeds: expected at least two different seeds"),
])
def test_bad_flags(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["lora", *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err
