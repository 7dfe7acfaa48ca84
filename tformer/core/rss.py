"""The resident set of this process, from Linux's ``/proc/self/status``: its size now (``VmRSS``)
and its high-water mark (``VmHWM``), which ``reset_peak`` lowers to the current size, so that the
peak of one piece of work can be read (Linux >= 4.0). Used by ``python -m tformer memory`` and
``make bench``; tracemalloc sees only NumPy's arrays, this sees everything, BLAS buffers included.
"""


def status_bytes(key):
    """``/proc/self/status`` entry ``key`` (``"VmRSS"``, ``"VmHWM"``) in bytes; None where there
    is no such file or entry (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak():
    """Lower ``VmHWM`` to the current ``VmRSS``; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
