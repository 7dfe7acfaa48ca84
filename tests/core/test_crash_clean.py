"""Crash-clean checkpoints: a run SIGKILLed at random moments and resumed each time leaves no
temporary file and ends with the same checkpoint, array for array and bit for bit, as a run that
was never interrupted (``tformer.core.atomic``, ``--resume``)."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tformer.core.atomic import _host
from tformer.training.checkpoint import read_checkpoint

KILLS = 30
ENV = dict(os.environ, TFORMER_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", TFORMER_PROGRESS="0",
           PYTHONHASHSEED="0")
# Small, fast configurations that write their checkpoint at every step, so that a good share of
# the random kills land inside a write.
SYSTEMS = {
    "tinygpt": ["--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--max-len", "16",
                "--batch-size", "8", "--steps", "60", "--warmup", "5", "--eval-every", "0",
                "--eval-windows", "4", "--sample-tokens", "4", "--temperatures", "1.0"],
    "transformer": ["--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64",
                    "--max-len", "4", "--batch-size", "16", "--steps", "60", "--warmup", "5",
                    "--eval-every", "0", "--eval-size", "8", "--beam-width", "2",
                    "--target", "0"],
}


def _command(system, checkpoint):
    return [sys.executable, "-m", "tformer", "run", system, *SYSTEMS[system], "--resume",
            "--checkpoint-every", "1", "--no-progress", "--checkpoint", str(checkpoint)]


def _run(system, checkpoint, cwd):
    done = subprocess.run(_command(system, checkpoint), cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _state(path):
    """Everything a resumed run must reproduce: arrays, step, config, RNG and precision state."""
    meta, model, optim = read_checkpoint(path)
    kept = {k: meta.get(k) for k in ("step", "config", "optim_scalars", "rng_state", "precision")}
    return kept, model, optim


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_sigkill_at_random_moments_leaves_no_temporary_and_the_same_checkpoint(system, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir(), killed.mkdir()
    t0 = time.perf_counter()
    _run(system, straight / "ck.npz", straight)
    whole = time.perf_counter() - t0
    # A temporary of a writer that is gone (a process that has ended) is there from the start:
    # the clean-up is exercised even if no kill below lands inside a write.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (killed / f".tmp-ck.npz~{_host()}~{gone}~x1y2z3.npz").write_bytes(b"half")
    rng = np.random.default_rng(30)
    left_a_temporary = 0
    for delay in rng.uniform(0.05, whole, size=KILLS):
        proc = subprocess.Popen(_command(system, killed / "ck.npz"), cwd=killed, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        left_a_temporary += any(n.startswith(".tmp-") for n in os.listdir(killed))
    _run(system, killed / "ck.npz", killed)
    assert os.listdir(killed) == ["ck.npz"], os.listdir(killed)         # no temporary survives
    assert os.listdir(straight) == ["ck.npz"]
    (meta_a, model_a, optim_a), (meta_b, model_b, optim_b) = _state(straight / "ck.npz"), \
        _state(killed / "ck.npz")
    assert meta_a == meta_b
    assert model_a.keys() == model_b.keys() and optim_a.keys() == optim_b.keys()
    for k in model_a:
        assert np.array_equal(model_a[k], model_b[k]), k                 # bit for bit: tolerance 0
    for k in optim_a:
        assert np.array_equal(np.asarray(optim_a[k]), np.asarray(optim_b[k])), k
    print(f"{system}: {left_a_temporary} of {KILLS} kills left a temporary behind; "
          f"an uninterrupted run takes {whole:.2f} s")
