"""tformer.training.mpi: p processes under mpiexec train the model one process trains with the global batch.

The MPI tests launch ``mpiexec -n 2`` (MPICH from the pinned ``mpich`` wheel, in .venv/bin) on
tests/mpi_worker.py or on ``python -m tformer run tinygpt``, each bounded by a timeout, so a hang
fails the test instead of the CI run. They skip only when no mpiexec exists.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tformer.training.checkpoint import read_checkpoint, save_checkpoint
from tformer.training.mpi import (DataParallel, RankError, World, check_global_batch, find_mpiexec,
                                 launch, launched_by_mpi, local_slice, shard_bounds)
from tformer.models.tinygpt import TinyGPT
from tformer.models.transformer import Transformer

WORKER = str(Path(__file__).resolve().parents[1] / "mpi_worker.py")
TIMEOUT = 120                      # seconds for one mpiexec job (each takes about 2 s)
needs_mpi = pytest.mark.skipif(find_mpiexec() is None,
                               reason="no mpiexec beside this Python nor on PATH "
                                      "(pip install -r requirements.txt installs MPICH's)")
TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--max-len", "16", "--batch-size", "8",
        "--eval-windows", "4", "--eval-every", "5", "--sample-tokens", "5", "--temperatures", "1",
        "--no-progress"]


def _worker(tmp_path, name, *flags, n=None):
    """Run the worker alone (n=None) or under mpiexec -n n; returns rank 0's saved arrays."""
    out = tmp_path / f"{name}.npz"
    argv = [WORKER, *flags, "--out", str(out)]
    if n is None:
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=TIMEOUT)
    else:
        r = launch(n, argv, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return np.load(out)


def _rel(a, b):
    """‖a − b‖∞ / ‖b‖∞: the parameters' largest difference relative to their largest magnitude."""
    return float(np.abs(a - b).max() / np.abs(b).max())


# ---------------------------------------------------------------- without MPI: a world of one

def test_a_process_not_launched_by_mpi_is_a_world_of_one():
    assert not launched_by_mpi({}) and launched_by_mpi({"PMI_RANK": "0"})
    assert launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "2"})
    w = World(None)
    assert (w.rank, w.size, w.is_root) == (0, 1, True)
    a = np.arange(3.0)
    assert w.allreduce_sum(a) is a and a.tolist() == [0.0, 1.0, 2.0]
    assert w.allreduce_scalar(2.5) == 2.5 and w.allgather_object("x") == ["x"]
    batch = (np.arange(8).reshape(4, 2), np.arange(4))
    assert local_slice(batch, w) is batch
    with pytest.raises(ValueError, match="boom"):
        with w.together():
            raise ValueError("boom")


def test_the_global_batch_splits_into_equal_slices():
    class Two:
        size, rank = 2, 1
    assert check_global_batch(64, Two()) == 32
    with pytest.raises(ValueError, match=r"--batch-size: the global batch must be a positive multiple "
                                         r"of the world size 2, got 63"):
        check_global_batch(63, Two(), "--batch-size")
    x = np.arange(12).reshape(6, 2)
    xs, ys = local_slice((x, x[:, 0]), Two())
    assert xs.tolist() == x[3:].tolist() and ys.tolist() == [6, 8, 10]
    assert shard_bounds(10, 3).tolist() == [0, 4, 7, 10]
    assert shard_bounds(2, 4).tolist() == [0, 1, 2, 2, 2]


def test_data_parallel_needs_flat_buffers_and_the_transformer_has_them():
    m = Transformer(vocab_size=7, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=6)
    P, G = m.flat_buffers()
    assert P.size == m.num_parameters() == m.count_parameters()
    dp = DataParallel(m, World(None))
    assert dp.P is P and (dp.lo, dp.hi) == (0, P.size)
    m._flat = None
    with pytest.raises(ValueError, match="flat parameter and gradient buffers"):
        DataParallel(m, World(None))


