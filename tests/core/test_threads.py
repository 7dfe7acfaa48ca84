"""The default thread count (every available core, shared among an MPI job's local ranks), the
validation of TFORMER_NUM_THREADS and ``--threads`` on every command of ``python -m tformer``."""
import os
import re
import subprocess
import sys

import pytest

from tformer import __main__ as cli
from tformer.core import parallel

NO_MPI = {}                                      # an environment without launcher variables


def test_default_is_every_available_core_divided_among_local_ranks():
    assert parallel.default_num_threads(NO_MPI, cores=2) == 2
    assert parallel.default_num_threads(NO_MPI, cores=16) == 16
    assert parallel.default_num_threads({"MPI_LOCALNRANKS": "2"}, cores=2) == 1          # MPICH
    assert parallel.default_num_threads({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, cores=16) == 4
    assert parallel.default_num_threads({"PMIX_LOCAL_SIZE": "3"}, cores=8) == 2           # ⌊8/3⌋
    assert parallel.default_num_threads({"MPI_LOCALNRANKS": "4"}, cores=2) == 1            # never 0
    for junk in ("", "x", "0", "-2"):                                  # not a count: ignored
        assert parallel.default_num_threads({"MPI_LOCALNRANKS": junk}, cores=2) == 2
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert parallel.available_cores() == expected


def test_the_environment_variable_wins_over_the_default_and_is_validated():
    assert parallel.threads_from_env({"TFORMER_NUM_THREADS": "3"}, cores=2) == 3
    assert parallel.threads_from_env({"TFORMER_NUM_THREADS": " 1 "}, cores=8) == 1
    assert parallel.threads_from_env({"TFORMER_NUM_THREADS": ""}, cores=8) == 8           # empty: unset
    assert parallel.threads_from_env({"TFORMER_NUM_THREADS": "2", "MPI_LOCALNRANKS": "2"}, cores=2) == 2
    for bad in ("0", "-1", "two", "1.5", "2x", "+-3"):
        message = f"TFORMER_NUM_THREADS: expected an integer ≥ 1 (threads per process), got '{bad}'"
        with pytest.raises(ValueError, match=re.escape(message)):
            parallel.threads_from_env({"TFORMER_NUM_THREADS": bad})


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TFORMER_NUM_THREADS", *parallel.LOCAL_RANKS_VARIABLES)}
    return dict(env, **extra)


CODE = ("import tformer.core.parallel as P; from threadpoolctl import threadpool_info; "
        "print(P.get_num_threads(), P.available_cores(), "
        "min(i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'))")


def test_a_fresh_process_without_settings_uses_every_core_and_one_blas_thread_per_call():
    out = subprocess.run([sys.executable, "-c", CODE], env=_env(), capture_output=True, text=True,
                         check=True)
    n, cores, blas = map(int, out.stdout.split())
    assert n == cores
    assert blas == 1 or n == 1                     # with n > 1, BLAS is held at one thread per call
    out = subprocess.run([sys.executable, "-c", CODE], env=_env(MPI_LOCALNRANKS=str(cores)),
                         capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "1"            # as many local ranks as cores: one thread each


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "all"])
def test_a_bad_environment_value_stops_the_command_line_with_one_clear_line(value):
    out = subprocess.run([sys.executable, "-m", "tformer", "generate", "--help"],
                         env=_env(TFORMER_NUM_THREADS=value), capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == (f"python -m tformer: error: TFORMER_NUM_THREADS: expected an "
                                  f"integer ≥ 1 (threads per process), got {value!r}")


def test_every_command_takes_threads():
    leaves = cli._leaves(cli.build_parser())
    names = {p.prog.removeprefix("python -m tformer ") for p in leaves}
    assert {"run tinygpt", "run attention", "generate", "quantize", "fewer-bits"} <= names
    for p in leaves:
        assert "--threads" in p._option_string_actions, p.prog


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "two"])
def test_threads_flag_rejects_what_is_not_a_positive_integer(bad, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["generate", "--threads", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --threads: expected an integer ≥ 1 (threads per process), got {bad!r}" in err


def test_threads_flag_sets_the_count_for_the_command(monkeypatch):
    from tformer.runs import generate_cmd
    seen = []
    monkeypatch.setattr(generate_cmd, "main", lambda args: seen.append(parallel.get_num_threads()))
    monkeypatch.setattr(generate_cmd, "files", lambda args: [])     # no checkpoint to check here
    before = parallel.get_num_threads()
    try:
        assert cli.main(["generate", "--threads", "3"]) == 0
        assert seen == [3]
        parallel.set_num_threads(before)
        assert cli.main(["generate"]) == 0            # no flag: the count is left as it was
        assert seen == [3, before]
    finally:
        parallel.set_num_threads(before)


def test_a_forked_child_starts_its_own_workers():
    """With the default of every core, a pool exists at import; after ``fork`` its threads are gone
    from the child, which must not wait for them forever."""
    import multiprocessing as mp
    before = parallel.get_num_threads()
    parallel.set_num_threads(2)
    try:
        parallel.parallel_for(lambda lo, hi: None, 100)         # the parent's pool is running
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            result = pool.apply_async(_split_in_child)
            assert result.get(timeout=60) == (2, 2)              # both halves ran, in the child
    finally:
        parallel.set_num_threads(before)


def _split_in_child():
    import threading
    seen = set()
    # Each half waits for the other: the caller runs any half no worker claimed, so only
    # a live worker in the child lets both halves meet (dead ones: BrokenBarrierError).
    meet = threading.Barrier(2, timeout=30)

    def half(lo, hi):
        seen.add(threading.get_ident())
        meet.wait()
    parallel.parallel_for(half, 100)
    return parallel.get_num_threads(), len(seen)
