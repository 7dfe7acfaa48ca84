"""tformer.training.step_memory: the count of a step's peak (Fitting in memory), against the peaks it was checked on."""
import json
import os

from tformer.training.step_memory import step_peak_bytes

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "book", "data", "fitting_in_memory.json")


def test_the_prediction_is_within_3_percent_of_every_measured_peak():
    with open(DATA) as f:
        rows = json.load(f)["memory"]["results"]
    assert len(rows) >= 10
    for r in rows:
        C = r["d_model"]
        predicted = step_peak_bytes(r["B"], r["T"], C, r["n_heads"], 4 * C, r["L"],
                                    r["vocab_size"], r["k"])
        assert abs(predicted / r["peak_bytes"] - 1) < 0.03, r


def test_flash_drops_the_t_squared_terms_and_checkpointing_keeps_one_block():
    B, T, C, H, L, V = 2, 1024, 64, 4, 6, 256
    plain, flash = step_peak_bytes(B, T, C, H, 4 * C, L, V), \
        step_peak_bytes(B, T, C, H, 4 * C, L, V, attention="flash")
    assert plain - flash == 4 * (L + 1) * B * H * T * T                   # L blocks' P, and S's
    one = step_peak_bytes(B, T, C, H, 4 * C, L, V, k=1)
    assert one < plain and step_peak_bytes(B, T, C, H, 4 * C, L, V, k=L) > one
