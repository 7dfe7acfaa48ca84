"""tformer.core.timing.interleaved: every function once a round, round after round."""
from tformer.core.timing import interleaved


def test_interleaved_runs_each_function_once_per_round_in_order():
    calls = []
    times = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    assert calls == ["a", "b"] * 3
    assert list(times) == ["a", "b"] and all(len(t) == 3 for t in times.values())
    assert all(0 <= s < 1.0 for t in times.values() for s in t)