def test_zero1_in_a_world_of_one_equals_the_plain_optimizer(tmp_path):
    """The sharded optimizer with one shard: the same steps bit for bit, and a checkpoint in the
    whole-model format that the plain optimizer reads (and the other way round)."""
    a = _worker(tmp_path, "plain", "--dtype", "float32", "--steps", "3")
    b = _worker(tmp_path, "zero", "--dtype", "float32", "--steps", "3", "--zero")
    np.testing.assert_array_equal(a["P"], b["P"])
    # Clipping: ZeRO-1 sums the squares of its shard in one dot product, the plain optimizer one per
    # parameter: the norms (and the clipped steps) agree to rounding.
    a = _worker(tmp_path, "plain_c", "--dtype", "float32", "--steps", "3", "--clip", "0.5")
    b = _worker(tmp_path, "zero_c", "--dtype", "float32", "--steps", "3", "--clip", "0.5", "--zero")
    np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-5)
    assert _rel(b["P"], a["P"]) < 1e-4
    ck = tmp_path / "z.npz"
    _worker(tmp_path, "z3", "--steps", "3", "--zero", "--checkpoint", str(ck), "--checkpoint-every", "3")
    meta, _, opt = read_checkpoint(ck)
    assert meta["step"] == 3 and opt["optimizer"] == "AdamW" and "m.wte.W" in opt and "v.lm_head.b" in opt
    resumed = _worker(tmp_path, "r", "--steps", "6", "--resume", "--checkpoint", str(ck))
    full = _worker(tmp_path, "f", "--steps", "6")
    np.testing.assert_array_equal(resumed["P"], full["P"])


# ---------------------------------------------------------------- 2 processes equal 1

@needs_mpi
@pytest.mark.parametrize("zero", [False, True], ids=["allreduce", "zero1"])
def test_two_processes_train_what_one_trains_float64(tmp_path, zero):
    """Global batch 8 (4 per rank), 2 micro-batches per step, clipping active: after 6 steps the
    parameters agree to 1e-12 relative, and the gradient norms of every step too."""
    flags = ["--dtype", "float64", "--steps", "6", "--accum", "2", "--clip", "0.5"] + (["--zero"] if zero else [])
    one = _worker(tmp_path, "one", *flags)
    two = _worker(tmp_path, "two", *flags, n=2)
    assert _rel(two["P"], one["P"]) < 1e-12
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-12)
    np.testing.assert_allclose(two["grad_norm"], one["grad_norm"], rtol=1e-12)
    assert (one["grad_norm"] > 0.5).any()                        # clipping did act


@needs_mpi
@pytest.mark.parametrize("zero", [False, True], ids=["allreduce", "zero1"])
def test_two_processes_train_what_one_trains_float32(tmp_path, zero):
    """In float32 the two sums of the gradient round differently (one GEMM over 8 rows against two
    over 4, then an add), and Adam's division by √v̂ lets a last-bit difference of a tiny gradient
    move its parameter: after 6 steps at lr 1e-2 the parameters agree to 1e-4 relative
    (measured: about 1.4e-5)."""
    flags = ["--dtype", "float32", "--steps", "6", "--accum", "2", "--clip", "0.5"] + (["--zero"] if zero else [])
    one = _worker(tmp_path, "one", *flags)
    two = _worker(tmp_path, "two", *flags, n=2)
    assert two["P"].dtype == np.float32
    assert _rel(two["P"], one["P"]) < 1e-4
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)


@needs_mpi
def test_zero1_equals_the_allreduce_bit_for_bit_without_clipping(tmp_path):
    """With p = 2 the reduce-scatter adds the same two numbers as the all-reduce, and AdamW's
    update is elementwise: sharding the optimizer changes no bit."""
    a = _worker(tmp_path, "dp", "--dtype", "float32", "--steps", "4", n=2)
    b = _worker(tmp_path, "zero", "--dtype", "float32", "--steps", "4", "--zero", n=2)
    np.testing.assert_array_equal(a["P"], b["P"])


