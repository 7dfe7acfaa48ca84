"""``python -m tformer lora [--out book/data/lora.json]``: full fine-tuning against LoRA (JSON).

A TinyGPT pretrained once on the Python corpus is adapted to Shakespeare for the same number of
steps with the same batches (per seed) in each of these ways (``tformer.experiments.lora_train``):
full fine-tuning, LoRA at r = 1, 4, 16 on the attention projections (``attn``) and on every
linear layer (``all``), and training from scratch. Recorded per method: the validation bits/byte
of every seed (and their mean and spread), the trainable parameters, the bytes of Adam's two
moments and of the gradients (needed, and allocated by tformer), the median time of a training
step and of its three parts (forward and loss, backward, clipping and optimizer; all methods
interleaved, round by round), the multiply-adds of the step's matrix products (read from the
layers' shapes, the frozen layers' dW left out) and the median time of those products run
alone, the size of the file that holds what the method changed (the adapter file; the whole
model otherwise), and a sample written by the first seed's model.

The peak learning rate and the weight decay of EACH method are picked first, by the same rule
for all: from ``LR_GRID[kind]`` × ``DECAY_GRID``, the lowest mean training loss of the last 20
steps of short runs on two pilot seeds of their own (never the validation split). For LoRA at
r = 4 on attention, the scale s = α / r is swept too (``S_GRID``, at every rate of the grid), to
check that the rate sweep at s = 1 covers it. Then: the singular values of the full
fine-tuning's update ΔW = W_ft − W_base in a few layers (against a Gaussian matrix of the same
shape and norm), and the validation bits/byte of the full fine-tuning with every linear layer's
ΔW cut to rank r; inference speed of the base, the unmerged and the merged model; a short
configuration (the base's first 30 steps, then 20 steps of LoRA) that the chapter re-runs and
compares. The file holds the command line, the commit, the machine and the load average.
"""
import functools
import os
import platform
import tempfile
import time

import numpy as np

from tformer.core import parallel
from tformer.core.atomic import write_json
from tformer.training.checkpoint import save_checkpoint
from tformer.nn.lora import merge_lora
from tformer.training.lora_file import save_adapter
from tformer.data.text import decode, encode
from tformer.decoding.generate import sample
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW, clip_grad_norm
from tformer.core.provenance import load_average, record
from tformer.experiments import lora_train as L
from tformer.core.timing import interleaved
from tformer.runs.flag_groups import Flag, add_output_flags, add_timing_flags, add_training_flags

DEFAULT_OUT = "book/data/lora.json"
LORA_TARGETS = ("attn", "all")
RANKS = (1, 4, 16)
LR_GRID = {"full": (1e-3, 3e-3, 1e-2), "lora": (3e-3, 1e-2, 3e-2, 1e-1),
           "scratch": (1e-3, 3e-3, 1e-2)}
DECAY_GRID = (0.0, 0.1)
PILOT = {"steps": 100, "seeds": [100, 101]}
S_GRID = {"method": "lora-attn-r4", "s": (0.316, 1.0, 3.16), "weight_decay": 0.0}  # 10^(∓1/2)
SAMPLE = {"prompt": "HAMLET:\n", "bytes": 300, "temperature": 0.8, "seed": 0}
SVD_LAYERS = ("blocks.0.attn.qkv", "blocks.1.attn.o", "blocks.0.ffn.fc1", "blocks.1.ffn.fc2")
CHECK = {"base_steps": 30, "steps": 20, "seed": 1, "method": "lora-attn-r4"}
TIMED = "lora-attn-r4"             # the method whose products are timed against full's


def add_arguments(p):
    add_output_flags(p, out=DEFAULT_OUT)
    add_training_flags(p, steps=Flag(300, "fine-tuning steps of every method"),
                       seeds=Flag([1, 2, 3], "fine-tuning seeds (batches, adapter and scratch "
                                             "initialisation)"))
    add_timing_flags(p, time_rounds=Flag(15, "interleaved rounds of step timing"))


def files(args):
    """What the command writes (``tformer.runs.declare``): ``--out``."""
    from tformer.runs.declare import writes
    return [writes("--out", args.out)]


def check_args(args):
    if args.steps < 20:
        raise ValueError(f"--steps: expected at least 20 (the warm-up is a tenth), got {args.steps}")
    if len(args.seeds) < 2 or len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds: expected at least two different seeds, got {args.seeds}")
    if args.time_rounds < 3:
        raise ValueError(f"--time-rounds: expected at least 3, got {args.time_rounds}")


