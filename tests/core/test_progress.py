"""tformer.core.progress: a widget in a Jupyter kernel with ipywidgets, text elsewhere, off on request."""
import sys
import types
from pathlib import Path

import pytest
from tqdm import tqdm
from tqdm.notebook import tqdm as notebook_tqdm

from tformer.core.progress import in_widget_kernel, progress, progress_enabled


def fake_ipython(monkeypatch, kernel):
    shell = types.SimpleNamespace(config={"IPKernelApp": {}} if kernel else {})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))


def test_off_by_environment_and_by_argument(monkeypatch):
    monkeypatch.setenv("TFORMER_PROGRESS", "0")
    assert not progress_enabled() and progress(range(3)).disable
    assert progress_enabled(True)
    monkeypatch.setenv("TFORMER_PROGRESS", "1")
    assert progress_enabled() and progress(range(3), enabled=False).disable


def test_text_bar_outside_a_kernel(monkeypatch):
    monkeypatch.setenv("TFORMER_PROGRESS", "1")
    fake_ipython(monkeypatch, kernel=False)          # a terminal IPython is not a kernel
    assert not in_widget_kernel()
    bar = progress(range(3), file=sys.stderr)
    assert type(bar) is tqdm and not bar.disable
    assert list(bar) == [0, 1, 2]


def test_widget_bar_in_a_kernel_with_ipywidgets(monkeypatch):
    pytest.importorskip("ipywidgets", reason="ipywidgets comes with requirements-lab.txt")
    monkeypatch.setenv("TFORMER_PROGRESS", "1")
    fake_ipython(monkeypatch, kernel=True)
    assert in_widget_kernel()
    bar = progress(range(2), display=False)          # builds the widget without showing it
    assert isinstance(bar, notebook_tqdm)
    assert list(bar) == [0, 1] and bar.container.children[1].value == 2    # the bar at its end


def test_text_bar_in_a_kernel_without_ipywidgets(monkeypatch):
    monkeypatch.setenv("TFORMER_PROGRESS", "1")
    fake_ipython(monkeypatch, kernel=True)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)      # import ipywidgets now fails
    assert not in_widget_kernel()
    bar = progress(range(2), file=sys.stderr)
    assert type(bar) is tqdm


def test_the_widget_pin_is_the_same_for_the_tests_and_the_lab():
    root = Path(__file__).resolve().parents[2]

    def pin(name):
        lines = (root / name).read_text().splitlines()
        return [line for line in lines if line.startswith("ipywidgets==")]

    assert pin("requirements-test.txt") == pin("requirements-lab.txt") != []
