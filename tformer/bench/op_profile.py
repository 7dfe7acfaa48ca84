"""Per-op profile of one TinyGPT training step: where the milliseconds go.

    python -m tformer.bench.op_profile [--size small|medium|large] [--steps N] [--clock wall|cpu]

Every kernel of ``tformer.nn.functional`` (``linear_forward``, ``attention_backward``, ...), the
``forward`` and ``backward`` of every layer class, ``cross_entropy``, ``zero_grad`` and the optimizer's
``step`` are wrapped by a timer while the profile runs (and restored afterwards). A timer stack
gives each call its *exclusive* (self) time: a layer's own time is its time minus that of the
kernels it calls, so ``MultiHeadAttention.backward`` shows the glue around the kernels (head
reshapes, copies) and the self times add up to the step. Inside ``attention_forward`` and
``attention_backward`` the nested softmax kernels are timed on their own, so what remains there is
the batched per-head matrix products (two forward, four backward) and the mask.
"""
import argparse
import contextlib
import functools
import sys
import threading
import time

import numpy as np

from tformer.nn import functional as F
from tformer.fast import activations as _fact, dropout as _fdrop, embedding as _femb, layernorm as _fln
from tformer.fast import attention as _fatt, linear as _flin

_LAYER_CLASSES = ("Linear", "Embedding", "LayerNorm", "Dropout", "Activation", "FeedForward")


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


