"""``python -m tformer memory``: its probes and its training runs, at toy sizes."""
import json

import numpy as np

from tformer.__main__ import main as cli
from tformer.data.sequences import SequenceTask
from tformer.experiments import memory
from tformer.experiments.memory_batching import fit


def test_checkpointing_lowers_the_measured_peak_of_a_step():
    shape = dict(B=2, d_model=32, n_heads=2, vocab_size=256)
    off = memory.measure(64, 3, 0, reps=1, **shape)
    on = memory.measure(64, 3, 1, reps=1, **shape)
    assert on["loss"] == off["loss"] and on["grad_sum"] == off["grad_sum"]
    assert on["peak_bytes"] < 0.8 * off["peak_bytes"]
    assert off["peak_bytes"] > 0 and len(off["seconds"]) == 1


def test_fit_records_padding_throughput_and_norms():
    task = SequenceTask("reverse", 10, 1, 6, seed=0)
    runs = {m: fit(task, m, 10, batch_size=8, eval_size=10, stop=4) for m in ("fixed", "bucketed")}
    for r in runs.values():
        assert r["tokens_per_s"] > 0 and 0 <= r["padding_share"] < 1
        assert len(r["history"]["grad_norm"]) == 4 and 0 <= r["exact_match"] <= 1
    assert runs["bucketed"]["padding_share"] < runs["fixed"]["padding_share"]


def test_memory_command_writes_json_keeping_other_parts(tmp_path, monkeypatch):
    out = tmp_path / "m.json"
    out.write_text(json.dumps({"batching": {"kept": True}}))
    monkeypatch.setattr(memory, "SWEEP", [(32, 2, 0)])

    def quick_part(args):
        return {"config": {}, "results": [memory.measure(32, 2, 1, reps=1, B=1, d_model=16,
                                                         n_heads=2, vocab_size=256)]}
    monkeypatch.setattr(memory, "memory_part", quick_part)
    assert cli(["memory", "--parts", "memory", "--out", str(out), "--reps", "1"]) == 0
    data = json.loads(out.read_text())
    assert data["batching"] == {"kept": True}
    assert data["memory"]["results"][0]["k"] == 1 and data["memory"]["commit"] is not None
    assert np.isfinite(data["memory"]["results"][0]["loss"])


def test_overhead_probe_times_both_kinds_of_step():
    r = memory.probe_overhead(16, 2, reps=2, B=1, d_model=16, n_heads=2, vocab_size=256)
    assert set(r) == {"wall_off", "wall_on", "cpu_off", "cpu_on"}
    assert all(len(v) == 2 and min(v) >= 0 for v in r.values())
