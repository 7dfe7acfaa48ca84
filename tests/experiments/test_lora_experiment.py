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
    monkeypatch.setattr(E, "DECAY_GRID", (0.0, 0.1))
    monkeypatch.setattr(E, "PILOT", {"steps": 10, "seeds": [100, 101]})
    monkeypatch.setattr(E, "S_GRID", {**E.S_GRID, "method": "lora-attn-r1", "s": (1.0, 4.0)})
    monkeypatch.setattr(E, "TIMED", "lora-attn-r1")
    monkeypatch.setitem(E.SAMPLE, "bytes", 20)
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
    for name, m in r["methods"].items():         # each method's own pick, on its own grid
        pick = r["lr_pick"][name]
        assert len(pick["grid"]) == len(E.LR_GRID[m["kind"]]) * 2
        assert all(len(g["losses"]) == 2 for g in pick["grid"])
        assert (m["lr"], m["weight_decay"]) == (pick["lr"], pick["weight_decay"])
        picked = [g["mean"] for g in pick["grid"]
                  if (g["lr"], g["weight_decay"]) == (m["lr"], m["weight_decay"])]
        assert picked == [min(g["mean"] for g in pick["grid"])]
        assert len(m["sample"].encode()) >= 20 and m["step_parts_seconds"]["backward"] > 0
        assert m["gradient_bytes_needed"] == 4 * m["trainable"] <= m["gradient_bytes_allocated"]
    assert r["lr_pick"]["full"]["lr"] == 1e-3
    assert len(r["scale_sweep"]["grid"]) == 2 * 2
    # the products: the frozen layers' dW are gone, the adapters' thin products added
    macs = {k: m["multiply_adds"] for k, m in r["methods"].items()}
    assert macs["lora-attn-r1"] < macs["full"] == macs["scratch"]
    assert set(r["products_seconds"]) == {"full", "lora-attn-r1"}
    assert r["check"]["lr"] == r["lr_pick"]["lora-attn-r1"]["lr"]
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
