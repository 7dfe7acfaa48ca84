"""Data parallelism over MPI: p processes, one slice of the global batch each, one mean gradient.

Rank r of p computes the gradient g_r of the mean loss over its B/p rows of the global batch of B;
the mean over the B rows is the mean of the p slice means, so the gradient of the global batch is

    g = (1/p) Σ_r g_r                                   (one in-place Allreduce of the flat buffer)

and every rank, starting from the same parameters (broadcast from rank 0) and applying the same
update to the same g, keeps the same parameters: the run equals one process with batch B, up to
the rounding of the sum. ZeRO stage 1 (``zero=True``) splits the optimizer's state instead of
replicating it: a Reduce-scatter leaves rank r the mean of its shard of g (the same traffic as
half an all-reduce), rank r updates only its shard of θ, m and v, and an Allgather puts the
shards of θ back together on every rank (the other half); its optimizer is
``tformer.training.zero.ShardedOptimizer``.

Without ``mpiexec`` (or without mpi4py) the world has one process and nothing here communicates:
``import tformer`` never needs MPI, and single-process runs take exactly the path they always took.
"""
import contextlib
import math
import os
import sys
import time
import traceback

import numpy as np

from tformer.training.checkpoint import read_checkpoint, save_checkpoint
from tformer.training.zero import ShardedOptimizer

# Set by the launchers in each process they start: MPICH/Hydra and Intel MPI (PMI_*), Open MPI
# (OMPI_*), PMIx launchers and Slurm's srun (PMIX_*). Without one, the process was not launched
# by MPI and is a world of one.
LAUNCH_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def launched_by_mpi(environ=None):
    """True when a launcher set one of ``LAUNCH_VARIABLES`` for this process."""
    environ = os.environ if environ is None else environ
    return any(v in environ for v in LAUNCH_VARIABLES)


class RankError(RuntimeError):
    """An error that every rank raised together (see ``World.together``): each exits on its own."""


class World:
    """The processes of one run: ``rank`` in ``[0, size)``; ``comm`` is None for a world of one."""

    def __init__(self, comm=None):
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1

    @property
    def is_root(self):
        """True on rank 0, the rank that prints, shows progress bars and writes files."""
        return self.rank == 0

    def __repr__(self):
        return f"World(rank={self.rank}, size={self.size})"

    # -- collectives (each is a no-op in a world of one) ---------------------------------------

    def bcast(self, array, root=0):
        """Overwrite ``array`` (contiguous) on every rank with root's values, in place."""
        if self.size > 1:
            self.comm.Bcast(array, root=root)
        return array

    def allreduce_sum(self, array):
        """array ← Σ_r array_r on every rank, in place (contiguous array)."""
        if self.size > 1:
            from mpi4py import MPI
            self.comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        return array

    def allreduce_scalar(self, x):
        """Σ_r x_r as a Python float (float64 on the wire)."""
        buf = np.array([x], dtype=np.float64)
        return float(self.allreduce_sum(buf)[0])

    def allgather_object(self, obj):
        """``[obj_0, ..., obj_{p-1}]`` on every rank (pickled: small objects only)."""
        return self.comm.allgather(obj) if self.size > 1 else [obj]

    def barrier(self):
        if self.size > 1:
            self.comm.Barrier()

    def abort(self, code=1):
        """End every process of the job (MPI_Abort); in a world of one, exit this process."""
        if self.size > 1:
            self.comm.Abort(code)
        sys.exit(code)

    # -- errors -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def together(self, what="setup"):
        """Run a block that may fail on some ranks only (a check of the flags, reading a checkpoint),
        then agree: if any rank failed, *every* rank raises ``RankError`` with the first failing
        rank's message, so that all exit with an error and none waits in a collective for a rank
        that is gone. The block must not communicate. In a world of one, the error itself."""
        error = None
        try:
            yield
        except Exception as e:                     # noqa: BLE001 (every error is passed on)
            if self.size == 1:
                raise
            error = e
        messages = self.allgather_object(None if error is None else f"{type(error).__name__}: {error}")
        failed = [(r, m) for r, m in enumerate(messages) if m is not None]
        if failed:
            r, m = failed[0]
            where = f" on rank {r} of {self.size}" if self.size > 1 else ""
            raise RankError(f"{what} failed{where}: {m}") from error


_WORLD = None


def get_world():
    """The run's ``World``: MPI's COMM_WORLD when launched by ``mpiexec``, else a world of one.

    mpi4py is imported only when a launcher started this process; if it is missing then, the error
    says how to install it (rather than running p copies of a single-process job).
    """
    global _WORLD
    if _WORLD is None:
        if launched_by_mpi():
            try:
                from mpi4py import MPI
            except ImportError as e:
                raise ImportError("this process was started by an MPI launcher, but mpi4py is not "
                                  "installed: pip install -r requirements.txt") from e
            _WORLD = World(MPI.COMM_WORLD)
        else:
            _WORLD = World(None)
    return _WORLD


