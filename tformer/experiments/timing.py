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
