"""``python -m tformer fewer-bits``: the measurements of the chapter "Fewer bits", into one JSON file.

1. The default TinyGPT run of ``python -m tformer run tinygpt`` in each precision (``--precision
   fp32``, ``fp16``, ``bf16``; same seed, same data, same steps): the loss of every step, the loss
   scale, the skipped steps, the evaluations, the final validation bits/byte.
2. The memory of one training step in each precision (tracemalloc) and its time (the precisions
   interleaved, round after round, so that a machine's load falls on all of them alike).
3. What a product and an elementwise operation cost in each format (why low precision is slower
   here).
4. int8 quantization of the float32 model: file sizes, validation bits/byte, generation speed.

The file holds the configuration and the git commit it ran on; the chapter "Fewer bits" reads it and
re-runs the first steps of one configuration live. About 40 minutes on 2 busy cores.
"""
import argparse
import os
import platform
import functools
import statistics
import tempfile
import time
import tracemalloc

import numpy as np

from tformer.nn import functional as F
from tformer.core import parallel
from tformer.core.dtypes import bfloat16, float16, matmul
from tformer.core.atomic import jsonable, write_json
from tformer.training.checkpoint import save_checkpoint
from tformer.data.text import encode
from tformer.decoding.generate import sample
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW, clip_grad_norm, cosine_with_warmup
from tformer.training.batch_threads import BatchCut, Replicas
from tformer.training.precision import precision_policy
from tformer.core.provenance import record
from tformer.decoding.quantize import quantize_model, save_quantized
from tformer.training.train import train
from tformer.runs import tinygpt
from tformer.runs.quantize_cmd import float32_weights_bytes, val_bpb
from tformer.runs.flag_groups import (Flag, add_output_flags, add_sampling_flags, add_timing_flags,
                                      add_training_flags)
from tformer.runs.flags import positive_int
from tformer.core.timing import best_seconds as _time, interleaved

PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_OUT = "book/data/fewer_bits.json"


def batch_cut(model, a):
    """Did ``train`` cut this run's batches across threads (``tformer.training.batch_threads``)?"""
    return Replicas(model).split(a.batch_size, a.max_len) is not None


def add_arguments(p):
    """The command's flags."""
    add_output_flags(p, out=DEFAULT_OUT)
    add_training_flags(p, steps=Flag(None, "training steps (default: run tinygpt's)"))
    add_timing_flags(p, time_rounds=Flag(5, "interleaved rounds of the step timing"))
    p.add_argument("--time-steps", type=positive_int, default=3, help="steps per precision and round")
    add_sampling_flags(p, gen_tokens=Flag(64, "bytes generated per timing of generation"))


def check_flags(args):
    """``--gen-tokens`` times at least one token."""
    if args.gen_tokens < 1:
        raise ValueError(f"--gen-tokens: expected at least 1 token to time, got {args.gen_tokens}")


def files(args):
    """What the command writes (``tformer.runs.declare``): ``--out``."""
    from tformer.runs.declare import writes
    return [writes("--out", args.out)]


def run_args(argv=()):
    """The flags of ``python -m tformer run tinygpt`` as a Namespace: its defaults, then ``argv``."""
    p = argparse.ArgumentParser()
    tinygpt.add_arguments(p)
    return p.parse_args(list(argv))


def build(args):
    """The data, model, precision policy and optimizer of ``run tinygpt`` for ``args``."""
    data = tinygpt.data_for(args)
    model = TinyGPT(d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers,
                    max_len=args.max_len, seed=args.seed)
    precision = precision_policy(model, args.precision, args.init_scale)
    opt = AdamW(model, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=args.weight_decay)
    return data, model, precision, opt


