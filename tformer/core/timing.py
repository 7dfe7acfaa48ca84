"""Timing several things fairly on a shared machine: in interleaved rounds.

A busy machine's speed drifts over minutes; timing A ten times and then B ten times would
charge the drift to one of them. ``interleaved`` runs every function once per round, round after
round, so each sees the same conditions, and returns every time; the callers take the median.
"""
import time


def interleaved(fns, rounds):
    """``{name: [seconds of each round]}``: every ``fns[name]()`` once per round, in order, for
    ``rounds`` rounds, timed by the wall clock."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times


def best_seconds(fn, repeat=5):
    """The least wall seconds of ``repeat`` calls of ``fn()``, after one call not timed (it pays for
    first-touch allocations and lazy set-up). The least, not the mean: other work on the machine
    only ever adds time."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best
