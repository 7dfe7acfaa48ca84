"""Greedy generation with a TinyGPT: tformer with its KV cache, without it, and PyTorch with a cache.

The model is the medium benchmark size (C = 256, 8 heads, 4 layers) with room for the prompt and
the new tokens (``max_len = prompt + new``); weights are the seed-0 initialisation (speed does not
depend on training). Each side decodes ``new`` tokens greedily after a prompt of random bytes:

- ``tformer``: ``tformer.decoding.generate.greedy`` (KV cache: the prompt once, then one token per step);
- ``tformer_nocache``: the same call with ``use_cache=False`` (the whole prefix every step);
- ``torch``: ``torch_gpt.greedy_kv``, the loop a PyTorch user writes (``torch.inference_mode``,
  a list of (k, v) tensors grown with ``torch.cat``).

Reported per side: the median wall time of ``reps`` generations after one short warm-up, and
tokens per second = B · new / time. The torch worker first checks the two models against each
other: tformer's generated tokens, fed through PyTorch's cached decoding, give the same logits at
every step (to float32 rounding).
"""
import statistics
import time

from tformer.bench.workload import VOCAB

CONFIG = dict(d_model=256, n_heads=8, n_layers=4)           # the medium size of training.SIZES


def model_and_prompt(B, prompt_len, new):
    """The seed-0 float32 TinyGPT with ``max_len = prompt_len + new`` and a (B, prompt_len) prompt."""
    import numpy as np

    from tformer.models.tinygpt import TinyGPT
    model = TinyGPT(**CONFIG, max_len=prompt_len + new, vocab_size=VOCAB, seed=0)
    prompt = np.random.default_rng(B).integers(0, VOCAB, (B, prompt_len))
    return model, prompt


def _median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def worker_tformer(B, prompt_len, new, reps, cache=True):
    """Time ``greedy`` with (``cache=True``) or without the KV cache."""
    from tformer.core import parallel
    from tformer.decoding.generate import greedy
    model, prompt = model_and_prompt(B, prompt_len, new)
    greedy(model, prompt, min(8, new), use_cache=cache)                         # warm-up
    out = None

    def run():
        nonlocal out
        out = greedy(model, prompt, new, use_cache=cache)
    t, times = _median_time(run, reps)
    return dict(seconds=t, times=times, tokens_per_s=B * new / t, tformer_threads=parallel.get_num_threads(),
                tokens=out[:, prompt_len:].tolist())


def check_against_tformer(model, tm, prompt, n_check=32):
    """Largest |Δ logit| / max |logit| between tformer's cached decoding and PyTorch's, both fed
    the tokens that tformer's greedy decoding picks (so one near-tie cannot send them apart)."""
    import numpy as np
    import torch

    from tformer.decoding import kv_cache
    from tformer.decoding.generate import greedy
    tokens = greedy(model, prompt, n_check)                                     # (B, T0 + n_check)
    T0 = prompt.shape[1]
    caches = kv_cache.new_caches(model.eval(), prompt.shape[0])
    ours = [model.forward(tokens[:, :T0], kv_cache=caches)[:, -1]]
    for t in range(T0, tokens.shape[1] - 1):
        ours.append(model.forward(tokens[:, t:t + 1], kv_cache=caches)[:, -1])
    with torch.inference_mode():
        logits, past = tm.decode(torch.from_numpy(tokens[:, :T0]))
        theirs = [logits[:, -1].numpy()]
        for t in range(T0, tokens.shape[1] - 1):
            logits, past = tm.decode(torch.from_numpy(tokens[:, t:t + 1]), past)
            theirs.append(logits[:, -1].numpy())
    a, b = np.stack(ours), np.stack(theirs)                                     # (steps, B, V)
    return float(np.abs(a - b).max() / np.abs(a).max())


def worker_torch(B, prompt_len, new, reps, threads):
    """Check the twin (``check_against_tformer`` < 1e-4), then time ``greedy_kv``."""
    import torch

    from tformer.bench.torch_gpt import from_tinygpt, greedy_kv
    if threads is not None:
        torch.set_num_threads(threads)
    model, prompt = model_and_prompt(B, prompt_len, new)
    tm = from_tinygpt(model).eval()
    err = check_against_tformer(model, tm, prompt, n_check=min(32, new))
    if not err < 1e-4:
        raise AssertionError(f"generation: tformer and torch logits differ by {err:.2e} (relative)")
    p = torch.from_numpy(prompt)
    greedy_kv(tm, p, min(8, new))                                               # warm-up
    out = None

    def run():
        nonlocal out
        out = greedy_kv(tm, p, new)
    t, times = _median_time(run, reps)
    return dict(seconds=t, times=times, tokens_per_s=B * new / t, logit_check=err,
                torch_threads=torch.get_num_threads(), tokens=out[:, prompt_len:].tolist())
