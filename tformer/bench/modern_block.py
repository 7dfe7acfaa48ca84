"""Time the modern block's pieces against TinyGPT's own, interleaved, and print ratios (The modern block).

    OPENBLAS_NUM_THREADS=1 TFORMER_NUM_THREADS=1 python -m tformer.bench.modern_block [--repeats 15]

1. Causal attention, forward + backward, float32, B=8, H=8, T=256, D=32: multi-head (H_kv = 8),
   grouped-query with H_kv = 2 and 1, and, as the copy it avoids, H_kv = 2 done by repeating K and
   V to 8 heads (``np.repeat``), running multi-head attention and summing dK, dV over each group.
2. Kernel pairs, forward + backward, float32 on (B·T, C) = (2048, 256): LayerNorm against RMSNorm;
   GELU on (2048, 1024) against SwiGLU on two (2048, 683) halves (the same parameter budget);
   RoPE on q and k (8, 8, 256, 32) each.
3. One TinyGPT training step (zero_grad, forward, cross-entropy, backward, AdamW) at the size of
   ``python -m tformer run tinygpt`` (C=128, 4 heads, 3 layers, T=64, B=64): TinyGPT's own block,
   each modern option alone, and all of them (SwiGLU at d_ff = swiglu_hidden(4C)).

Each case's calls are interleaved round-robin with the others of its group, so that a load change
on a shared machine hits every case alike; medians are reported, and ratios to the group's first.
"""
import argparse
import statistics
import time

import numpy as np

from tformer.nn import functional as F
from tformer.models.tinygpt import TinyGPT
from tformer.nn.modern_layers import swiglu_hidden
from tformer.training.optim import AdamW
from tformer.training.batch_threads import BatchCut


def attention_cases(rng):
    B, H, T, D = 8, 8, 256, 32
    q = rng.standard_normal((B, H, T, D)).astype(np.float32)
    dy = rng.standard_normal((B, H, T, D)).astype(np.float32)
    cases = {}
    for H_kv in (8, 2, 1):
        k = rng.standard_normal((B, H_kv, T, D)).astype(np.float32)
        v = rng.standard_normal((B, H_kv, T, D)).astype(np.float32)

        def gqa(k=k, v=v):
            _, c = F.attention_forward(q, k, v, is_causal=True)
            F.attention_backward(dy, c)
        cases[f"attention H_kv={H_kv}" + (" (multi-head)" if H_kv == H else "")] = gqa
    k2 = rng.standard_normal((B, 2, T, D)).astype(np.float32)
    v2 = rng.standard_normal((B, 2, T, D)).astype(np.float32)

    def repeated():
        G = H // 2
        _, c = F.attention_forward(q, np.repeat(k2, G, 1), np.repeat(v2, G, 1), is_causal=True)
        _, dk, dv = F.attention_backward(dy, c)
        dk.reshape(B, 2, G, T, D).sum(2), dv.reshape(B, 2, G, T, D).sum(2)
    cases["attention H_kv=2 by repeating K, V"] = repeated
    return cases


def kernel_cases(rng):
    N, C = 2048, 256
    x = rng.standard_normal((N, C)).astype(np.float32)
    gamma, beta = np.ones(C, np.float32), np.zeros(C, np.float32)
    h = rng.standard_normal((N, 4 * C)).astype(np.float32)
    ab = rng.standard_normal((N, 2 * swiglu_hidden(4 * C))).astype(np.float32)
    Fh = swiglu_hidden(4 * C)
    qk = rng.standard_normal((8, 8, 256, 32)).astype(np.float32)

    def layernorm():
        _, c = F.layernorm_forward(x, gamma, beta)
        F.layernorm_backward(x, c)

    def rmsnorm():
        _, c = F.rmsnorm_forward(x, gamma)
        F.rmsnorm_backward(x, c)

    def gelu():
        _, c = F.gelu_forward(h)
        F.gelu_backward(h, c)

    def swiglu():
        y, c = F.swiglu_forward(ab[:, :Fh], ab[:, Fh:])
        F.swiglu_backward(y, c)

    def rope():
        for _ in range(2):                                                   # q and k
            y, c = F.rope_forward(qk)
            F.rope_backward(y, c)
    return {"layernorm (2048, 256)": layernorm, "rmsnorm (2048, 256)": rmsnorm,
            "gelu (2048, 1024)": gelu, "swiglu (2048, 2 x 683)": swiglu, "rope q and k (8, 8, 256, 32)": rope}


def step_cases(rng):
    C, H, L, T, B = 128, 4, 3, 64, 64
    x, y = rng.integers(0, 256, (B, T)), rng.integers(0, 256, (B, T))
    options = {"TinyGPT": {}, "rmsnorm": {"norm": "rmsnorm"}, "rope": {"positions": "rope"},
               "sinusoidal": {"positions": "sinusoidal"},
               "swiglu (d_ff 341)": {"mlp": "swiglu", "d_ff": swiglu_hidden(4 * C)},
               "n_kv_heads=1": {"n_kv_heads": 1}, "tied": {"tie_embeddings": True},
               "all modern": {"norm": "rmsnorm", "positions": "rope", "mlp": "swiglu",
                              "d_ff": swiglu_hidden(4 * C), "n_kv_heads": 1, "tie_embeddings": True}}
    cases = {}
    for name, kw in options.items():
        model = TinyGPT(d_model=C, n_heads=H, n_layers=L, max_len=T, seed=0, **kw)
        opt = AdamW(model, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

        def step(model=BatchCut(model), opt=opt):          # run as tformer.training.train runs it
            model.zero_grad()
            _, d = F.cross_entropy(model.forward(x), y)
            model.backward(d)
            opt.step()
        cases[f"TinyGPT step, {name} ({model.num_parameters():,} parameters)"] = step
    return cases


def interleaved(cases, repeats, warmup=2):
    """Median seconds per case, the cases called round-robin."""
    times = {name: [] for name in cases}
    for r in range(warmup + repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv=None):
    from tformer.runs.flag_groups import Flag, add_timing_flags
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_flags(p, repeats=Flag(15, "timed calls per case (after 2 warm-up calls)"))
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    for title, cases in (("attention, forward + backward", attention_cases(rng)),
                         ("kernels, forward + backward", kernel_cases(rng)),
                         ("training step", step_cases(rng))):
        med = interleaved(cases, args.repeats)
        first = next(iter(med.values()))
        print(f"\n{title} (median of {args.repeats}; ratio to the first line)")
        for name, t in med.items():
            print(f"  {name:60s} {1e3 * t:8.2f} ms   {t / first:5.2f}")


if __name__ == "__main__":
    main()