class Profiler:
    """Accumulates exclusive seconds and call counts per name.

    ``clock="wall"`` times with ``perf_counter``; ``clock="cpu"`` with ``thread_time``, the CPU time
    of the calling thread, which other processes on a busy machine do not inflate. It is the right
    clock only when BLAS runs on the calling thread (``OPENBLAS_NUM_THREADS=1``).
    """

    def __init__(self, clock="wall"):
        self.self_time, self.calls, self._stack = {}, {}, []
        self.clock = CLOCKS[clock]
        self._thread = threading.current_thread()

    def wrap(self, name, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if threading.current_thread() is not self._thread:
                return fn(*args, **kwargs)               # a part on a tformer.core.parallel worker: its
                                                         # wall time is inside its caller's already
            self._stack.append(0.0)                      # time spent in children of this call
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = self.clock() - t0
                child = self._stack.pop()
                self.self_time[name] = self.self_time.get(name, 0.0) + dt - child
                self.calls[name] = self.calls.get(name, 0) + 1
                if self._stack:
                    self._stack[-1] += dt
        return timed


@contextlib.contextmanager
def instrument(prof):
    """Patch the kernels, layer methods and optimizer step with ``prof``'s timers; undo on exit."""
    from tformer.nn import attention, blocks, layers
    from tformer.training import optim
    from tformer.models import tinygpt
    patched = []

    def patch(owner, attr, name):
        if hasattr(owner, attr) and attr in vars(owner):
            orig = getattr(owner, attr)
            patched.append((owner, attr, orig))
            setattr(owner, attr, prof.wrap(name, orig))

    for name in F.__all__:
        if name.endswith(("_forward", "_backward")) or name == "cross_entropy":
            patch(F, name, name)
    # the layers call these directly (tformer.fast), not through F
    for mod in (_fln, _femb, _fdrop, _fact, _flin, _fatt):
        for name in F.__all__:
            if name.endswith(("_forward", "_backward")):
                patch(mod, name, name)
    # called inside the attention kernel
    for name in ("_softmax_inplace", "_softmax_shifted_inplace", "_softmax_backward_inplace"):
        patch(_fatt, name, name.lstrip("_"))
    classes = [getattr(layers, c) for c in _LAYER_CLASSES]
    classes += [attention.MultiHeadAttention, blocks.PreNormBlock, tinygpt.TinyGPT]
    for cls in classes:
        for meth in ("forward", "backward"):
            # Activation binds its kernel at construction, so its self time IS the kernel's.
            label = f"activation_{meth} (gelu)" if cls is layers.Activation else f"{cls.__name__}.{meth} (glue)"
            patch(cls, meth, label)
    patch(layers.Module, "zero_grad", "zero_grad")
    patch(optim.Optimizer, "step", "AdamW.step")
    try:
        yield prof
    finally:
        for owner, attr, orig in reversed(patched):
            setattr(owner, attr, orig)


def profile_step(model, opt, x, y, steps=3, warmup=1, clock="wall"):
    """Profile ``steps`` training steps; returns ``(rows, step_seconds)`` with rows
    ``(name, ms per step, calls per step, fraction of the step)`` sorted by time, largest first."""
    from tformer.bench.workload import tformer_step_fn
    step = tformer_step_fn(model, opt, x, y)
    for _ in range(warmup):
        step()
    prof = Profiler(clock)
    with instrument(prof):
        t0 = prof.clock()
        for _ in range(steps):
            step()
        total = (prof.clock() - t0) / steps
    rows = [(n, t / steps * 1e3, prof.calls[n] / steps, t / steps / total)
            for n, t in prof.self_time.items()]
    rows.sort(key=lambda r: -r[1])
    covered = sum(r[1] for r in rows)
    rows.append(("(untimed: step body)", total * 1e3 - covered, 1, 1 - covered / (total * 1e3)))
    return rows, total


def group(rows):
    """Coarse categories: matrix products (linear), attention, softmax, layernorm, gelu, loss,
    optimizer, embedding, glue (the layers' own Python around their kernels), untimed (the rest
    of the step body; with the batch cut across threads, mostly the wait for the other parts).
    Returns ``{category: ms per step}``."""
    cats = {}
    for name, ms, _, _ in rows:
        key = ("linear" if name.startswith("linear") else
               "attention matmuls" if name.startswith("attention") else
               "softmax" if name.startswith("softmax") else
               "layernorm" if name.startswith("layernorm") else
               "gelu" if name.startswith(("gelu", "activation")) else
               "cross-entropy" if name == "cross_entropy" else
               "AdamW" if name == "AdamW.step" else
               "embedding" if name.startswith("embedding") else
               "zero_grad" if name == "zero_grad" else
               "untimed" if name.startswith("(untimed") else "glue")
        cats[key] = cats.get(key, 0.0) + ms
    return dict(sorted(cats.items(), key=lambda kv: -kv[1]))


def build(size):
    """A float32 TinyGPT of a benchmark size, its AdamW, and one batch ``(x, y)``."""
    from tformer.training.optim import AdamW
    from tformer.bench.workload import OPT, SIZES, batch, tinygpt
    s = SIZES[size]
    model = tinygpt(size)
    x, y = batch(s["B"], s["T"])
    return model, AdamW(model, **OPT), x, y


def main(argv=None):
    from tformer.runs.flag_groups import Flag, add_training_flags
    p = argparse.ArgumentParser(description="Per-op profile of one TinyGPT training step.")
    p.add_argument("--size", default="small", choices=("small", "medium", "large"))
    add_training_flags(p, steps=Flag(5, "profiled training steps"))
    p.add_argument("--clock", default="wall", choices=sorted(CLOCKS),
                   help="wall time, or the thread's CPU time (right with OPENBLAS_NUM_THREADS=1)")
    a = p.parse_args(argv)
    model, opt, x, y = build(a.size)
    rows, total = profile_step(model, opt, x, y, steps=a.steps, clock=a.clock)
    np.set_printoptions(precision=3)
    print(f"{a.size}: {total * 1e3:.1f} ms per step (profiled)")
    print(f"{'op':<38} {'ms/step':>8} {'calls':>6} {'share':>6}")
    for name, ms, calls, frac in rows:
        print(f"{name:<38} {ms:8.2f} {calls:6.0f} {frac * 100:5.1f}%")
    print("by category:", ", ".join(f"{k} {v:.1f} ms" for k, v in group(rows).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
