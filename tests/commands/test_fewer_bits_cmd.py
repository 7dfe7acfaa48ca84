"""``python -m tformer fewer-bits`` run end to end at toy size, into tmp_path (never book/data).

Its flags cannot make it small: the model is ``run tinygpt``'s default and the kernel timings
use fixed sizes (about 3 minutes with ``--steps 1``). So the run here keeps every flag at its
smallest and shrinks what the flags do not reach: the model (``run_args`` gets a tiny TinyGPT's
flags first), the kernel-cost shapes, the timing repeats, and PyTorch's side of the kernel costs
(left out, as on a machine without torch; importing torch alone takes seconds).
"""
import json
import math
import sys
from pathlib import Path

from tformer.__main__ import main as cli
from tformer.experiments import fewer_bits

TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--max-len", "16",
        "--batch-size", "4", "--eval-windows", "4", "--eval-every", "2", "--no-progress"]
BOOK_FILE = Path(__file__).resolve().parents[2] / "book" / "data" / "fewer_bits.json"


def _stat(path):
    return (path.stat().st_mtime_ns, path.stat().st_size) if path.exists() else None


def test_a_toy_run_writes_every_measurement(tmp_path, monkeypatch, capsys):
    """One toy run (2 steps per precision, one timing round of one step); its file checked below."""
    run_args, kernel_costs, timer = fewer_bits.run_args, fewer_bits.kernel_costs, fewer_bits._time
    monkeypatch.setattr(fewer_bits, "run_args", lambda argv=(): run_args([*TINY, *argv]))
    monkeypatch.setattr(fewer_bits, "kernel_costs", lambda: kernel_costs(N=64, K=16, M=32))
    monkeypatch.setattr(fewer_bits, "_time", lambda fn, repeat=5: timer(fn, repeat=1))
    monkeypatch.setitem(sys.modules, "torch", None)          # import torch raises ImportError
    before = _stat(BOOK_FILE)
    out = tmp_path / "fewer_bits.json"
    assert cli(["fewer-bits", "--out", str(out), "--steps", "2", "--time-rounds", "1",
                "--time-steps", "1", "--gen-tokens", "2", "--threads", "1"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert _stat(BOOK_FILE) == before                        # the book's file is untouched
    record = json.loads(out.read_text())
    check_configuration_and_commit(record)
    check_each_precision_trains_two_steps_from_chance(record)
    check_memory_counts_match_the_parameters(record)
    check_int8_quantization_is_smaller_and_close(record)


def check_configuration_and_commit(record):
    assert record["config"]["steps"] == 2 and record["config"]["d_model"] == 16
    assert len(record["commit"]) == 40 and int(record["commit"], 16) >= 0
    assert record["threads"]["tformer"] == 1 and record["seconds"] > 0
    assert record["kernels"]["shape"] == [64, 16, 32] and record["kernels"]["torch"] is None
    assert all(t > 0 for t in record["kernels"]["gemm_s"].values())
    assert set(record["kernels"]["gemm_s"]) == {"fp32", "fp16", "bf16"}


def check_each_precision_trains_two_steps_from_chance(record):
    """An untrained byte model: loss ≈ ln 256 nats, ≈ 8 bits per byte, in every precision."""
    runs = record["runs"]
    assert set(runs) == {"fp32", "fp16", "bf16"}
    for p, run in runs.items():
        assert run["history"]["step"] == [1, 2], p
        assert all(abs(l - math.log(256)) < 0.5 for l in run["history"]["loss"]), p
        assert abs(run["val_bpb"] - 8.0) < 0.5 and run["seconds"] > 0, p
        assert run["eval"][-1][0] == 2, p
    for p in ("fp16", "bf16"):                              # low precision: masters, loss scale
        assert len(runs[p]["history"]["loss_scale"]) == 2 and runs[p]["skipped"] == []
        assert abs(runs[p]["val_bpb"] - runs["fp32"]["val_bpb"]) < 0.05
        assert abs(runs[p]["val_bpb_masters_fp32"] - runs["fp32"]["val_bpb"]) < 0.05


def check_memory_counts_match_the_parameters(record):
    """Masters and gradients 4 bytes per parameter, Adam 8, a float16/bfloat16 copy 2 (none in
    fp32); the measured arrays between steps hold at least all of them."""
    mem = record["memory"]
    P = mem["fp32"]["parameters"]
    assert P > 0 and all(m["parameters"] == P for m in mem.values())
    for p, m in mem.items():
        low = 0 if p == "fp32" else 2 * P
        assert (m["masters_bytes"], m["grads_bytes"], m["adam_state_bytes"]) == (4 * P, 4 * P, 8 * P)
        assert m["low_copies_bytes"] == low, p
        assert m["persistent_bytes"] >= 16 * P + low, p
        assert m["step_peak_bytes"] >= m["persistent_bytes"] and m["activations_bytes"] > 0, p
    for p, t in record["step_time"].items():
        assert len(t["rounds_s"]) == 1 and t["median_s"] > 0, p


def check_int8_quantization_is_smaller_and_close(record):
    q = record["quantization"]
    assert q["w8_bytes"] < 0.6 * q["float32_weights_bytes"] < q["training_checkpoint_bytes"]
    for scheme in ("w8", "w8a8"):
        assert abs(q["val_bpb"][scheme] - q["val_bpb"]["fp32"]) < 0.01, scheme
        err = q["logit_error"][scheme]
        assert 0 < err["rms"] < 0.05 * err["rms_logits"], scheme
        assert err["rms"] <= err["max_abs"], scheme
    assert q["gen_tokens"] == 2 and set(q["bytes_per_second"]) == {"fp32", "w8", "w8a8"}
    assert all(v > 0 for v in q["bytes_per_second"].values())
