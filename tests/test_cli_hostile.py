"""A generative test of the command line: invocations drawn from the commands' own flag tables
with hostile values and hostile files (``tests/cli_hostile.py``), each of which must end in exit
status 0 or 2, without a traceback, leave every file it did not declare as its output
byte-identical (mode included), and leave no temporary. Every command is drawn; the
experiments stop before their ``main`` (``cli_hostile.DRY``).

Bounded and deterministic (``derandomize``): tiny models, one or two steps, about 30 ms an
invocation. ``TFORMER_HYPOTHESIS_EXAMPLES=2000`` searches harder; ``python tests/cli_hostile.py
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


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          print_blob=False)
@given(data=st.data())
def test_no_invocation_crashes_or_damages_a_file(pristine, data):
    argv, outputs = cli_hostile.invocation(lambda seq: data.draw(st.sampled_from(seq)))
    with tempfile.TemporaryDirectory() as tmp:
        work = cli_hostile.work(pristine, os.path.join(tmp, "w"))
        found = cli_hostile.problems(argv, outputs, work)
    assert not found, f"{found} for: python -m tformer {' '.join(map(repr, argv))}"


def test_the_fixtures_hold_one_file_of_each_kind(pristine):
    assert sorted(os.listdir(pristine)) == sorted(cli_hostile.FILES)
    assert all(os.stat(os.path.join(pristine, f)).st_mode & 0o777 == 0o644
               for f in cli_hostile.FILES if f != "folder")