def methods():
    """``{name: method}`` in the order of the table."""
    out = {"full": {"kind": "full"}}
    for targets in LORA_TARGETS:
        for r in RANKS:
            out[f"lora-{targets}-r{r}"] = {"kind": "lora", "r": r, "targets": targets}
    out["scratch"] = {"kind": "scratch"}
    return out


def provenance():
    """The command line, the commit (``tformer.core.provenance.record``: git run in the repository's
    root), the machine, the date, the load, and the cores and threads."""
    rec = record("lora")
    rec.update(cores=parallel.available_cores(), threads=parallel.get_num_threads(),
               load_average_start=rec.pop("load_average"), python=platform.python_version(),
               numpy=np.__version__)
    return rec


def _round(xs, digits=5):
    return [round(float(x), digits) for x in xs]


def pilot_loss(base_state, method, lr, weight_decay):
    """Mean training loss of the last 20 steps of a ``PILOT["steps"]`` run, per pilot seed."""
    out = []
    for seed in PILOT["seeds"]:
        _, _, hist = L.finetune(base_state, method, seed, PILOT["steps"], lr, weight_decay)
        out.append(float(np.mean(hist["loss"][-20:])))
    return out


def pick_lrs(base_state, table):
    """Per method: the (peak rate, weight decay) of ``LR_GRID[kind]`` × ``DECAY_GRID`` with the
    lowest training loss of the pilot runs (mean over the pilot seeds)."""
    out = {}
    for name, method in table.items():
        grid = []
        for lr in LR_GRID[method["kind"]]:
            for wd in DECAY_GRID:
                losses = pilot_loss(base_state, method, lr, wd)
                grid.append({"lr": lr, "weight_decay": wd, "losses": _round(losses),
                             "mean": round(float(np.mean(losses)), 5)})
        best = min(grid, key=lambda g: g["mean"])
        out[name] = {"grid": grid, "lr": best["lr"], "weight_decay": best["weight_decay"]}
        print(f"  {name}: lr {best['lr']:g}, weight decay {best['weight_decay']:g}", flush=True)
    return out


def scale_sweep(base_state, table):
    """Pilot losses of ``S_GRID["method"]`` over rates × scales s = α / r (no weight decay)."""
    method, grid = table[S_GRID["method"]], []
    for lr in LR_GRID["lora"]:
        for s in S_GRID["s"]:
            losses = pilot_loss(base_state, {**method, "s": s}, lr, S_GRID["weight_decay"])
            grid.append({"lr": lr, "s": s, "losses": _round(losses),
                         "mean": round(float(np.mean(losses)), 5)})
    return {**S_GRID, "grid": grid}


def write_sample(model):
    """``SAMPLE["bytes"]`` bytes sampled after ``SAMPLE["prompt"]`` (eval mode, fixed seed)."""
    prompt = encode(SAMPLE["prompt"])[None, :]
    ids = sample(model.eval(), prompt, SAMPLE["bytes"], temperature=SAMPLE["temperature"],
                 seed=SAMPLE["seed"])
    model.train()
    return decode(ids[0, prompt.shape[1]:])


