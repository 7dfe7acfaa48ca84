"""Intra-op parallelism: a kernel's independent rows split across a few threads.

NumPy's ufunc loops and BLAS calls release the GIL, so plain Python threads run them on separate
cores. With ``set_num_threads(n)``, ``n > 1``, every kernel that is worth it splits its work into
``n`` contiguous parts (``parallel_for``) or runs independent products side by side
(``run_tasks``): the rows of a GEMM, of GELU, of LayerNorm, the sequences of attention, the
parameters of AdamW. That is PyTorch's intra-op model (``at::parallel_for`` with a grain size).

Two rules keep it honest:

- **Work is split only along axes that are computed independently** (rows of a product, elements
  of an elementwise map, sequences of attention, whole parameters); a sum is never split into
  partial sums. Every kernel but the matrix products gives the same bits for any thread count
  (tested); a product split by rows agrees to float rounding, because OpenBLAS itself rounds a
  block of rows differently from the whole (as its own threads do).
- **One level of threads.** While tformer runs ``n > 1`` threads, BLAS is limited to one thread
  per call (through ``threadpoolctl``, for the whole process): its own spinning worker threads
  would otherwise hold the cores that tformer's elementwise work needs. ``set_num_threads(1)``
  gives BLAS its own threading back, and everything runs on the calling thread.

**The default is every core**, as in PyTorch: at import the count is ``TFORMER_NUM_THREADS`` if
that is set (an integer ≥ 1; anything else is a ``ValueError`` naming it), else
``default_num_threads()``: the cores this process may run on (its CPU affinity, which a container
or ``taskset`` may restrict), divided among the ranks of an MPI job on this host, since they
share those cores. The book's notebooks and tests pin one thread (the Makefile exports
``TFORMER_NUM_THREADS=1``), so that their stored numbers do not depend on the reader's core count.
"""
import itertools
import math
import os
import queue
import threading

import numpy  # noqa: F401  (loads NumPy's OpenBLAS first: threadpoolctl limits only loaded libraries)

_n_threads = 1
_pool = None
_blas_limit = None          # threadpoolctl's handle while BLAS is held at one thread
_local = threading.local()  # .inside: this thread is already running a part (nested calls run serially)


def get_num_threads():
    """The number of threads tformer's kernels split their work across (1: no splitting)."""
    return _n_threads


def set_num_threads(n):
    """Split kernels across ``n`` threads (``n ≥ 1``); returns the previous count.

    ``n > 1`` starts a pool of ``n − 1`` workers (the calling thread does one part itself) and
    limits BLAS to one thread per call; ``n = 1`` shuts the pool down and restores BLAS's threads.
    """
    global _n_threads, _pool, _blas_limit
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected an integer ≥ 1, got {n!r}")
    previous = _n_threads
    if n == _n_threads:
        return previous
    if _pool is not None:
        _pool.stop()
        _pool = None
    if n > 1:
        _pool = _Workers(n - 1)
        if _blas_limit is None:
            from threadpoolctl import threadpool_limits
            _blas_limit = threadpool_limits(limits=1, user_api="blas")
    elif _blas_limit is not None:
        _blas_limit.restore_original_limits()
        _blas_limit = None
    _n_threads = n
    return previous


MIN_PART = 1 << 15  # elements of elementwise work below which a part costs more to hand off than it saves


