"""Progress bars that show in a terminal and in JupyterLab, and stay out of stored outputs.

``progress(iterable)`` is a ``tqdm`` bar: a live widget (``tqdm.notebook``) inside a Jupyter kernel
that has ``ipywidgets`` (``make lab`` installs it), a text bar on stderr anywhere else.
``TFORMER_PROGRESS=0`` in the environment (set by ``make execute`` and ``make test``, so that no bar
reaches a stored or compared output) or ``enabled=False`` turns every bar off.
"""
import os
import sys

from tqdm import tqdm


def progress_enabled(enabled=None):
    """True unless turned off by the argument or by ``TFORMER_PROGRESS=0``."""
    if enabled is not None:
        return bool(enabled)
    return os.environ.get("TFORMER_PROGRESS", "1") not in ("0", "false", "False", "")


def in_widget_kernel():
    """True inside a Jupyter kernel (IPython's ``IPKernelApp``) where ``ipywidgets`` imports.

    Checked only when a bar is shown: ``tqdm.auto`` would instead warn at import time, with a
    file path, wherever ipywidgets is missing, and that warning would land in stored outputs.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or "IPKernelApp" not in shell.config:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def progress(iterable=None, enabled=None, **kwargs):
    """``tqdm(iterable, ...)``: a widget in a Jupyter kernel, text in a terminal, or off."""
    if not progress_enabled(enabled):
        return tqdm(iterable, disable=True, **kwargs)
    if in_widget_kernel():
        from tqdm.notebook import tqdm as notebook_tqdm
        return notebook_tqdm(iterable, **kwargs)
    return tqdm(iterable, dynamic_ncols=True, **kwargs)