def file_bytes(model, method):
    """Bytes on disk of what the method changed: the adapter file, else the model's weights."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.npz")
        if method["kind"] == "lora":
            save_adapter(path, model)
        else:
            save_checkpoint(path, model)
        return os.path.getsize(path)


def step_times(base_state, table, rounds, decay):
    """Median seconds of one training step per method, and of its three parts (forward and
    loss, backward, clipping and optimizer), the methods interleaved round by round."""
    data = L.verse_data(1)
    x, y = data.batch(0)
    runs, parts = {}, {name: {"forward": [], "backward": [], "optimizer": []} for name in table}
    for name, method in table.items():
        model, params = L.adapted(base_state, method, 1)
        opt = AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=decay[name])
        runs[name] = (model, params, opt, parts[name])

    def step(model, params, opt, part):
        t0 = time.perf_counter()
        params.zero_grad()
        _, dlogits = L.forward_loss(model, (x, y))
        t1 = time.perf_counter()
        model.backward(dlogits)
        t2 = time.perf_counter()
        clip_grad_norm(params, 1.0)
        opt.step()
        t3 = time.perf_counter()
        for key, t in (("forward", t1 - t0), ("backward", t2 - t1), ("optimizer", t3 - t2)):
            part[key].append(t)
    for name in table:
        step(*runs[name])                                            # warm-up
        for v in parts[name].values():
            v.clear()
    seconds = interleaved({name: functools.partial(step, *runs[name]) for name in table}, rounds)
    return {n: {"median_seconds": float(np.median(s)), "seconds": _round(s, 6),
                "parts": {k: float(np.median(v)) for k, v in parts[n].items()}}
            for n, s in seconds.items()}


def product_times(base_state, table, rounds):
    """Median seconds of the step's matrix products alone (``lora_train.products``, float32
    operands of those shapes, in that order), full fine-tuning and ``TIMED`` interleaved."""
    rng = np.random.default_rng(0)
    B, T = L.BATCH, L.SHAPE["max_len"]
    calls = {}
    for name in ("full", TIMED):
        model, _ = L.adapted(base_state, table[name], 1)
        ops = []
        for _, b, m, k, n in L.products(model, B, T):
            shape = (b,) if b > 1 else ()
            ops.append((rng.standard_normal(shape + (m, k)).astype(np.float32),
                        rng.standard_normal(shape + (k, n)).astype(np.float32)))
        calls[name] = functools.partial(lambda ops: [a @ b for a, b in ops], ops)
    for fn in calls.values():
        fn()                                                         # warm-up
    seconds = interleaved(calls, rounds)
    return {n: float(np.median(s)) for n, s in seconds.items()}


def inference_times(base_state, rounds):
    """Median seconds of a forward pass (B windows, eval mode): base, LoRA unmerged, merged."""
    x, _ = L.verse_data(1).batch(0)
    base = TinyGPT(**L.SHAPE).load_state_dict(base_state)
    unmerged, _ = L.adapted(base_state, {"kind": "lora", "r": 16, "targets": "all"}, 1)
    merged, _ = L.adapted(base_state, {"kind": "lora", "r": 16, "targets": "all"}, 1)
    merge_lora(merged)
    models = {"base": base.eval(), "lora-unmerged": unmerged.eval(), "lora-merged": merged.eval()}
    seconds = interleaved({n: functools.partial(m.forward, x) for n, m in models.items()}, rounds)
    return {n: {"median_seconds": float(np.median(s))} for n, s in seconds.items()}


def delta_spectra(base, full):
    """Singular values of ΔW = W_ft − W_base in ``SVD_LAYERS``, and of a Gaussian of its norm."""
    b = {n: p for n, p, _ in base.named_parameters()}
    f = {n: p for n, p, _ in full.named_parameters()}
    rng = np.random.default_rng(0)
    out = {}
    for layer in SVD_LAYERS:
        delta = (f[layer + ".W"] - b[layer + ".W"]).astype(np.float64)
        noise = rng.standard_normal(delta.shape)
        noise *= np.linalg.norm(delta) / np.linalg.norm(noise)
        out[layer] = {"shape": list(delta.shape),
                      "singular_values": _round(np.linalg.svd(delta, compute_uv=False), 7),
                      "gaussian_singular_values": _round(np.linalg.svd(noise, compute_uv=False), 7)}
    return out


def truncation(base, full, data, ranks=(1, 2, 4, 8, 16)):
    """Validation bits/byte of the full fine-tuning with each linear layer's ΔW cut to rank r."""
    b, f = base.state_dict(), full.state_dict()
    out = {}
    for r in ranks:
        model = TinyGPT(**L.SHAPE).load_state_dict(f)
        for name, p, _ in model.named_parameters():
            if name.endswith(".W") and p.ndim == 2 and not name.startswith(("wte", "wpe")):
                p[...] = b[name] + L.truncated((f[name] - b[name]).astype(np.float64), r)
        out[str(r)] = L.val_bpb(model, data)
    return out


def check_run(base_lrs):
    """The short configuration the chapter re-runs: the base's first steps, then LoRA."""
    base, hist = L.pretrain(CHECK["base_steps"])
    method = methods()[CHECK["method"]]
    pick = base_lrs[CHECK["method"]]
    _, _, ft = L.finetune(base.state_dict(), method, CHECK["seed"], CHECK["steps"],
                          pick["lr"], pick["weight_decay"])
    return {**CHECK, "lr": pick["lr"], "weight_decay": pick["weight_decay"],
            "base_losses": _round(hist["loss"], 6),
            "losses": _round(ft["loss"], 6)}