@needs_mpi
def test_a_checkpoint_of_two_processes_resumes_in_one(tmp_path):
    ck = tmp_path / "ck.npz"
    r = launch(2, [WORKER, "--zero", "--steps", "3", "--checkpoint", str(ck), "--checkpoint-every", "3"],
               timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    resumed = _worker(tmp_path, "resumed", "--steps", "6", "--resume", "--checkpoint", str(ck))
    full = _worker(tmp_path, "full", "--steps", "6")
    assert _rel(resumed["P"], full["P"]) < 1e-12


# ---------------------------------------------------------------- failures stop every rank

@needs_mpi
def test_a_rank_that_raises_stops_the_job_instead_of_hanging(tmp_path):
    """Rank 1 raises while rank 0 waits in the all-reduce: the job ends (MPI_Abort), non-zero."""
    t0 = time.perf_counter()
    r = launch(2, [WORKER, "--bad-rank", "1", "--raise-at", "2", "--steps", "4"], timeout=TIMEOUT)
    assert r.returncode != 0
    assert "rank 1 of 2: RuntimeError: injected failure at micro-batch 2" in r.stderr
    assert "aborting the job" in r.stderr
    assert time.perf_counter() - t0 < TIMEOUT


@needs_mpi
def test_a_nan_on_one_rank_stops_every_rank_and_keeps_the_last_checkpoint(tmp_path):
    ck = tmp_path / "nan.npz"
    r = launch(2, [WORKER, "--bad-rank", "1", "--nan-at", "2", "--steps", "5", "--checkpoint", str(ck),
                   "--checkpoint-every", "1"], timeout=TIMEOUT)
    assert r.returncode == 1
    for rank in (0, 1):                                  # the mean loss is NaN on every rank
        assert f"rank {rank} of 2: NonFiniteLossError: step 3: the loss is nan" in r.stderr
    assert read_checkpoint(ck)[0]["step"] == 2


@needs_mpi
def test_cli_two_processes_print_once_and_match_one(tmp_path):
    argv = ["-m", "tformer", "run", "tinygpt", *TINY, "--steps", "10"]
    r1 = subprocess.run([sys.executable, *argv, "--checkpoint", str(tmp_path / "a.npz")],
                        capture_output=True, text=True, timeout=TIMEOUT)
    r2 = launch(2, [*argv, "--checkpoint", str(tmp_path / "b.npz"), "--zero"], timeout=TIMEOUT)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert r2.stdout.count("validation:") == 1                     # rank 0 alone prints
    assert "data parallel: 2 processes, 4 windows of the global batch each" in r2.stdout
    a, b = (read_checkpoint(tmp_path / f)[0]["extra"] for f in ("a.npz", "b.npz"))
    assert b["world_size"] == 2
    assert abs(a["val_bpb"] - b["val_bpb"]) < 1e-3 * a["val_bpb"]


@needs_mpi
def test_cli_bad_input_is_a_clear_error_on_every_rank(tmp_path):
    argv = ["-m", "tformer", "run", "tinygpt", *TINY, "--steps", "2"]
    r = launch(2, [*argv, "--batch-size", "7", "--checkpoint", str(tmp_path / "x.npz")], timeout=TIMEOUT)
    assert r.returncode != 0
    for rank in (0, 1):
        assert (f"rank {rank} of 2: RankError: checking the flags failed on rank 0 of 2: ValueError: "
                f"--batch-size: the global batch must be a positive multiple of the world size 2, "
                f"got 7") in r.stderr
    other = tmp_path / "transformer.npz"
    save_checkpoint(other, Transformer(vocab_size=7, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=6))
    r = launch(2, [*argv, "--resume", "--checkpoint", str(other)], timeout=TIMEOUT)
    assert r.returncode != 0
    for rank in (0, 1):
        assert f"rank {rank} of 2: RankError: loading the checkpoint" in r.stderr
    assert r.stderr.count("was made for another configuration") == 2


# ---------------------------------------------------------------- resume after SIGKILL

def _params(path):
    return read_checkpoint(path)[1]


def test_run_tinygpt_resumes_bit_for_bit_after_sigkill(tmp_path):
    """Kill the run (SIGKILL) once its first checkpoint is on disk, resume it: the final model is
    the uninterrupted run's, bit for bit (data position = the step, the RNG state and AdamW's
    state are in the checkpoint)."""
    argv = [sys.executable, "-m", "tformer", "run", "tinygpt", *TINY, "--d-model", "32",
            "--batch-size", "16", "--steps", "80", "--eval-every", "40", "--checkpoint-every", "4"]
    full = tmp_path / "full.npz"
    r = subprocess.run([*argv, "--checkpoint", str(full)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    cut = tmp_path / "cut.npz"
    proc = subprocess.Popen([*argv, "--checkpoint", str(cut)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + TIMEOUT
        while not cut.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=TIMEOUT)
    step = read_checkpoint(cut)[0]["step"]
    assert step < 80, "the run ended before it could be killed"
    r = subprocess.run([*argv, "--checkpoint", str(cut), "--resume"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert f"resumed from {cut} at step {step}" in r.stdout
    a, b = _params(full), _params(cut)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_run_tinygpt_refuses_a_checkpoint_of_another_model(tmp_path, capsys):
    from tformer.__main__ import main
    other = tmp_path / "t.npz"
    save_checkpoint(other, TinyGPT(d_model=8, n_heads=2, n_layers=1, max_len=16))
    with pytest.raises(SystemExit) as e:                # the usage error, not a traceback
        main(["run", "tinygpt", *TINY, "--steps", "2", "--resume", "--checkpoint", str(other)])
    assert e.value.code == 2 and "another configuration" in capsys.readouterr().err
