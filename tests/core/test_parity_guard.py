"""tests/conftest.py's guard: a skipped PyTorch parity test fails the run, other skips do not.

Each case runs pytest in a subprocess on a few small test files, with this repository's conftest.py
and pytest configuration, and with ``torch`` replaced on the module path: by a package whose import
fails as a missing module's does (torch not installed) or by an empty stub (torch installed).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PARITY_SKIPS = {
    "test_marked.py": "import pytest\n\n@pytest.mark.torch_parity\n"
                      "def test_marked_and_skipped():\n    pytest.skip('no oracle today')\n",
    "test_fixture.py": "def test_takes_the_fixture(torch):\n    assert torch\n",
    "test_unmarked.py": "import pytest\n\ndef test_importorskip_inside():\n"
                        "    pytest.importorskip('torch')\n",
    "test_module_level.py": "import pytest\n\ntorch = pytest.importorskip('torch')\n\n"
                            "def test_never_collected():\n    pass\n",
}
HARMLESS = {
    "test_other.py": "import pytest\n\ndef test_passes():\n    pass\n\n"
                     "def test_skips_for_another_reason():\n    pytest.skip('not a parity test')\n\n"
                     "@pytest.mark.torch_parity\ndef test_marked_and_passes():\n    pass\n",
}


def run_pytest(tmp_path, files, torch_source, *args):
    """pytest on ``files`` in tmp_path, with ``torch`` importing as ``torch_source`` says."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text(torch_source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(tmp_path / "shadow")
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"     # no nbval, no hypothesis: a faster start
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rfEs", *args, *files], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_a_skipped_parity_test_fails_the_run_and_says_why(tmp_path):
    code, out = run_pytest(tmp_path, {**PARITY_SKIPS, **HARMLESS},
                           "raise ModuleNotFoundError('torch is hidden for this test', name='torch')\n")
    assert code == 1, out
    assert "PyTorch parity tests skipped: the run fails" in out, out
    listed = out.split("PyTorch parity tests skipped")[1]
    for nodeid in ("test_marked.py::test_marked_and_skipped", "test_fixture.py::test_takes_the_fixture",
                   "test_unmarked.py::test_importorskip_inside", "test_module_level.py"):
        assert nodeid in listed, out
    assert "test_skips_for_another_reason" not in listed, out
    assert "torch is missing: `make test` installs it" in listed, out
    # -rs: every skip, parity or not, names its reason in the short summary
    assert "could not import 'torch': torch is hidden for this test" in out, out
    assert "not a parity test" in out and "no oracle today" in out, out
    assert "2 passed, 5 skipped" in out, out


def test_other_skips_pass_and_the_fixture_marks_its_tests(tmp_path):
    files = {**HARMLESS, "test_fixture.py": PARITY_SKIPS["test_fixture.py"]}
    code, out = run_pytest(tmp_path, files, "")                      # a torch that imports
    assert code == 0, out
    assert "parity tests skipped" not in out, out
    assert "3 passed, 1 skipped" in out, out
    code, out = run_pytest(tmp_path, {}, "", "-m", "torch_parity", *files)
    assert code == 0, out
    assert "2 passed, 2 deselected" in out, out                      # the fixture's test was marked
