"""Files written atomically and crash-clean: a temporary file beside the target, flushed to disk,
renamed over it (``os.replace``), and the folder synced, so that a reader, or a run killed
mid-write, finds the old file or the new one, never half of one, and the rename survives a power
cut. Checkpoints, run logs and every ``book/data/*.json`` result are written this way.

A process killed (SIGKILL, OOM killer, power cut) between creating its temporary and the rename
leaves that temporary behind. Each write therefore first removes the stale temporaries of its own
target. A temporary is named ``.tmp-<target>~<host>~<pid>~<random><suffix>``, and a stale one is
one whose writer is gone: written on this host (its name and, on Linux, its process-id namespace,
so that two containers sharing a folder and a host name do not judge each other's process ids) by
a process id that no longer runs. Why this and
not one fixed temporary name per target (which the next write would simply overwrite): two
processes writing the same target at once (two runs pointed at one ``--checkpoint``) would then
write into the same temporary and could rename each other's half-written file over the target;
with a name per writer each renames only its own whole file, and the clean-up cannot touch a live
writer's temporary, since its process still runs. A temporary from another host (a shared file
system) is left alone: its process cannot be asked from here. A process id taken again by an
unrelated process keeps its stale file until that process ends (kept, never a live one removed).
"""
import contextlib
import errno
import json
import math
import os
import socket
import tempfile

SEP = "~"                       # cannot occur in a host name; the fields are read from the right


def _host():
    """This host's name, and the process-id namespace where Linux names one: where a pid means
    this process table's pid."""
    try:
        return f"{socket.gethostname()}@{os.readlink('/proc/self/ns/pid').strip('pid:[]')}"
    except OSError:
        return socket.gethostname()


def _prefix(path):
    return f".tmp-{os.path.basename(path)}{SEP}"


def _alive(pid):
    """Whether process ``pid`` runs on this host (a process we may not signal runs too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temporaries(path):
    """The temporaries of ``path`` (full paths) whose writer, a process on this host, is gone."""
    folder, prefix = os.path.dirname(os.path.abspath(path)), _prefix(path)
    host = _host()
    stale = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if not name.startswith(prefix):
            continue
        fields = name[len(prefix):].split(SEP)
        if len(fields) != 3 or fields[0] != host or not fields[1].isdigit():
            continue                                 # not this module's name, or another host's
        if int(fields[1]) != os.getpid() and not _alive(int(fields[1])):
            stale.append(os.path.join(folder, name))
    return stale


def fsync_folder(folder):
    """Make a rename in ``folder`` durable: fsync the folder itself (where the OS allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:                                  # e.g. Windows: a folder cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError as e:                             # a file system without folder fsync
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


class WriteError(OSError):
    """A file could not be written (a full disk, a folder that is not one or takes no files): its
    message names the file, the reason, and that the old file, if any, was kept."""

    def __init__(self, path, cause):
        self.message = (f"{path!r} could not be written ({cause.strerror or cause}); "
                        f"{_kept(path)}")
        super().__init__(self.message)
        self.errno, self.filename = cause.errno, path

    def __str__(self):
        return self.message


def _mode(path):
    """The permission bits the file at ``path`` should get: those of the file it replaces, else
    what a newly created file gets under this process's umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def unwritable(path):
    """Why ``path`` cannot be written by ``atomic_open``, or None if it can: a folder, a path
    under a file, a folder that takes no new file (read-only, ``/proc``). Probes the nearest
    existing folder by creating and removing an empty temporary there; writes nothing else."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        return "it is a folder"
    folder = os.path.dirname(path)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return f"{folder!r} is a file, not a folder"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f"{_prefix(path)}{_host()}{SEP}"
                                                        f"{os.getpid()}{SEP}")
    except OSError as e:
        return f"no file can be created in {folder!r} ({e.strerror})"
    os.close(fd)
    os.remove(probe)
    return None


def _kept(path):
    return "the old file is kept" if os.path.exists(path) else "no file was written"


@contextlib.contextmanager
def atomic_open(path, mode="w", **kwargs):
    """``with atomic_open(path, "w") as f: ...``: ``f`` is a temporary file in ``path``'s folder
    (created if missing). On a clean exit it is flushed, synced and renamed over ``path``, and the
    folder is synced; on an error it is removed and ``path`` is left as it was. The new file keeps
    the mode of the one it replaces (a new one gets the umask's). Stale temporaries of ``path``
    left by killed writers are removed first (see the module docstring). A symlink ``path`` is
    kept: the file it points to is replaced (as ``open(path, "w")`` would). An ``OSError`` of the
    file system (a full disk, a path under a file) is raised as ``WriteError`` naming ``path``."""
    given = path = os.fspath(path)
    if os.path.islink(path):                 # a symlink: replace the file it points to, keep it
        path = os.path.realpath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        for stale in stale_temporaries(path):
            with contextlib.suppress(FileNotFoundError):     # another writer removed it first
                os.remove(stale)
        prefix = f"{_prefix(path)}{_host()}{SEP}{os.getpid()}{SEP}"
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=os.path.splitext(path)[1])
    except OSError as e:
        raise WriteError(given, e) from e
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode(path))
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise WriteError(given, e) from e
        raise
    fsync_folder(folder)


def jsonable(x):
    """``x`` with NumPy numbers as Python's, tuples as lists, NaN and ±inf as None (JSON has
    neither): the form a result file or a run log stores."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", None) == 0:          # a NumPy scalar
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(path, data):
    """``data`` as indented JSON at ``path``, written atomically. Returns ``path``."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    return path