def main(args):
    t0 = time.perf_counter()
    result = {"provenance": provenance(),
              "config": {"shape": L.SHAPE, "batch_size": L.BATCH, "base": L.BASE,
                         "steps": args.steps, "seeds": args.seeds, "eval_windows": L.EVAL_WINDOWS,
                         "lr_grid": {k: list(v) for k, v in LR_GRID.items()},
                         "decay_grid": list(DECAY_GRID), "pilot": PILOT, "s_grid": S_GRID,
                         "alpha": "r (s = 1)", "sample": SAMPLE,
                         "warmup": "steps // 10", "min_lr": "lr / 10", "clip": 1.0,
                         "time_rounds": args.time_rounds}}
    print("pretraining the base model on the Python corpus ...", flush=True)
    base, hist = L.pretrain()
    base_state = base.state_dict()
    verse = L.verse_data(args.seeds[0])
    result["base"] = {"losses": _round(hist["loss"]), "seconds": hist["time"][-1],
                      "python_val_bpb": L.val_bpb(base, L.python_data()),
                      "shakespeare_val_bpb": L.val_bpb(base, verse),
                      "parameters": base.num_parameters(), "file_bytes": file_bytes(base, {"kind": "full"}),
                      "sample": write_sample(base)}
    print(f"base: {result['base']}"[:200], flush=True)
    table = methods()
    print("picking each method's learning rate and weight decay ...", flush=True)
    lrs = result["lr_pick"] = pick_lrs(base_state, table)
    result["scale_sweep"] = scale_sweep(base_state, table)
    write_json(args.out, result)
    result["methods"], full_models = {}, {}
    for name, method in table.items():
        kind, rows = method["kind"], []
        lr, wd = lrs[name]["lr"], lrs[name]["weight_decay"]
        for seed in args.seeds:
            model, params, h = L.finetune(base_state, method, seed, args.steps, lr, wd,
                                          eval_every=50)
            rows.append({"seed": seed, "val_bpb": h["eval"][-1][1]["val_bpb"],
                         "val_curve": [[s, round(m["val_bpb"], 5)] for s, m in h["eval"]],
                         "losses": _round(h["loss"]), "seconds": h["time"][-1]})
            if seed == args.seeds[0]:
                first = (model, params, h)
            print(f"{name} seed {seed}: val {rows[-1]['val_bpb']:.4f} bits/byte", flush=True)
        model, params, h = first
        if kind == "full":
            full_models["full"] = model
        vals = np.array([r["val_bpb"] for r in rows])
        needed, allocated = L.gradient_bytes(model, params)
        result["methods"][name] = {
            **method, "lr": lr, "weight_decay": wd, "runs": rows,
            "val_bpb_mean": float(vals.mean()), "val_bpb_std": float(vals.std(ddof=1)),
            "val_bpb_min": float(vals.min()), "val_bpb_max": float(vals.max()),
            "trainable": L.trainable(params), "optimizer_state_bytes": L.optimizer_state_bytes(h["optimizer"]),
            "gradient_bytes_needed": needed, "gradient_bytes_allocated": allocated,
            "multiply_adds": L.multiply_adds(model, L.BATCH, L.SHAPE["max_len"]),
            "file_bytes": file_bytes(model, method), "sample": write_sample(model)}
        write_json(args.out, result)                               # a partial file as runs finish
    print("timing ...", flush=True)
    for name, t in step_times(base_state, table, args.time_rounds,
                                   {n: v["weight_decay"] for n, v in lrs.items()}).items():
        result["methods"][name]["step_seconds"] = t["median_seconds"]
        result["methods"][name]["step_seconds_all"] = t["seconds"]
        result["methods"][name]["step_parts_seconds"] = t["parts"]
    result["products_seconds"] = product_times(base_state, table, args.time_rounds)
    result["inference"] = inference_times(base_state, 3 * args.time_rounds)
    result["delta_w"] = delta_spectra(base, full_models["full"])
    result["truncation"] = {"val_bpb": truncation(base, full_models["full"], verse),
                            "full_val_bpb": L.val_bpb(full_models["full"], verse)}
    result["check"] = check_run(lrs)
    result["provenance"]["load_average_end"] = load_average()
    result["provenance"]["wall_seconds"] = time.perf_counter() - t0
    write_json(args.out, result)
    print(f"wrote {args.out} ({result['provenance']['wall_seconds']:.0f} s)")
    return 0
