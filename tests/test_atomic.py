"""tformer.atomic: a file is replaced whole or not at all."""
import json
import os

import pytest

from tformer.atomic import atomic_open, write_json


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
