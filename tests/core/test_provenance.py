"""tformer.core.provenance: the commit is the project's wherever the command starts; no commit, a reason."""
import os
import subprocess

import tformer
from tformer.core import provenance


def test_the_commit_is_this_repositorys_from_any_folder(tmp_path, monkeypatch):
    root = os.path.dirname(tformer.__path__[0])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                          text=True).stdout.strip()
    other = tmp_path / "elsewhere"                   # another git repository as the current folder
    other.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=other, check=True)
    monkeypatch.chdir(other)
    rec = provenance.record("memory")
    assert rec["commit"] == head and len(head) == 40
    assert isinstance(rec["dirty"], bool) and "commit_note" not in rec
    assert rec["command"] == "python -m tformer memory"
    assert rec["machine"]["cpu_count"] == os.cpu_count()
    assert len(rec["load_average"]) == 3 and rec["date"].endswith("+00:00")


def test_a_folder_that_is_not_the_top_of_a_checkout_has_no_commit_and_says_why(tmp_path):
    assert provenance.git_commit(str(tmp_path))[:2] == (None, None)
    assert "not in a git checkout" in provenance.git_commit(str(tmp_path))[2]
    inner = tmp_path / "repo" / "site-packages"      # an installed copy inside someone's repository
    inner.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path / "repo", check=True)
    commit, dirty, note = provenance.git_commit(str(inner))
    assert commit is None and dirty is None and "not the top of a git checkout" in note
