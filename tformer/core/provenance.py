"""Where a result in ``book/data/`` came from: the one recorder every experiment command uses.

``record(name)`` gives the fields each result file carries: the command line, the project's
commit (and whether the working tree had uncommitted changes), the machine, the date and the
load average. The commit is read by running git in the repository that holds this package, never
in the caller's current folder (a command started from elsewhere would otherwise record the
commit of whatever repository it was started in); where the package is not a git checkout (an
installed copy), the commit is None and ``commit_note`` says why.
"""
import datetime
import os
import platform
import shlex
import subprocess
import sys

from tformer.core import cpu

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tformer/
ROOT = os.path.dirname(PACKAGE)                   # the checkout that holds tformer/, if it is one


def _git(*args, root=ROOT):
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30,
                          check=True).stdout.strip()


def git_commit(root=ROOT):
    """``(commit, dirty, note)``: the HEAD commit of the repository whose top folder is ``root``
    and whether tracked files differ from it; ``(None, None, why)`` where ``root`` is not the top
    of a git checkout (an installed copy, no git)."""
    try:
        top = _git("rev-parse", "--show-toplevel", root=root)
    except FileNotFoundError:
        return None, None, "git is not installed"
    except (OSError, subprocess.SubprocessError):
        return None, None, f"{root} is not in a git checkout"
    if os.path.realpath(top) != os.path.realpath(root):
        return None, None, (f"{root} is not the top of a git checkout (git found {top}): "
                            f"tformer is installed, not run from its repository")
    try:
        commit = _git("rev-parse", "HEAD", root=root)
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", root=root))
    except (OSError, subprocess.SubprocessError) as e:
        return None, None, f"git failed in {root}: {e}"
    return commit, dirty, None


def machine():
    """The CPU (``tformer.core.cpu.identify``: model name, vendor, family and model,
    microarchitecture, vector width), its cache sizes (as Linux reports them for CPU 0), the
    cores, the platform and the versions of Python and NumPy."""
    info = cpu.identify()
    base = "/sys/devices/system/cpu/cpu0/cache"
    for idx in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        try:
            level, kind, size = (open(os.path.join(base, idx, n)).read().strip()
                                 for n in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            info[f"L{level}"] = size
    import numpy as np
    info.update(cpu_count=os.cpu_count(), platform=platform.platform(),
                python=platform.python_version(), numpy=np.__version__)
    return info


def load_average():
    """The 1, 5 and 15 minute load averages, or None where the system has none."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def now():
    """The UTC date and time, to the second (ISO 8601)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command_line(name):
    """``python -m tformer ...`` as it was typed, when this process is ``python -m tformer``; else
    (called from Python, e.g. a test) ``python -m tformer NAME``."""
    if sys.argv and sys.argv[0].endswith(os.path.join("tformer", "__main__.py")):
        return "python -m tformer " + shlex.join(sys.argv[1:])
    return f"python -m tformer {name}"


def record(name):
    """The provenance fields of a result of command ``name``: ``command``, ``commit``, ``dirty``
    (``commit_note`` where there is no commit), ``machine``, ``date``, ``load_average``."""
    commit, dirty, note = git_commit()
    rec = {"command": command_line(name), "commit": commit, "dirty": dirty, "machine": machine(),
           "date": now(), "load_average": load_average()}
    if note:
        rec["commit_note"] = note
    return rec
