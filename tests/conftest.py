"""The PyTorch oracle may not go missing: a skipped parity test fails the run.

Every gradient in the book is checked three ways (SymPy, finite differences, PyTorch in float64).
The PyTorch check is a *parity test*: a test marked ``@pytest.mark.torch_parity``, or one that takes
the ``torch`` fixture below (it is marked automatically), or one that calls
``pytest.importorskip("torch")`` (its skip counts, marker or not). Where torch cannot be imported
such a test is skipped with its reason, as any test would be, and at the end of the session the run
fails with a list of them: a machine without the oracle can no longer pass silently.
``make test`` installs torch (requirements-test.txt), so there every parity test runs.

A new parity test needs only::

    def test_my_kernel_matches_torch(torch):
        ...
"""
import pytest

# The reason pytest.importorskip gives when the import fails ("could not import 'torch': ...").
TORCH_MISSING = "could not import 'torch'"
INSTALL_HINT = ("`make test` installs it (requirements-test.txt); by hand: "
                ".venv/bin/pip install -r requirements-test.txt")


@pytest.fixture(scope="session")
def torch():
    """The ``torch`` module, the float64 oracle. Skips the test (and so fails the run) without it."""
    return pytest.importorskip("torch")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "torch" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.torch_parity)


def _reason(report):
    """The skip reason of a skipped report ("Skipped: " prefix removed)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


class ParityGuard:
    """Collects the parity tests that were skipped and turns the session's outcome into a failure."""

    def __init__(self):
        self.skipped = []          # (node id, reason)

    def pytest_runtest_logreport(self, report):
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        reason = _reason(report)
        if "torch_parity" in report.keywords or reason.startswith(TORCH_MISSING):
            self.skipped.append((report.nodeid, reason))

    def pytest_collectreport(self, report):
        # A module that calls pytest.importorskip("torch") at import time is skipped whole.
        if report.skipped and _reason(report).startswith(TORCH_MISSING):
            self.skipped.append((report.nodeid, _reason(report)))

    def pytest_sessionfinish(self, session, exitstatus):
        if self.skipped and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if not self.skipped:
            return
        tr = terminalreporter
        tr.section("PyTorch parity tests skipped: the run fails", sep="=", red=True, bold=True)
        tr.line(f"{len(self.skipped)} parity test(s) or module(s) did not run, so tformer was not "
                f"checked against PyTorch.", red=True)
        for nodeid, reason in self.skipped:
            tr.line(f"  {nodeid}: {reason}")
        if any(reason.startswith(TORCH_MISSING) for _, reason in self.skipped):
            tr.line(f"torch is missing: {INSTALL_HINT}")


def pytest_configure(config):
    config.pluginmanager.register(ParityGuard(), "torch_parity_guard")


# --- shared builders: a tiny TinyGPT, token ids, every parameter random ----------------------------
# Factory fixtures: a test names ``tiny``, ``tokens`` or ``randomize`` among its arguments and
# calls it. One definition for every test of TinyGPT (its own tests, the modern block's, post-norm's).

@pytest.fixture
def tiny():
    """``tiny(n_heads=4, dtype=float64, seed=0, **kw)``: a TinyGPT of d_model 8, 2 layers,
    max_len 12 (any keyword of TinyGPT overrides)."""
    import numpy as np

    from tformer.models.tinygpt import TinyGPT

    def make(n_heads=4, dtype=np.float64, seed=0, **kw):
        return TinyGPT(**dict(dict(d_model=8, n_heads=n_heads, n_layers=2, max_len=12, seed=seed,
                                   dtype=dtype), **kw))
    return make


@pytest.fixture
def tokens():
    """``tokens(B, T, seed=0, V=256)``: token ids drawn uniformly from [0, V), shape (B, T)."""
    import numpy as np
    return lambda B, T, seed=0, V=256: np.random.default_rng(seed).integers(0, V, (B, T))


@pytest.fixture
def randomize():
    """``randomize(model, seed=1, scale=0.3)``: every parameter random (gains near 1, a tied
    matrix drawn once), so that no gradient is trivially zero; returns the model."""
    import numpy as np

    def draw(model, seed=1, scale=0.3):
        rng = np.random.default_rng(seed)
        for name, p, _ in model._unique_parameters():
            p[...] = (1.0 if name.endswith("gamma") else 0.0) + scale * rng.standard_normal(p.shape)
        return model
    return draw
