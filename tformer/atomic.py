"""Files written atomically: a temporary file beside the target, flushed to disk, then renamed over
it (``os.replace``), so that a reader, or a run killed mid-write, finds the old file or the new one,
never half of one. Checkpoints, run logs and every ``book/data/*.json`` result are written this way.
"""
import contextlib
import json
import os
import tempfile


@contextlib.contextmanager
def atomic_open(path, mode="w", **kwargs):
    """``with atomic_open(path, "w") as f: ...``: ``f`` is a temporary file in ``path``'s folder
    (created if missing). On a clean exit it is flushed, synced and renamed over ``path``; on an
    error it is removed and ``path`` is left as it was."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_json(path, data):
    """``data`` as indented JSON at ``path``, written atomically. Returns ``path``."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    return path
