"""Run a command under another CPU's floating-point arithmetic, forced on this machine.

    python tools/other_arithmetic.py                 # say which arithmetic would be forced
    python tools/other_arithmetic.py --brief         # the same in a few words, or "skipped: ..."
    python tools/other_arithmetic.py -- CMD ARGS...  # run CMD with it (make test-nbval-other)

NumPy's wheel ships OpenBLAS built for many CPUs: at start it picks the kernel set of the CPU it
runs on (Haswell for AVX2, SkylakeX for AVX-512, ...), and each kernel set sums a product in its
own order. NumPy itself dispatches exp, tanh, sums and friends by SIMD level. So the last bits of
a result depend on the CPU, and a reader's machine computes other last bits than the one that
executed the notebooks. Both choices can be forced downward on one machine:

- `OPENBLAS_CORETYPE=<kernel set>` makes OpenBLAS use an older CPU's kernels. Only *older* ones:
  a kernel set with instructions this CPU lacks crashes, and an unknown name is silently ignored.
- `NPY_DISABLE_CPU_FEATURES="<targets>"` turns off NumPy's dispatch targets above its baseline.

This script picks the kernel set one step below AVX2 when the machine has AVX2 or better
(Sandybridge: AVX without FMA, which differs from both common CI arithmetics, AVX2 and AVX-512),
otherwise the next older one it knows, and NumPy's baseline. It then starts a small Python under
that environment and checks that both took effect, so the forced pass can never silently run
the native arithmetic. Where nothing lower exists (not x86-64, or a CPU older than any kernel set
below it, or NumPy without OpenBLAS) it prints one line saying why and exits 0 without running
the command: only that pass is skipped.
"""

import json
import os
import platform
import subprocess
import sys

# OpenBLAS's x86-64 kernel sets, oldest first. A CPU can run its own set and every one before it.
LADDER = ["Prescott", "Core2", "Nehalem", "Sandybridge", "Haswell", "SkylakeX", "Cooperlake",
          "SapphireRapids"]
# Kernel sets named after other CPUs, mapped to the rung whose instructions they need.
SAME_AS = {"Penryn": "Core2", "Dunnington": "Core2", "Atom": "Core2", "Opteron": "Prescott",
           "Opteron_SSE3": "Prescott", "Barcelona": "Prescott", "Bobcat": "Prescott",
           "Bulldozer": "Sandybridge", "Piledriver": "Sandybridge", "Steamroller": "Sandybridge",
           "Excavator": "Sandybridge", "Zen": "Haswell"}
TARGET = "Sandybridge"          # forced on every CPU with AVX2 or better
FORCED_VARS = ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES")

PROBE = """
import json
import numpy as np
import threadpoolctl
umath = np._core._multiarray_umath
blas = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
print(json.dumps({
    "blas": blas[0].get("internal_api") if blas else None,
    "core": blas[0].get("architecture") if blas else None,
    "baseline": list(umath.__cpu_baseline__),
    "dispatched": [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__.get(t)],
}))
"""


def probe(env):
    """What OpenBLAS and NumPy choose in a fresh interpreter started with `env`."""
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the probe failed under {describe(env)}:\n{out.stderr.strip()}")
    return json.loads(out.stdout)


def describe(env):
    return " ".join(f"{k}={env[k]!r}" for k in FORCED_VARS if k in env) or "(native)"


def lower_core(core):
    """The kernel set to force below `core`, or None if this script knows none below it."""
    rungs = {name.lower(): i for i, name in enumerate(LADDER)}
    rungs |= {name.lower(): rungs[same.lower()] for name, same in SAME_AS.items()}
    rung = rungs.get(str(core).lower())
    if rung is None or rung == 0:
        return None
    return TARGET if rung >= LADDER.index("Haswell") else LADDER[rung - 1]


def choose(base_env):
    """(forced environment, description, a few words), or (None, why nothing is forced, None)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, (f"the CPU is {platform.machine()}, and the kernel sets this check forces "
                      "are x86-64 ones"), None
    native_env = {k: v for k, v in base_env.items() if k not in FORCED_VARS}
    native = probe(native_env)
    if native["blas"] != "openblas":
        return None, f"NumPy's BLAS is {native['blas']!r}, not OpenBLAS: no kernel set to force", \
            None
    core = lower_core(native["core"])
    if core is None:
        return None, (f"OpenBLAS runs kernel set {native['core']!r} here, and this check knows "
                      "no older one to force below it"), None
    env = dict(native_env, OPENBLAS_CORETYPE=core)
    if native["dispatched"]:                          # NumPy: its dispatch targets above baseline
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(native["dispatched"])
    forced = probe(env)
    # OpenBLAS falls back to the native kernels for a name it does not know, and may run a kernel
    # set it has no build of under another name (Core2 as "Katmai"): what counts is that it changed.
    if forced["core"] == native["core"] or forced["dispatched"]:
        raise RuntimeError(f"forcing {describe(env)} did not take effect: OpenBLAS chose "
                           f"{forced['core']!r}, NumPy still dispatches {forced['dispatched']}")
    chosen = forced["core"] if forced["core"] == core else f"{forced['core']} (for {core})"
    baseline = "+".join(native["baseline"])
    numpy_part = (f"NumPy's baseline {baseline} instead of {'+'.join(native['dispatched'])}"
                  if native["dispatched"] else f"NumPy's baseline {baseline}, as natively")
    text = f"OpenBLAS kernel set {chosen} instead of the native {native['core']}, {numpy_part}"
    return env, f"{text} ({describe(env)})", f"OpenBLAS {chosen}, NumPy {baseline}"


def main(argv):
    split = argv.index("--") if "--" in argv else len(argv)
    options, command = argv[:split], argv[split + 1:]
    if ("--" in argv and not command) or set(options) - {"--brief"}:
        sys.exit("usage: other_arithmetic.py [--brief] [-- COMMAND ARGS...]")
    env, text, brief = choose(dict(os.environ))
    if env is None:
        print(f"skipped: no other CPU's arithmetic to force, because {text}", flush=True)
        return 0
    print(brief if "--brief" in options else f"another CPU's arithmetic: {text}", flush=True)
    return subprocess.run(command, env=env).returncode if command else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
