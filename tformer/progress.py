"""Progress bars that stay out of stored notebook outputs.

``TFORMER_PROGRESS=0`` in the environment (set by ``make execute`` and ``make test``) or
``enabled=False`` turns every bar off; otherwise a plain ``tqdm`` bar writes to stderr.
"""
import os

from tqdm import tqdm


def progress_enabled(enabled=None):
    """True unless turned off by the argument or by ``TFORMER_PROGRESS=0``."""
    if enabled is not None:
        return bool(enabled)
    return os.environ.get("TFORMER_PROGRESS", "1") not in ("0", "false", "False", "")


def progress(iterable=None, enabled=None, **kwargs):
    """``tqdm(iterable, ...)``, disabled as ``progress_enabled`` says."""
    return tqdm(iterable, disable=not progress_enabled(enabled), dynamic_ncols=True, **kwargs)
