"""A measurement in a fresh Python process: ``run_fresh(module, probe, **cfg)`` runs
``module.probe(**cfg)`` in a new interpreter with one BLAS thread and one tformer thread, and
returns its JSON result. Nothing an earlier measurement allocated (NumPy's, glibc's or the
per-thread scratch buffers of ``tformer.core.parallel``) is reused or left out of the count.
"""
import json
import os
import subprocess
import sys

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "TFORMER_NUM_THREADS": "1"}


def run_fresh(module, probe, **cfg):
    """``module.probe(**cfg)`` (its result JSON-able) in a fresh process; RuntimeError with the
    process's error output if it fails."""
    code = (f"import json, sys; from {module} import {probe}; "
            f"print(json.dumps({probe}(**json.loads(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)],
                         env=dict(os.environ, **ONE_THREAD), capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{module}.{probe} {cfg} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])
