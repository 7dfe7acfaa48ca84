"""tformer.core.atomic: a replaced file keeps its mode, a failed write names the file and keeps the old
one, and ``unwritable`` says why a path cannot be written before anything is."""
import errno
import os

import pytest

from tformer.core.atomic import WriteError, atomic_open, unwritable, write_json


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o664])
def test_a_replaced_file_keeps_its_mode(tmp_path, mode):
    path = tmp_path / "r.json"
    path.write_text("{}")
    os.chmod(path, mode)
    write_json(path, {"a": 1})
    assert os.stat(path).st_mode & 0o7777 == mode


def test_a_new_file_gets_the_umask_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        write_json(tmp_path / "n.json", {})
    finally:
        os.umask(umask)
    assert os.stat(tmp_path / "n.json").st_mode & 0o777 == 0o644


def test_a_full_disk_keeps_the_old_file_and_names_it(tmp_path, monkeypatch):
    path = tmp_path / "c.npz"
    path.write_bytes(b"old")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(WriteError) as e:
        with atomic_open(path, "wb") as f:
            f.write(b"new")
    assert str(e.value) == (f"{str(path)!r} could not be written (No space left on device); "
                            f"the old file is kept")
    assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["c.npz"]


def test_unwritable_says_why_and_leaves_nothing(tmp_path):
    (tmp_path / "f").write_text("x")
    assert unwritable(tmp_path / "new" / "deeper" / "x.npz") is None
    assert unwritable(tmp_path) == "it is a folder"
    assert unwritable(tmp_path / "f" / "x.npz") == f"{str(tmp_path / 'f')!r} is a file, not a folder"
    assert unwritable("/proc/tformer-x.npz").startswith("no file can be created in '/proc'")
    assert sorted(os.listdir(tmp_path)) == ["f"]
