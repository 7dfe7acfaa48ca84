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
- `NPY_DISABLE_CPU_FEATURES="<targets>"` turns off NumPy's dispatch targets above a level.

The two are chosen as a pair of **one instruction encoding**. Kernel sets from Sandybridge on and
NumPy's targets from X86_V3 on are VEX (or EVEX) encoded; the older kernel sets and NumPy's X86_V2
baseline are legacy SSE. On an Intel CPU, code of one encoding run after the other pays the
SSE/AVX transition penalty: measured on an Intel AVX-512 CPU, OpenBLAS Sandybridge with NumPy's
SSE baseline made TinyGPT's small step ten times slower (582 ms against 54 ms natively), while
AMD's Zen cores do not pay it. So the script forces the kernel set one rung below the CPU's own
(Haswell below AVX-512, Sandybridge below AVX2, Nehalem below Sandybridge, ...) and keeps NumPy's
targets only up to the encoding of that set (X86_V3 with a VEX set, the SSE baseline with an SSE
one). It then starts a small Python under that environment and checks three things, so that the
forced pass can never silently run the native arithmetic nor a pathological one: both settings
took effect, a float32 product and exp give other last bits than natively, and a small product
and exp loop is not many times slower than natively. Where nothing lower exists (not x86-64, or
a CPU older than any kernel set below it, or NumPy without OpenBLAS) it prints one line saying
why and exits 0 without running the command: only that pass is skipped.
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
FIRST_VEX = "Sandybridge"       # the first kernel set in VEX-encoded AVX; the older ones are SSE
FIRST_AVX512 = "SkylakeX"       # every AVX-512 set is forced down to Haswell (AVX2)
VEX_CAP = "X86_V3"              # NumPy's highest target kept beside a VEX kernel set (AVX2, FMA)
SLOW_LIMIT = 6                  # a forced pair this many times slower than native is refused
FORCED_VARS = ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES")

PROBE = """
import hashlib, json, time
import numpy as np
import threadpoolctl
umath = np._core._multiarray_umath
blas = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
rng = np.random.default_rng(0)
a = rng.standard_normal((256, 256)).astype(np.float32)
u = rng.standard_normal(1 << 16).astype(np.float32)
best = float("inf")
for _ in range(5):                      # a small product and two transcendental loops, best of 5,
    t = time.process_time()             # in CPU time: what other processes take does not count
    for _ in range(10):
        c, e, h = a @ a, np.exp(u), np.tanh(u)
    best = min(best, time.process_time() - t)
print(json.dumps({
    "blas": blas[0].get("internal_api") if blas else None,
    "core": blas[0].get("architecture") if blas else None,
    "baseline": list(umath.__cpu_baseline__),
    "dispatched": [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__.get(t)],
    "bits": {"product": hashlib.sha256(c.tobytes()).hexdigest()[:16],
             "exp": hashlib.sha256(e.tobytes() + h.tobytes()).hexdigest()[:16]},
    "seconds": best,
}))
"""


def probe(env):
    """What OpenBLAS and NumPy choose in a fresh interpreter started with `env`, their last bits
    of a float32 product and exp/tanh, and the time of a small loop of both."""
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the probe failed under {describe(env)}:\n{out.stderr.strip()}")
    return json.loads(out.stdout)


def describe(env):
    return " ".join(f"{k}={env[k]!r}" for k in FORCED_VARS if k in env) or "(native)"


def rung(core):
    """The index in LADDER of the instructions kernel set `core` needs, or None if unknown."""
    rungs = {name.lower(): i for i, name in enumerate(LADDER)}
    rungs |= {name.lower(): rungs[same.lower()] for name, same in SAME_AS.items()}
    return rungs.get(str(core).lower())


def lower_core(core):
    """The kernel set to force below `core`, or None if this script knows none below it: Haswell
    below every AVX-512 set, otherwise the rung just below."""
    r = rung(core)
    if r is None or r == 0:
        return None
    return "Haswell" if r >= LADDER.index(FIRST_AVX512) else LADDER[r - 1]