def train_tinygpt(args, stop=None, progress_bar=None):
    """Train as ``python -m tformer run tinygpt`` does (same data, model, optimizer, schedule,
    clipping, evaluations): returns ``(model, precision, hist)``.

    ``stop``: end after that step, with the learning-rate schedule still planned for ``args.steps``,
    so the result is the first ``stop`` steps of the full run.
    """
    data, model, precision, opt = build(args)
    warmup = max(0, min(args.warmup, args.steps - 1))

    def schedule(step):
        return cosine_with_warmup(step, args.lr, warmup, args.steps, args.min_lr)

    hist = train(model, opt, data.batch, tinygpt.forward_loss, stop or args.steps, clip_norm=args.clip,
                 lr_schedule=schedule, evaluate=tinygpt.make_evaluate(data, args.eval_windows),
                 eval_every=args.eval_every, progress_bar=progress_bar, desc=f"tinygpt {args.precision}",
                 precision=precision)
    return model, precision, hist


def _step(model, precision, opt, batch, clip):
    """One training step outside ``train`` (for the memory and time measurements)."""
    x, y = batch
    model.zero_grad()
    loss, dout = F.cross_entropy(model.forward(x), y)
    if precision is not None:
        precision.backward(model, dout)
    else:
        model.backward(dout)
    if precision is None or precision.unscale_():
        clip_grad_norm(model, clip)
        opt.step()
        if precision is not None:
            precision.refresh()
    return loss


def step_memory(args):
    """Bytes of one training step, measured with tracemalloc (NumPy reports its allocations to it),
    which starts after the data is read and before the model is built:

    - ``persistent_bytes``: what exists between steps, after one step: parameters, low-precision
      copies, gradients, optimizer state, and the last step's caches (the model keeps them until
      the next forward pass replaces them);
    - ``activations_bytes``: what the first forward pass of a fresh model keeps for the backward
      pass (its caches and the logits);
    - ``step_peak_bytes``: the peak of everything during a later step (persistent arrays, the
      previous step's caches until they are replaced, activations, temporaries).

    The persistent arrays are also counted exactly: ``masters_bytes`` ... ``adam_state_bytes``.
    """
    data = tinygpt.data_for(args)
    batches = [data.batch(0), data.batch(1)]
    tracemalloc.start()
    try:
        _, model, precision, opt = build(args)
        base = tracemalloc.get_traced_memory()[0]
        logits = model.forward(batches[0][0])
        kept = tracemalloc.get_traced_memory()[0] - base             # caches + logits
        del logits
        _step(model, precision, opt, batches[0], args.clip)           # optimizer scratch exists now
        persistent = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        _step(model, precision, opt, batches[1], args.clip)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    P = model.num_parameters()
    low = 0 if precision is None else P * precision.dtype.itemsize
    return {"parameters": P, "masters_bytes": 4 * P, "low_copies_bytes": low, "grads_bytes": 4 * P,
            "adam_state_bytes": 8 * P, "persistent_bytes": persistent, "activations_bytes": kept,
            "step_peak_bytes": peak}


def step_times(argsets, rounds, steps):
    """Seconds per training step of each configuration, measured in interleaved rounds: the
    median over rounds of each round's mean. ``argsets``: {name: args}."""
    setups = {}
    for name, args in argsets.items():
        data, model, precision, opt = build(args)
        model = BatchCut(model)                                       # as tformer.training.train runs it
        _step(model, precision, opt, data.batch(0), args.clip)        # warm-up
        setups[name] = (model, precision, opt, [data.batch(i) for i in range(steps)], args.clip)
    def run_steps(model, precision, opt, batches, clip):
        for b in batches:
            _step(model, precision, opt, b, clip)
    times = interleaved({name: functools.partial(run_steps, *s) for name, s in setups.items()},
                        rounds)
    times = {name: [t / steps for t in ts] for name, ts in times.items()}      # per step
    return {name: {"median_s": statistics.median(ts), "rounds_s": ts} for name, ts in times.items()}


