"""tformer.rss: the resident set of this process (Linux)."""
import gc
import sys

import numpy as np
import pytest

from tformer.rss import reset_peak, status_bytes

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


@linux
def test_the_peak_sees_a_large_array_and_reset_lowers_it():
    # Earlier tests may leave cyclic garbage holding large arrays: a collection that ran in the
    # middle of the measurement would free them and hide the new array's pages. Collect first,
    # and keep the collector off while measuring.
    gc.collect()
    gc.disable()
    try:
        rss = status_bytes("VmRSS")
        assert rss > 0 and status_bytes("VmHWM") >= rss
        a = np.ones(64 * 2**20 // 8)                               # 64 MiB, touched
        assert status_bytes("VmHWM") >= rss + 60 * 2**20
        del a
        if reset_peak():
            assert status_bytes("VmHWM") < rss + 60 * 2**20
    finally:
        gc.enable()


def test_an_unknown_entry_is_none():
    assert status_bytes("NoSuchEntry") is None
