"""A generative test of the command line: invocations drawn from the commands' own flag tables
with hostile values and hostile files (``tests/cli_hostile.py``), each of which must end in exit
status 0 or 2, without a traceback, leave every file it did not declare as its output
byte-identical (mode included), and leave no temporary. Every command is drawn; the
experiments stop before their ``main`` (``cli_hostile.DRY``).

Bounded and deterministic (``derandomize``): tiny models, one or two steps, about 30 ms an
invocation, each in a forked child process under a memory cap (``cli_hostile.MEMORY_CAP`` of
address space) and a time cap (``cli_hostile.TIMEOUT``); the commands are drawn in two parts of
about equal cost, one test each, so that ``pytest -n 2`` runs them side by side. ``TFORMER_HYPOTHESIS_EXAMPLES=2000`` searches harder; ``python tests/cli_hostile.py
N`` surveys N random invocations and lists the distinct problems.
"""
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cli_hostile

EXAMPLES = int(os.environ.get("TFORMER_HYPOTHESIS_EXAMPLES", "500"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return cli_hostile.fixtures(str(tmp_path_factory.mktemp("hostile") / "files"))


def _examples(part):
    """The share of ``EXAMPLES`` drawn from ``cli_hostile.PARTS[part]`` (together, all of them)."""
    return EXAMPLES // 2 + (EXAMPLES % 2 if part == 0 else 0)


@pytest.mark.parametrize("part", [0, 1])
def test_no_invocation_crashes_or_damages_a_file(pristine, part):
    """Each part of the commands in its own test (pytest -n 2 runs them side by side)."""
    @settings(max_examples=_examples(part), deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
              print_blob=False)
    @given(data=st.data())
    def draw(data):
        _one(pristine, data, part)
    draw()


def _one(pristine, data, part):
    argv, outputs = cli_hostile.invocation(lambda seq: data.draw(st.sampled_from(seq)), part)
    with tempfile.TemporaryDirectory() as tmp:
        work = cli_hostile.work(pristine, os.path.join(tmp, "w"))
        found = cli_hostile.problems(argv, outputs, work)
    assert not found, f"{found} for: python -m tformer {' '.join(map(repr, argv))}"


def test_the_fixtures_hold_one_file_of_each_kind(pristine):
    assert sorted(os.listdir(pristine)) == sorted(cli_hostile.FILES)
    assert all(os.stat(os.path.join(pristine, f)).st_mode & 0o777 == 0o644
               for f in cli_hostile.FILES if f != "folder")


def test_the_caps_end_a_run_that_allocates_or_waits_too_long(tmp_path, monkeypatch):
    """An invocation past the memory cap is a MemoryError in the child (a problem the survey
    reports), one past the time cap a ``Hang``; the test process is untouched."""
    import time

    import tformer.__main__

    def hog(argv=None):
        import numpy as np
        np.ones(cli_hostile.MEMORY_CAP // 4)          # twice the cap: beyond any slack the child has
        return 0

    def sleeper(argv=None):
        time.sleep(60)
    monkeypatch.setattr(tformer.__main__, "main", hog)
    code, _, _ = cli_hostile.run(["generate"], str(tmp_path))
    assert isinstance(code, cli_hostile.ChildError) and code.kind == "MemoryError", code
    monkeypatch.setattr(cli_hostile, "TIMEOUT", 1)
    monkeypatch.setattr(tformer.__main__, "main", sleeper)
    t0 = time.perf_counter()
    code, _, _ = cli_hostile.run(["generate"], str(tmp_path))
    assert isinstance(code, cli_hostile.Hang) and time.perf_counter() - t0 < 15


@pytest.mark.parametrize("argv", [["rl", "--out", "new.json"], ["speedrun", "--out", "new.json"],
                                  ["rl", "--out", "new.json", "--quick", "--steps", "2"]])
def test_the_work_folder_lets_every_experiment_reach_its_main(pristine, tmp_path, argv):
    """The files an experiment reads before its ``main`` are in each working folder, so that
    the drawn calls get past ``check_args`` (a well-formed call ends in status 0 at the stub)."""
    work = cli_hostile.work(pristine, str(tmp_path / "w"))
    code, out, err = cli_hostile.run(argv, work, dry=True)
    assert code == 0, (code, out, err)