def kernel_costs(N=4096, K=128, M=512, seed=0):
    """Why low precision is slower on this CPU: one product of TinyGPT's first MLP layer (N×K
    times K×M) in float32 BLAS, through ``matmul`` in float16/bfloat16 (upcast, float32 BLAS,
    round), and NumPy's own float16 product (no BLAS; on 256 rows); nanoseconds per element of a
    conversion and of an addition in each format; PyTorch's bfloat16 product if it is installed."""
    rng = np.random.default_rng(seed)
    a32, b32 = rng.standard_normal((N, K), np.float32), rng.standard_normal((K, M), np.float32)
    out = {"shape": [N, K, M], "gemm_s": {}}
    out["gemm_s"]["fp32"] = _time(lambda: a32 @ b32)
    for name, dt in (("fp16", float16), ("bf16", bfloat16)):
        a, b = a32.astype(dt), b32.astype(dt)
        out["gemm_s"][name] = _time(lambda: matmul(a, b))
    a16, b16 = a32[:256].astype(float16), b32.astype(float16)
    out["numpy_fp16_gemm_256_rows_s"] = _time(lambda: np.matmul(a16, b16), repeat=2)
    x32 = rng.standard_normal(1 << 21).astype(np.float32)
    n = x32.size
    ns = {}
    for name, dt in (("fp16", float16), ("bf16", bfloat16)):
        x = x32.astype(dt)
        ns[f"fp32_to_{name}"] = _time(lambda: x32.astype(dt)) / n * 1e9
        ns[f"{name}_to_fp32"] = _time(lambda: x.astype(np.float32)) / n * 1e9
        y = np.empty_like(x)
        ns[f"add_{name}"] = _time(lambda: np.add(x, x, out=y)) / n * 1e9
    y32 = np.empty_like(x32)
    ns["add_fp32"] = _time(lambda: np.add(x32, x32, out=y32)) / n * 1e9
    ns["copy_fp32"] = _time(lambda: x32.copy()) / n * 1e9
    out["ns_per_element"] = ns
    try:
        import torch
        ta, tb = torch.from_numpy(a32), torch.from_numpy(b32)
        out["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                        "gemm_s": {"fp32": _time(lambda: ta @ tb),
                                   "bf16": _time(lambda: ta.bfloat16() @ tb.bfloat16()),
                                   "bf16_no_casts": _time((lambda a, b: lambda: a @ b)(
                                       ta.bfloat16(), tb.bfloat16()))}}
    except ImportError:
        out["torch"] = None
    return out


def tokens_per_second(models, n_tokens, rounds=3):
    """Generation speed (bytes/s, KV cache, one sequence) of each model, interleaved rounds, median."""
    prompt = encode("def ")[None, :]
    times = interleaved({name: functools.partial(sample, m, prompt, n_tokens, temperature=0.8,
                                                 seed=0) for name, m in models.items()}, rounds)
    return {name: n_tokens / statistics.median(ts) for name, ts in times.items()}


def quantization(model, args, workdir, gen_tokens):
    """Sizes, validation bits/byte, logit errors and generation speed of w8 and w8a8 against float32."""
    data = tinygpt.data_for(args)
    windows = data.windows("val", args.eval_windows)
    res = {"float32_weights_bytes": float32_weights_bytes(model)}
    ckpt = os.path.join(workdir, "fp32.npz")
    save_checkpoint(ckpt, model, AdamW(model), step=args.steps)     # the size of a training checkpoint
    res["training_checkpoint_bytes"] = os.path.getsize(ckpt)
    res["val_bpb"] = {"fp32": val_bpb(model, windows)}
    models = {"fp32": model}
    x = windows[0][:8]
    z = model.forward(x).astype(np.float64)
    res["logit_error"] = {}
    for scheme in ("w8", "w8a8"):
        qm = TinyGPT(**model.config)
        qm.load_state_dict(model.state_dict())
        quantize_model(qm, scheme)
        path = os.path.join(workdir, f"{scheme}.npz")
        save_quantized(path, qm, args.steps)
        res[f"{scheme}_bytes"] = os.path.getsize(path)
        res["val_bpb"][scheme] = val_bpb(qm, windows)
        d = qm.forward(x).astype(np.float64) - z
        res["logit_error"][scheme] = {"max_abs": float(np.abs(d).max()),
                                      "rms": float(np.sqrt((d * d).mean())),
                                      "rms_logits": float(np.sqrt((z * z).mean()))}
        models[scheme] = qm
    res["gen_tokens"] = gen_tokens
    res["bytes_per_second"] = tokens_per_second(models, gen_tokens)
    return res


