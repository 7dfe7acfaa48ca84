"""``python -m tformer many-processes`` run end to end at toy size, into tmp_path (never book/data).

The command launches its own jobs (``mpiexec -n 2`` and plain processes: an all-reduce timing,
one training speed run each with 1 process, 2 processes and 2 with ZeRO-1, and the loss curves
with 1 and 2 processes), six launches whatever its flags say. Its flags are at their smallest
here; the model sizes, which no flag reaches, are shrunk to one tiny TinyGPT. Skipped only where
no mpiexec exists, as tests/training/test_distributed.py is.
"""
import json
import math
from pathlib import Path

import pytest

from tformer.__main__ import main as cli
from tformer.experiments import many_processes
from tformer.training.mpi import find_mpiexec

TINY = dict(d_model=16, n_heads=2, n_layers=1)
BOOK_FILE = Path(__file__).resolve().parents[2] / "book" / "data" / "many_processes.json"


def _stat(path):
    return (path.stat().st_mtime_ns, path.stat().st_size) if path.exists() else None


@pytest.mark.skipif(find_mpiexec() is None,
                    reason="no mpiexec beside this Python nor on PATH "
                           "(pip install -r requirements.txt installs MPICH's)")
def test_a_toy_run_writes_every_measurement(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(many_processes, "SIZES", {"tiny": TINY})
    monkeypatch.setattr(many_processes, "CURVE", dict(TINY, max_len=16, batch_size=4, steps=2,
                                                      lr=3e-3, warmup=1, seed=0))
    monkeypatch.setenv("HYDRA_LAUNCHER", "fork")
    before = _stat(BOOK_FILE)
    out = tmp_path / "many_processes.json"
    assert cli(["many-processes", "--out", str(out), "--lengths", "1000,10000", "--reps", "1",
                "--speed-steps", "1", "--speed-batch", "2", "--repeats", "1", "--curve-steps", "2",
                "--threads", "1"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert _stat(BOOK_FILE) == before                        # the book's file is untouched
    r = json.loads(out.read_text())
    assert len(r["commit"]) == 40 and r["config"]["curve_steps"] == 2 and r["seconds"] > 0

    ar = r["allreduce"]
    assert ar["processes"] == 2 and ar["lengths"] == [1000, 10000]
    assert len(ar["seconds"]) == 2 and all(0 < t < 60 for t in ar["seconds"])
    assert math.isfinite(ar["fit"]["a_seconds"]) and math.isfinite(ar["fit"]["b_seconds_per_number"])

    speed = r["speed"]["tiny"]
    assert speed["model"] == TINY and set(speed) == {"model", "1", "2", "2-zero1"}
    P = speed["1"]["parameters"]
    for k in ("1", "2", "2-zero1"):
        s = speed[k]
        assert s["parameters"] == P and s["seconds_per_step"] > 0, k
        assert 0 <= s["comm_seconds_per_step"] <= s["seconds_per_step"], k
    assert speed["1"]["comm_seconds_per_step"] == 0.0          # one process: no collective
    assert speed["2"]["comm_seconds_per_step"] > 0.0

    # the same global batch with 1 and 2 processes: the same run, to float32 rounding
    c1, c2 = r["curves"]["1"], r["curves"]["2"]
    assert len(c1["loss"]) == len(c2["loss"]) == 2
    assert abs(c1["loss"][0] - math.log(256)) < 0.5
    assert max(abs(a - b) for a, b in zip(c1["loss"], c2["loss"])) < 1e-5
    assert abs(c1["val_bpb"] - c2["val_bpb"]) < 1e-5 and abs(c1["val_bpb"] - 8.0) < 0.5
