"""The files one command line names: no output may be an input or another output, and every
output can be written, checked before anything is read at length or written.

``check_paths(inputs, outputs)`` takes ``[(flag, path)]`` pairs (a ``None`` path is skipped) and
raises ValueError naming both flags when an output names the same file as an input or another
output (their resolved paths, or ``os.path.samefile`` for two names of one existing file), and
naming the flag when an output cannot be written (``tformer.atomic.unwritable``: a folder, a path
under a file, a folder that takes no new file).
"""
import os

from ..atomic import unwritable


def same_file(a, b):
    """Whether paths ``a`` and ``b`` name one file (resolved, or the same existing inode)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_paths(inputs, outputs):
    """ValueError if an output of ``outputs`` is an input or another output, or unwritable."""
    inputs = [(f, os.fspath(p)) for f, p in inputs if p is not None]
    outputs = [(f, os.fspath(p)) for f, p in outputs if p is not None]
    for i, (flag, path) in enumerate(outputs):
        for other, given in inputs:
            if same_file(path, given):
                raise ValueError(f"{flag}: expected another file than {other} {given!r}, which "
                                 f"the command reads (it would be overwritten), got {path!r}")
        for other, given in outputs[:i]:
            if same_file(path, given):
                raise ValueError(f"{flag}: expected another file than {other} {given!r} (both "
                                 f"are written: one would overwrite the other), got {path!r}")
    for flag, path in outputs:
        why = unwritable(path)
        if why:
            raise ValueError(f"{flag}: expected a file that can be written, got {path!r} ({why})")
