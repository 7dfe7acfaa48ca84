"""The peak memory of one TinyGPT training step, predicted: the count of the chapter
Fitting in memory, as a function.

The chapter "Fitting in memory" counts what each kernel of a pre-norm block keeps for the
backward pass (``M_block``), the head's caches, the work arrays ``S`` of the backward pass and
the gradients in flight, and checks the sum against the ``tracemalloc`` peak of a real step
(within 3 % for T from 128 to 1024, ``book/data/fitting_in_memory.json``):

    M_off = s · (BTC + L·M_block + head + S + 7BTC)
    M_k   = s · (⌈L/k⌉·BTC + BTC + k·M_block + head + S + 7BTC)     (checkpointing, k blocks a segment)

with ``M_block = 8BTC + BHT² + 3BT·d_ff + 4BT``, ``head = BTC + 2BT + BTV``,
``S = BHT² + 2BT·d_ff + 2BTC`` and ``s`` bytes per number. The online-softmax kernel
(``attention="flash"``) stores no T×T probabilities: the ``BHT²`` terms drop out. The
parameters, their gradients and AdamW's two moments (``4·s·P``) are held for the whole run, on
top. ``python -m tformer run tinygpt`` refuses a run whose prediction exceeds the memory this
machine has available, before it allocates anything.
"""
import math
import os


def step_peak_bytes(B, T, C, H, d_ff, L, V, k=0, attention="plain", itemsize=4):
    """Predicted peak bytes of one training step (forward, loss, backward), parameters aside.

    ``k = 0``: no checkpointing; ``k ≥ 1``: gradient checkpointing in segments of ``k`` blocks."""
    P = B * H * T * T if attention == "plain" else 0            # the stored probabilities
    block = 8 * B * T * C + P + 3 * B * T * d_ff + 4 * B * T
    head = B * T * C + 2 * B * T + B * T * V
    work = P + 2 * B * T * d_ff + 2 * B * T * C
    in_flight = 7 * B * T * C
    if k == 0:
        return itemsize * (B * T * C + L * block + head + work + in_flight)
    k = min(k, L)
    return itemsize * (math.ceil(L / k) * B * T * C + B * T * C + k * block + head + work
                       + in_flight)


def training_bytes(n_parameters, itemsize=4):
    """Parameters, gradients and AdamW's two moments: held for the whole run."""
    return 4 * itemsize * n_parameters


def available_bytes():
    """The memory this machine can give a new process now (``MemAvailable`` of /proc/meminfo,
    else the physical memory), or None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n):
    """``n`` bytes as text in GiB (or TiB), for messages."""
    return f"{n / 2**40:.2f} TiB" if n >= 2**40 else f"{n / 2**30:.2f} GiB"