ABORT_GRACE_S = 0.5   # seconds between a rank's error message and MPI_Abort (run_command)


def run_command(func, args, world=None, consistent=(RankError,)):
    """``func(args)`` as one rank of the job: rank 0 alone prints (stdout) and shows progress bars.

    An exception on one rank while the others wait in a collective would hang the job: it is
    printed with the rank's number and the whole job is aborted (exit status 1 on every rank).
    Exceptions of the ``consistent`` types are raised on every rank at once (``World.together``,
    the NaN guard after the all-reduce), so each rank exits by itself with its message.
    """
    world = world or get_world()
    if world.size == 1:
        return func(args) or 0
    if not world.is_root:
        os.environ["TFORMER_PROGRESS"] = "0"
    with open(os.devnull, "w") as devnull, \
            contextlib.redirect_stdout(sys.stdout if world.is_root else devnull):
        try:
            return func(args) or 0
        except consistent as e:
            print(f"rank {world.rank} of {world.size}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 1
        except BaseException as e:                  # noqa: BLE001
            if isinstance(e, SystemExit) and e.code in (0, None):
                raise
            lines = traceback.format_exception(e)
            sys.stderr.write("".join(f"rank {world.rank} of {world.size}: {ln}"
                                     for chunk in lines for ln in chunk.splitlines(True)))
            sys.stderr.write(f"rank {world.rank} of {world.size}: aborting the job\n")
            sys.stderr.flush()
            # MPI_Abort tears the job down at once, and the launcher may not yet have forwarded
            # what this rank just wrote to its pipe (measured: the message was lost in 1 run of
            # 40). A short pause, on this error path only, lets it through.
            time.sleep(ABORT_GRACE_S)
            world.abort(1)


# -- the global batch --------------------------------------------------------------------------

def check_global_batch(batch_size, world, name="batch_size"):
    """The global batch B must split into p equal slices: ``B/p`` rows per rank, returned."""
    if batch_size < 1 or batch_size % world.size:
        raise ValueError(f"{name}: the global batch must be a positive multiple of the world size "
                         f"{world.size}, got {batch_size}")
    return batch_size // world.size


def local_slice(batch, world):
    """Rank r's rows ``[r·B/p, (r+1)·B/p)`` of each array of ``batch`` (a tuple of ``(B, ...)`` arrays)."""
    if world.size == 1:
        return batch
    B = batch[0].shape[0]
    b = check_global_batch(B, world)
    lo = world.rank * b
    return tuple(a[lo:lo + b] for a in batch)


def shard_bounds(n, p):
    """``[0, n_0, n_0 + n_1, ..., n]``: p contiguous shards of n numbers, sizes differing by at most 1."""
    sizes = [n // p + (r < n % p) for r in range(p)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


# -- data parallelism --------------------------------------------------------------------------

class DataParallel:
    """The hooks that ``train(..., data_parallel=dp)`` calls, for a model with flat buffers.

    ``dp = DataParallel(model, world, zero=False)`` broadcasts rank 0's parameters;
    ``opt = dp.optimizer(lambda m: AdamW(m, ...))`` builds the optimizer (ZeRO-1: on this rank's
    shard only). In each step ``train`` calls ``reduce_gradients`` after the backward passes,
    ``clip_grad_norm`` instead of ``optim.clip_grad_norm`` and ``save_checkpoint`` instead of
    ``checkpoint.save_checkpoint``.
    """

    def __init__(self, model, world=None, zero=False):
        self.world = world or get_world()
        flat = model.flat_buffers()
        if flat is None:
            raise ValueError(f"model: expected a model with flat parameter and gradient buffers "
                             f"(Module.flatten_parameters()), got {type(model).__name__} without them")
        self.model, self.zero = model, bool(zero)
        self.P, self.G = flat
        self.bounds = shard_bounds(self.P.size, self.world.size)
        self.lo, self.hi = (int(x) for x in self.bounds[self.world.rank:self.world.rank + 2])
        self.g_shard = np.zeros(self.hi - self.lo, self.G.dtype) if self.zero else None
        self._optimizer = None
        self.world.bcast(self.P)                  # every rank starts from rank 0's parameters

    def optimizer(self, make):
        """``make(model) -> Optimizer``; with ZeRO-1, a ``ShardedOptimizer`` around ``make(shard)``."""
        opt = ShardedOptimizer(self, make) if self.zero else make(self.model)
        self._optimizer = opt
        return opt

    def reduce_gradients(self, model, loss):
        """g ← (1/p) Σ_r g_r (ZeRO-1: this rank's shard of it only); returns the mean loss."""
        p = self.world.size
        if self.zero:
            from mpi4py import MPI
            counts = np.diff(self.bounds).tolist()
            if p > 1:
                self.world.comm.Reduce_scatter(self.G, self.g_shard, counts, op=MPI.SUM)
            else:
                self.g_shard[...] = self.G
        else:
            self.world.allreduce_sum(self.G)
        if p > 1:
            (self.g_shard if self.zero else self.G)[...] /= p
        return self.world.allreduce_scalar(loss) / p

    def clip_grad_norm(self, model, max_norm):
        """``optim.clip_grad_norm`` of the reduced gradient; ZeRO-1: ‖g‖² = Σ_r ‖g_shard_r‖²."""
        from tformer.training.optim import clip_grad_norm
        if not self.zero:
            return clip_grad_norm(model, max_norm)
        g = self.g_shard
        with np.errstate(over="ignore"):
            s = float(np.dot(g, g))
        if math.isinf(s) and np.isfinite(g).all():          # a float32 sum that overflowed
            scale = float(np.max(np.abs(g)))
            s = scale * scale * float(np.dot(g / scale, g / scale))
        norm = math.sqrt(self.world.allreduce_scalar(s))
        if math.isfinite(norm) and norm > max_norm:
            g *= max_norm / norm
        return norm

    def save_checkpoint(self, path, model, optimizer=None, config=None, step=0, extra=None,
                        precision=None):
        """Gather what is sharded (every rank must call), then rank 0 writes the file atomically.

        The file is the same as a single process would write: a checkpoint of any world size
        resumes in any other."""
        if isinstance(optimizer, ShardedOptimizer):
            optimizer = optimizer.gathered()
        if self.world.is_root:
            save_checkpoint(path, model, optimizer, config, step, extra, precision=precision)
        return path

    def load_checkpoint(self, path, model, optimizer=None, config=None, precision=None):
        """Every rank reads ``path`` (a file all hosts see) inside ``World.together``: a missing
        file or another model's checkpoint is the same ``RankError`` on every rank."""
        from tformer.training.checkpoint import load_checkpoint
        with self.world.together(f"loading the checkpoint {path!r}"):
            if isinstance(optimizer, ShardedOptimizer):
                meta = load_checkpoint(path, model, None, config, precision=precision)
                optimizer.load_state_dict(read_checkpoint(path)[2])
            else:
                meta = load_checkpoint(path, model, optimizer, config, precision=precision)
        return meta


# -- the algorithm inside MPI_Allreduce, written out -------------------------------------------

def ring_allreduce(buffers):
    """The ring all-reduce of p buffers of N numbers, step by step: ``(sums, sent)``.

    Each buffer is cut into p chunks. Reduce-scatter: in step s = 0 … p−2, rank r sends chunk
    (r − s) mod p to rank r+1, which adds it to its own; after p−1 steps rank r holds the full sum of
    chunk (r + 1) mod p. All-gather: p−1 more steps pass the summed chunks around the ring, each rank
    overwriting its copy. Every rank sends 2(p−1) chunks of N/p numbers: 2(p−1)/p · N in all,
    whatever p. ``sent[r]`` counts the numbers rank r sent; ``sums[r]`` is Σ_q buffers[q] on rank r.
    (An illustration in NumPy of what MPI does over the wire; training calls MPI itself.)
    """
    p = len(buffers)
    bufs = [np.array(b, dtype=np.float64).reshape(-1) for b in buffers]              # p × (N,)
    bounds = shard_bounds(bufs[0].size, p)
    chunk = [slice(int(bounds[c]), int(bounds[c + 1])) for c in range(p)]
    sent = [0] * p
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(p - 1):
            # every rank sends at once: gather the messages first, then deliver them
            msgs = []
            for r in range(p):
                c = (r - s) % p if phase == "reduce-scatter" else (r + 1 - s) % p
                msgs.append((r, c, bufs[r][chunk[c]].copy()))
                sent[r] += msgs[-1][2].size
            for r, c, data in msgs:
                dst = (r + 1) % p
                if phase == "reduce-scatter":
                    bufs[dst][chunk[c]] += data
                else:
                    bufs[dst][chunk[c]] = data
    return bufs, sent


# -- launching ---------------------------------------------------------------------------------

def find_mpiexec():
    """The ``mpiexec`` beside this Python (the venv's, from the ``mpich`` wheel), else on PATH, else None."""
    import shutil
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


def launch(n, argv, timeout, env=None, mpiexec=None):
    """Run ``mpiexec -n n <this python> argv...`` on this host; a ``subprocess.CompletedProcess``.

    Every rank is a local process: ``HYDRA_LAUNCHER=fork`` tells MPICH's launcher never to reach
    for ssh (a container's host name may not resolve); ranks talk through shared memory. The
    ``timeout`` (seconds) bounds the whole job: nothing launched here can hang its caller.
    """
    import subprocess
    mpiexec = mpiexec or find_mpiexec()
    if mpiexec is None:
        raise FileNotFoundError("mpiexec: not found beside this Python nor on PATH; "
                                "pip install -r requirements.txt installs MPICH's")
    env = dict(os.environ if env is None else env)
    env.setdefault("HYDRA_LAUNCHER", "fork")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")                   # one thread per rank: the ranks share the cores
    return subprocess.run([mpiexec, "-n", str(n), sys.executable, *argv], env=env, timeout=timeout,
                          capture_output=True, text=True)
