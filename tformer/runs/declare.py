"""What a command reads and writes, declared in one place, and the one check of it before any work.

Every command module of ``python -m tformer`` has ``files(args)``, which returns the files that
command line reads and writes, every one, defaults and files of the repository included (the
shipped model, a tokenizer written beside an output), each with the flag that names it::

    def files(args):
        return [reads("--text", args.text), writes("--out", args.out),
                updates("--checkpoint", args.checkpoint if args.resume else None)]

``reads``: read, must exist. ``writes``: written (replaced atomically). ``updates``: read if it
exists, then written (``--resume``'s checkpoint, a result file that is completed); with
``required=True`` it must exist (``long-run``'s ``--out``: its plan, completed with the result),
checked as ``reads`` checks an input, and written as ``writes`` writes an output. ``may_read``:
read if it exists, never written (a default that is used only when present). A ``None`` or ``""``
path is no file. ``files(args)`` reads no file it declares and may settle a default that depends on other flags
(the tokenizer beside ``--checkpoint``), storing it on ``args``.

``check(declared)`` then holds, before the command's ``check_args`` and ``main`` run (``python -m
tformer`` calls it; every ValueError is that command's usage error, exit status 2, naming the flag):

- an input exists, is a regular file (not a folder, a FIFO, a device) and is readable;
- no output is an input or another output: their resolved paths (symlinks followed, as the write
  follows them), or ``os.path.samefile`` for two names of one existing file;
- an output that exists is a regular file (a symlink to one: the file it points to is replaced);
  its folder exists, or can be created, and takes a new file. ``..`` is resolved as the operating
  system resolves it when the file is written: ``nope/../x`` with no folder ``nope`` is refused.
"""
import os
import stat
from typing import NamedTuple

from tformer.core.atomic import unwritable

READS, MAY_READ, WRITES, UPDATES = "reads", "may read", "writes", "updates"


class Declared(NamedTuple):
    """One file of a command line: the flag (or argument) naming it, its path, what is done, and
    (inputs) what the file is, for the message when it is missing."""
    flag: str
    path: str
    role: str
    what: str = "a readable file"
    missing: str = "no such file"
    required: bool = False

    @property
    def must_exist(self):
        """An input that must be there: ``reads``, or ``updates(..., required=True)``."""
        return self.role == READS or (self.role == UPDATES and self.required)

    @property
    def read(self):
        return self.role in (READS, MAY_READ, UPDATES)

    @property
    def written(self):
        return self.role in (WRITES, UPDATES)


def reads(flag, path, what="a readable file", missing="no such file"):
    """A file the command reads: it must exist (``what`` it is and ``missing`` say so when not)."""
    return Declared(flag, path, READS, what, missing)


def may_read(flag, path):
    """A file the command reads if it exists (a default used when present)."""
    return Declared(flag, path, MAY_READ)


def writes(flag, path):
    """A file the command writes (replaces atomically)."""
    return Declared(flag, path, WRITES)


def updates(flag, path, required=False, what="a readable file", missing="no such file"):
    """A file the command reads if it exists (``required``: it must exist, ``what`` it is and
    ``missing`` say so when not) and then writes."""
    return Declared(flag, path, UPDATES, what, missing, required)


def beside(path, name):
    """The file ``name`` in the folder of ``path`` (a side output)."""
    return os.path.join(os.path.dirname(path), name)


def resolved(path):
    """Where a write of ``path`` lands: symlinks followed (``tformer.core.atomic`` replaces the file a
    symlink points to, not the link)."""
    return os.path.realpath(path)


def same_file(a, b):
    """Whether paths ``a`` and ``b`` name one file (resolved, or the same existing inode)."""
    if resolved(a) == resolved(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _kind(mode):
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def _input(d):
    """ValueError unless ``d`` (an input) is a regular readable file (or absent, when optional)."""
    try:
        st = os.stat(d.path)
    except (FileNotFoundError, NotADirectoryError):
        if d.must_exist:
            why = "a broken symlink" if os.path.islink(d.path) else d.missing
            if not os.path.isabs(d.path) and d.path.startswith("book" + os.sep):
                why += "; a file of the repository: run the command from its top folder"
            raise ValueError(f"{d.flag}: expected {d.what}, got {d.path!r} ({why})") from None
        return
    except OSError as e:
        raise ValueError(f"{d.flag}: expected a readable file, got {d.path!r} ({e.strerror})") \
            from None
    kind = _kind(st.st_mode)
    if kind:
        what = "a regular file" if d.what == Declared._field_defaults["what"] else d.what
        raise ValueError(f"{d.flag}: expected {what}, got {d.path!r} ({kind})")
    if not os.access(d.path, os.R_OK):
        raise ValueError(f"{d.flag}: expected a readable file, got {d.path!r} (permission denied)")


def _missing_before_dotdot(path):
    """The folder of ``path`` that does not exist and is followed by ``..``, or None: the write
    (the operating system) cannot pass it, whatever ``..`` would remove as text."""
    parts = path.split(os.sep)
    for i, part in enumerate(parts[1:], 1):
        if part == "..":
            head = os.sep.join(parts[:i]) or os.sep
            if not os.path.isdir(head):
                return head
    return None


def _dotdot(d):
    """ValueError if the write of ``d`` would meet ``..`` after a folder that is not there."""
    missing = _missing_before_dotdot(d.path)
    if missing:
        raise ValueError(f"{d.flag}: expected a path whose folders exist before '..', got "
                         f"{d.path!r} ({missing!r} is not a folder)")


def _output(d):
    """ValueError unless ``d`` (an output) can be written as the write will go."""
    try:
        st = os.stat(d.path)
    except OSError:
        st = None
    target = resolved(d.path) if os.path.islink(d.path) else d.path   # where the write lands
    if st is not None:
        kind = _kind(st.st_mode)
        if kind:
            raise ValueError(f"{d.flag}: expected a file that can be written, got {d.path!r} "
                             f"({kind})")
    why = unwritable(target)
    if why:
        raise ValueError(f"{d.flag}: expected a file that can be written, got {d.path!r} ({why})")


def check(declared):
    """ValueError naming the flag if a declared file cannot be read or written as declared, or if
    an output is an input or another output (see the module docstring). ``declared``: an iterable
    of ``Declared``; entries with no path are skipped."""
    files = [d._replace(path=os.fspath(d.path)) for d in declared if d.path]
    for d in files:
        if d.read:
            _input(d)
        if d.written:
            _dotdot(d)
    for i, d in enumerate(files):
        if not d.written:
            continue
        for j, other in enumerate(files):
            if j == i or (other.flag == d.flag and other.path == d.path) \
                    or not same_file(d.path, other.path):
                continue
            if other.written:
                if j < i:
                    continue                              # said once, naming the later flag
                raise ValueError(f"{other.flag}: expected another file than {d.flag} {d.path!r} "
                                 f"(both are written: one would overwrite the other), got "
                                 f"{other.path!r}")
            raise ValueError(f"{d.flag}: expected another file than {other.flag} {other.path!r}, "
                             f"which the command reads (it would be overwritten), got {d.path!r}")
    for d in files:
        if d.written:
            _output(d)
