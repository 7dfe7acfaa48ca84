"""tformer.core.rss: the resident set of this process (Linux)."""
import json
import subprocess
import sys

import pytest

from tformer.core.rss import status_bytes

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")

# Measured in a fresh interpreter: in the test process, the freed memory of earlier tests (glibc
# keeps it resident and hands it out again) could serve the new array without new pages, and the
# peak would not move (seen in a fresh-clone run: VmHWM +10 MiB for a 64 MiB array).
MEASURE = """
import json
import numpy as np
from tformer.core.rss import reset_peak, status_bytes
rss = status_bytes("VmRSS")
hwm0 = status_bytes("VmHWM")
a = np.ones(64 * 2**20 // 8)                                       # 64 MiB, touched
hwm = status_bytes("VmHWM")
del a
reset = reset_peak()
print(json.dumps(dict(rss=rss, hwm0=hwm0, hwm=hwm, reset=reset, after=status_bytes("VmHWM"))))
"""


@linux
def test_the_peak_sees_a_large_array_and_reset_lowers_it():
    out = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    m = json.loads(out)
    assert m["rss"] > 0 and m["hwm0"] >= m["rss"]
    assert m["hwm"] >= m["rss"] + 60 * 2**20
    if m["reset"]:
        assert m["after"] < m["rss"] + 60 * 2**20


@linux
def test_this_process_reads_its_own_status():
    rss = status_bytes("VmRSS")
    assert rss > 0 and status_bytes("VmHWM") >= rss


def test_an_unknown_entry_is_none():
    assert status_bytes("NoSuchEntry") is None