def grain_for(item_size):
    """The ``grain`` for ``parallel_for`` over items of ``item_size`` elements each: at least
    ``MIN_PART`` elements per part."""
    return max(1, MIN_PART // max(1, item_size))


def parallel_for(fn, n, grain=1):
    """Call ``fn(lo, hi)`` on contiguous ranges that cover ``[0, n)``, in parallel.

    At most ``get_num_threads()`` ranges, none shorter than ``grain`` items (so a small job runs
    as one call on the calling thread, with no hand-off cost). Ranges of many items start at
    multiples of 8: on a flat float32 array each part then begins on a 32-byte boundary.
    The ranges are fixed before anything runs (so are the results, whichever thread
    computes a range); each is claimed by the first thread free to run it, the calling
    thread included, so a worker that the operating system has not scheduled yet delays
    nothing (``_Workers.run``).
    ``fn`` writes its results into preallocated arrays; an exception in any part is re-raised.
    """
    parts = min(_n_threads, max(1, n // max(1, grain)))
    if parts == 1 or getattr(_local, "inside", False):
        fn(0, n)
        return
    align = 8 if n >= 64 * parts else 1
    bounds = [0] + [min(n, -(-(n * i // parts) // align) * align) for i in range(1, parts)] + [n]
    _workers().run([(fn, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo])


def run_tasks(*tasks):
    """Run independent zero-argument callables side by side; return their results in order.

    With one thread they simply run one after the other. Used where a backward pass has two
    products of equal cost that share nothing but their inputs (``dX = dY Wᵀ`` and ``dW = Xᵀ dY``).
    As in ``parallel_for``, the calling thread runs every task no worker has claimed.
    """
    if _n_threads == 1 or len(tasks) == 1 or getattr(_local, "inside", False):
        return [t() for t in tasks]
    return _workers().run([(t,) for t in tasks])


def inside_part():
    """True on a thread that is running a part of a split job (nested splits run serially)."""
    return getattr(_local, "inside", False)


def scratch(slot, shape, dtype):
    """A work array for a temporary that lives only inside one kernel call (contents undefined).

    Kept per thread and per ``slot`` name from one call to the next, so the temporary costs no
    fresh memory (which the operating system must fault in and zero, page by page). Valid until
    the same thread asks for the same slot again: never return it, never keep it in a cache.
    """
    bufs = _local.__dict__.setdefault("scratch", {})
    dtype = numpy.dtype(dtype)
    n = math.prod(shape)
    buf = bufs.get((slot, dtype))
    if buf is None or buf.size < n:
        buf = bufs[(slot, dtype)] = numpy.empty(n, dtype)
    return buf[:n].reshape(shape)


class _Workers:
    """``k`` daemon threads that take jobs (zero-argument callables) from one queue.

    Lighter than ``concurrent.futures.ThreadPoolExecutor`` (no Future or Condition per
    job): the smallest kernels are split dozens of times per training step.
    """

    def __init__(self, k):
        self.k = k
        self.jobs = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._loop, name=f"tformer-{i}", daemon=True)
                        for i in range(k)]
        for t in self.threads:
            t.start()
        self._steered_from = None                  # the caller's CPU the workers avoid (_steer);
                                                   # −1: the system refused, no steering

    def _loop(self):
        _local.inside = True                       # a worker runs parts only: it never splits again
        while (job := self.jobs.get()) is not None:
            job()

    def run(self, tasks):
        """Run ``tasks`` (each ``(fn, *args)``) on this thread and up to ``k`` workers;
        return their results in order. The first exception is re-raised, but only after
        every task has run (none is left writing into arrays the caller reuses).

        Tasks are claimed one at a time from a shared counter (``next`` on an
        ``itertools.count`` is atomic under the GIL) by this thread and by the workers it
        wakes. A worker that starts late, when every task is claimed, finds nothing and
        does nothing; so the caller waits only for tasks that are running, never for a
        worker still waiting for a core (on a shared machine that wait is a scheduler
        time slice: milliseconds, where a split saves tens of microseconds). Each call has
        its own counter and result queue, so callers on different threads never mix."""
        n = len(tasks)
        claim = itertools.count()
        done = queue.SimpleQueue()                 # (i, ok, value) of workers' tasks
        results = [None] * n

        def helper():
            while (i := next(claim)) < n:
                fn, *args = tasks[i]
                try:
                    done.put((i, True, fn(*args)))
                except BaseException as e:         # handed to the caller, re-raised
                    done.put((i, False, e))

        self._steer()
        for _ in range(min(self.k, n - 1)):
            self.jobs.put(helper)
        error, own = None, 0
        _local.inside = True                       # the caller's parts never split again
        try:
            while (i := next(claim)) < n:
                own += 1
                fn, *args = tasks[i]
                try:
                    results[i] = fn(*args)
                except BaseException as e:
                    error = error or e
        finally:
            _local.inside = False
        for _ in range(n - own):
            i, ok, value = done.get()
            results[i] = value
            if not ok and error is None:
                error = value
        if error is not None:
            raise error
        return results

    def _steer(self):
        """Keep the workers off the CPU the calling thread is running on.

        A thread woken by another is placed by Linux, as a rule, on the waker's CPU when it
        judges the two to share data ("wake-affine"), even with another CPU idle; measured on
        this book's 2-core machine, a worker woken after a pause then ran its part on the
        caller's core, after the caller's part instead of beside it. So before waking them, the workers' affinity is set to the CPUs
        this process may use minus the caller's current one (one system call per worker, only
        when the caller has moved). Not on systems without per-thread affinity, or where the
        caller's CPU cannot be read, or with a single CPU; and never again in this pool once
        the system refuses an affinity call (a container may): the work still runs, unsteered.
        """
        cpu = _current_cpu()
        if cpu is None or cpu == self._steered_from or self._steered_from == -1:
            return
        try:
            others = os.sched_getaffinity(0) - {cpu}
            if others:
                for t in self.threads:
                    os.sched_setaffinity(t.native_id, others)
        except OSError:
            cpu = -1                                   # refused: stop steering
        self._steered_from = cpu

    def stop(self):
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join()


def _sched_getcpu():
    """glibc's ``sched_getcpu`` (the CPU the calling thread runs on), or None where it is missing."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        import ctypes
        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return fn


_getcpu = _sched_getcpu()


def _current_cpu():
    """The CPU the calling thread is running on now (None: unknown)."""
    if _getcpu is None:
        return None
    cpu = _getcpu()
    return cpu if cpu >= 0 else None


def _workers():
    """The pool, started again if this process is a fork of one that had it (see ``_after_fork``)."""
    global _pool
    if _pool is None:
        _pool = _Workers(_n_threads - 1)
    return _pool


def _after_fork():
    """In a child made by ``fork`` (``multiprocessing`` on Linux) only the forking thread exists:
    the parent's workers are gone. Forget them; the child starts its own at its first split."""
    global _pool
    _pool = None
    _local.__dict__.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


# Set by MPI launchers in each process they start: how many ranks of the job run on this host
# (MPICH/Hydra and Intel MPI; Open MPI; PMIx launchers).
LOCAL_RANKS_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE")


def available_cores():
    """The number of cores this process may run on: its CPU affinity where the OS reports one
    (``os.sched_getaffinity``: a container, ``taskset`` or a batch system may allow fewer than the
    machine has), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):              # macOS, Windows: no affinity call
        return max(1, os.cpu_count() or 1)


def local_ranks(environ=None):
    """How many processes of an MPI job share this host (1 outside MPI), from the launcher's
    variables (``LOCAL_RANKS_VARIABLES``); a value that is not a positive integer is ignored."""
    environ = os.environ if environ is None else environ
    for var in LOCAL_RANKS_VARIABLES:
        try:
            n = int(environ.get(var, ""))
        except ValueError:
            continue
        if n >= 1:
            return n
    return 1


def default_num_threads(environ=None, cores=None):
    """n = max(1, ⌊cores / ranks on this host⌋): every available core, shared evenly among the
    local ranks of an MPI job (each rank's threads then have cores of their own)."""
    cores = available_cores() if cores is None else cores
    return max(1, cores // local_ranks(environ))


def parse_num_threads(value, name="TFORMER_NUM_THREADS"):
    """``value`` (a string, e.g. from the environment or the command line) as an integer ≥ 1;
    otherwise a ``ValueError`` naming ``name``, the expected and the actual value."""
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is None or n < 1:
        raise ValueError(f"{name}: expected an integer ≥ 1 (threads per process), got {value!r}")
    return n


def threads_from_env(environ=None, cores=None):
    """The thread count at import: ``TFORMER_NUM_THREADS`` when set and not empty, else
    ``default_num_threads()``."""
    environ = os.environ if environ is None else environ
    value = environ.get("TFORMER_NUM_THREADS", "")
    if value.strip():
        return parse_num_threads(value)
    return default_num_threads(environ, cores)


set_num_threads(threads_from_env())
