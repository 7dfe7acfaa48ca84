"""tformer.core.atomic: a file is replaced whole or not at all."""
import json
import os

import pytest

from tformer.core.atomic import atomic_open, write_json


def test_write_json_creates_the_folder_and_replaces_the_file(tmp_path):
    path = tmp_path / "new" / "result.json"
    assert write_json(path, {"a": 1}) == path
    write_json(path, {"a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2]}
    assert os.listdir(path.parent) == ["result.json"]          # no temporary file left behind


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("old\n")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_open(path, "w") as f:
            f.write("half of a new fi")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["log.csv"]


def test_binary_mode(tmp_path):
    path = tmp_path / "x.bin"
    with atomic_open(path, "wb") as f:
        f.write(b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"


def _temporary(folder, target, host, pid):
    path = folder / f".tmp-{target}~{host}~{pid}~abc123.npz"
    path.write_bytes(b"half a checkpoint")
    return path


def _gone_pid():
    """The id of a process that has ended."""
    import subprocess
    import sys
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout)


def test_a_write_removes_its_targets_temporaries_left_by_a_killed_writer_only(tmp_path):
    from tformer.core.atomic import _host
    host = _host()
    dead = _temporary(tmp_path, "ck.npz", host, _gone_pid())
    live = _temporary(tmp_path, "ck.npz", host, os.getppid())        # a writer that still runs
    remote = _temporary(tmp_path, "ck.npz", "another-host", _gone_pid())
    container = _temporary(tmp_path, "ck.npz", host.split("@")[0] + "@1", _gone_pid())  # its pids
    other = _temporary(tmp_path, "other.npz", host, _gone_pid())     # another target's
    with atomic_open(tmp_path / "ck.npz", "wb") as f:
        f.write(b"new")
    assert not dead.exists()
    assert live.exists() and remote.exists() and other.exists() and container.exists()
    assert (tmp_path / "ck.npz").read_bytes() == b"new"


def test_the_folder_is_synced_after_the_rename(tmp_path, monkeypatch):
    import tformer.core.atomic as atomic
    events = []
    real_replace, real_fsync_folder = os.replace, atomic.fsync_folder
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append("replace"),
                                                            real_replace(a, b)))
    monkeypatch.setattr(atomic, "fsync_folder", lambda d: (events.append(("fsync", d)),
                                                           real_fsync_folder(d)))
    write_json(tmp_path / "r.json", {"a": 1})
    assert events == ["replace", ("fsync", str(tmp_path))]


def test_jsonable_turns_numpy_numbers_and_non_finite_floats_into_json():
    import numpy as np
    from tformer.core.atomic import jsonable
    out = jsonable({1: (np.float32(0.5), np.int64(3), float("nan"), -np.inf), "x": [np.nan]})
    assert out == {"1": [0.5, 3, None, None], "x": [None]}
    assert type(out["1"][1]) is int and json.dumps(out, allow_nan=False)