def main(args):
    t0 = time.perf_counter()
    base = run_args([] if args.steps is None else ["--steps", str(args.steps)])
    config = {k: v for k, v in vars(base).items()
              if k not in ("checkpoint", "no_progress", "prompt", "sample_tokens", "temperatures",
                           "precision")}
    rec = record("fewer-bits")
    result = {"command": rec["command"], "config": config, "commit": rec["commit"],
              "dirty": rec["dirty"], "python": platform.python_version(), "numpy": np.__version__,
              "machine": platform.machine(), "machine_info": rec["machine"],
              "load_average": rec["load_average"], "date": rec["date"],
              "threads": {**{v: os.environ.get(v)
                             for v in ("OPENBLAS_NUM_THREADS", "TFORMER_NUM_THREADS")},
                          "tformer": parallel.get_num_threads()},
              "runs": {}}
    argsets = {p: run_args([*(["--steps", str(args.steps)] if args.steps else []), "--precision", p])
               for p in PRECISIONS}
    fp32_model = None
    for p, a in argsets.items():
        t = time.perf_counter()
        model, precision, hist = train_tinygpt(a)
        seconds = time.perf_counter() - t
        final = hist["eval"][-1][1]
        run = {"history": {k: hist[k] for k in ("step", "loss", "grad_norm", "lr")},
               "eval": [[s, m] for s, m in hist["eval"]], "val_bpb": final["val_bpb"],
               "train_bpb": final["train_bpb"], "seconds": seconds,
               # the thread count, and whether the batch was cut across the threads (the default)
               "threads": parallel.get_num_threads(), "batch_cut": batch_cut(model, a)}
        if precision is not None:
            run["history"]["loss_scale"] = hist["loss_scale"]
            run["skipped"] = hist["skipped"]
            run["final_loss_scale"] = precision.loss_scale
            precision.detach()                                        # the float32 masters
            run["val_bpb_masters_fp32"] = tinygpt.make_evaluate(tinygpt.data_for(a), a.eval_windows)(
                model.eval())["val_bpb"]
        else:
            fp32_model = model.eval()
        result["runs"][p] = run
        print(f"{p}: val {final['val_bpb']:.4f} bits/byte, {len(run.get('skipped', []))} skipped, "
              f"{seconds:.0f} s", flush=True)
    result["memory"] = {p: step_memory(a) for p, a in argsets.items()}
    result["step_time"] = step_times(argsets, args.time_rounds, args.time_steps)
    result["kernels"] = kernel_costs()
    with tempfile.TemporaryDirectory() as work:
        result["quantization"] = quantization(fp32_model, argsets["fp32"], work, args.gen_tokens)
    result["seconds"] = time.perf_counter() - t0
    write_json(args.out, jsonable(result))
    q = result["quantization"]
    print(f"quantized: w8 {q['w8_bytes']:,} bytes ({100 * q['w8_bytes'] / q['float32_weights_bytes']:.1f}% "
          f"of float32), val {q['val_bpb']['w8']:.4f}; w8a8 val {q['val_bpb']['w8a8']:.4f}; "
          f"float32 val {q['val_bpb']['fp32']:.4f}")
    print(f"wrote {args.out} ({result['seconds']:.0f} s)")
    return 0