def core_encoding(core):
    """'VEX' for kernel sets in AVX encoding (Sandybridge on), 'SSE' for the older ones."""
    return "VEX" if rung(core) >= LADDER.index(FIRST_VEX) else "SSE"


def target_encoding(target):
    """'SSE' for NumPy's SSE-level targets (X86_V2 and the SSE* names), 'VEX' for the rest."""
    return "SSE" if target.startswith(("SSE", "SSSE", "X86_V2", "POPCNT")) else "VEX"


def numpy_encoding(dispatched):
    """The encoding of NumPy's fastest loops: VEX if any VEX target is dispatched, else SSE
    (its baseline)."""
    return "VEX" if any(target_encoding(t) == "VEX" for t in dispatched) else "SSE"


def disabled_targets(core, dispatched):
    """NumPy's targets to turn off beside kernel set `core`: with an SSE set every VEX target;
    with a VEX set below AVX-512 every target above X86_V3 (AVX-512's)."""
    if core_encoding(core) == "SSE":
        return [t for t in dispatched if target_encoding(t) == "VEX"]
    if rung(core) >= LADDER.index(FIRST_AVX512):
        return []
    return [t for t in dispatched if t.startswith(("X86_V4", "AVX512"))]


def check_one_encoding(core, dispatched):
    """Raise ValueError when kernel set `core` and NumPy's dispatched targets mix encodings."""
    a, b = core_encoding(core), numpy_encoding(dispatched)
    if a != b:
        raise ValueError(f"OpenBLAS kernel set {core} is {a}-encoded but NumPy dispatches "
                         f"{dispatched or 'only its baseline'} ({b}): on an Intel CPU every switch "
                         "between the two pays the SSE/AVX transition penalty")


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
    off = disabled_targets(core, native["dispatched"])
    if off:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(off)
    forced = probe(env)
    # OpenBLAS falls back to the native kernels for a name it does not know, and may run a kernel
    # set it has no build of under another name (Core2 as "Katmai"): what counts is that it changed.
    kept = [t for t in native["dispatched"] if t not in off]
    if forced["core"] == native["core"] or forced["dispatched"] != kept:
        raise RuntimeError(f"forcing {describe(env)} did not take effect: OpenBLAS chose "
                           f"{forced['core']!r}, NumPy dispatches {forced['dispatched']} "
                           f"(expected {kept})")
    check_one_encoding(forced["core"] if rung(forced["core"]) is not None else core,
                       forced["dispatched"])
    changed = [k for k in native["bits"] if native["bits"][k] != forced["bits"][k]]
    if not changed:
        raise RuntimeError(f"under {describe(env)} a float32 product and exp/tanh give the native "
                           "last bits: this pass would check nothing the first does not")
    slower = forced["seconds"] / max(native["seconds"], 1e-9)
    if slower > SLOW_LIMIT:
        raise RuntimeError(f"under {describe(env)} a small product and exp/tanh loop runs "
                           f"{slower:.0f} times slower than natively (limit {SLOW_LIMIT}): "
                           "a pathological pair, refused")
    chosen = forced["core"] if forced["core"] == core else f"{forced['core']} (for {core})"
    level = "+".join(forced["dispatched"]) or "+".join(native["baseline"])
    numpy_part = (f"NumPy up to {level} instead of {'+'.join(native['dispatched'])}" if off
                  else f"NumPy's own dispatch ({level or 'baseline'})")
    text = (f"OpenBLAS kernel set {chosen} instead of the native {native['core']}, {numpy_part}; "
            f"one encoding ({core_encoding(core)}), other last bits in: {', '.join(changed)}; "
            f"{slower:.1f}x the native time of a small product and exp loop")
    brief = f"OpenBLAS {chosen}, NumPy {level} ({core_encoding(core)})"
    return env, f"{text} ({describe(env)})", brief


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
