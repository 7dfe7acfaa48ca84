"""``python -m tformer lora [--out book/data/lora.json]``: full fine-tuning against LoRA (JSON).

A TinyGPT pretrained once on the Python corpus is adapted to Shakespeare for the same number of
steps with the same batches (per seed) in each of these ways (``tformer.experiments.lora_train``):
full fine-tuning, LoRA at r = 1, 4, 16 on the attention projections (``attn``) and on every
linear layer (``all``), and training from scratch. Recorded per method: the validation bits/byte
of every seed (and their mean and spread), the trainable parameters, the bytes of Adam's two
moments, the median time of a training step (all methods interleaved, round by round), the size
of the file that holds what the method changed (the adapter file; the whole model otherwise).

The peak learning rate of each kind (full, LoRA, scratch) is picked first from a small grid by
the training loss of the last 20 steps of a short run on a seed of its own (never the validation
split). Then: the singular values of the full fine-tuning's update ΔW = W_ft − W_base in a few
layers (against a Gaussian matrix of the same shape and norm), and the validation bits/byte of
the full fine-tuning with every linear layer's ΔW cut to rank r; inference speed of the base,
the unmerged and the merged model; a short configuration (the base's first 30 steps, then 20
steps of LoRA) that the chapter re-runs and compares. The file holds the command line, the
commit, the machine and the load average.
"""
import functools
import os
import platform
import tempfile
import time

import numpy as np

from .. import parallel
from ..atomic import write_json
from ..checkpoint import save_checkpoint
from ..lora import merge_lora
from ..lora_file import save_adapter
from ..models.tinygpt import TinyGPT
from ..optim import AdamW, clip_grad_norm
from .provenance import load_average, record
from . import lora_train as L
from .timing import interleaved
from ..runs.flags import add_flag

DEFAULT_OUT = "book/data/lora.json"
LORA_TARGETS = ("attn", "all")
RANKS = (1, 4, 16)
LR_GRID = {"full": (3e-4, 1e-3, 3e-3), "lora": (3e-3, 1e-2, 3e-2, 1e-1), "scratch": (3e-3, 1e-2)}
DECAY = {"full": 0.1, "lora": 0.0, "scratch": 0.1}
PILOT = {"steps": 100, "seed": 100, "lora": {"kind": "lora", "r": 4, "targets": "attn"}}
SVD_LAYERS = ("blocks.0.attn.qkv", "blocks.1.attn.o", "blocks.0.ffn.fc1", "blocks.1.ffn.fc2")
CHECK = {"base_steps": 30, "steps": 20, "seed": 1, "method": "lora-attn-r4"}


def add_arguments(p):
    p.add_argument("--out", default=DEFAULT_OUT, help="the JSON file to write")
    add_flag(p, "--steps", 300, "fine-tuning steps of every method")
    add_flag(p, "--seeds", [1, 2, 3], "fine-tuning seeds (batches, adapter and scratch "
             "initialisation)", nargs="+")
    add_flag(p, "--time-rounds", 15, "interleaved rounds of step timing")


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
    """The command line, the commit (``tformer.experiments.provenance.record``: git run in the repository's
    root), the machine, the date, the load, and the cores and threads."""
    rec = record("lora")
    rec.update(cores=parallel.available_cores(), threads=parallel.get_num_threads(),
               load_average_start=rec.pop("load_average"), python=platform.python_version(),
               numpy=np.__version__)
    return rec


def _round(xs, digits=5):
    return [round(float(x), digits) for x in xs]


def pick_lrs(base_state):
    """The peak rate of each kind: the lowest mean training loss over the last 20 pilot steps."""
    kinds = {"full": {"kind": "full"}, "lora": PILOT["lora"], "scratch": {"kind": "scratch"}}
    out = {}
    for kind, method in kinds.items():
        losses = {}
        for lr in LR_GRID[kind]:
            _, _, hist = L.finetune(base_state, method, PILOT["seed"], PILOT["steps"], lr, DECAY[kind])
            losses[lr] = float(np.mean(hist["loss"][-20:]))
        out[kind] = {"grid": {str(k): round(v, 5) for k, v in losses.items()},
                     "lr": min(losses, key=losses.get)}
    return out


def file_bytes(model, method):
    """Bytes on disk of what the method changed: the adapter file, else the model's weights."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.npz")
        if method["kind"] == "lora":
            save_adapter(path, model)
        else:
            save_checkpoint(path, model)
        return os.path.getsize(path)


def step_times(base_state, table, rounds):
    """Median seconds of one training step per method, the methods interleaved round by round."""
    data = L.verse_data(1)
    x, y = data.batch(0)
    runs = {}
    for name, method in table.items():
        model, params = L.adapted(base_state, method, 1)
        opt = AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=DECAY[method["kind"]])
        runs[name] = (model, params, opt)

    def step(model, params, opt):
        params.zero_grad()
        _, dlogits = L.forward_loss(model, (x, y))
        model.backward(dlogits)
        clip_grad_norm(params, 1.0)
        opt.step()
    for name in table:
        step(*runs[name])                                            # warm-up
    seconds = interleaved({name: functools.partial(step, *runs[name]) for name in table}, rounds)
    return {n: {"median_seconds": float(np.median(s)), "seconds": _round(s, 6)}
            for n, s in seconds.items()}


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
    _, _, ft = L.finetune(base.state_dict(), method, CHECK["seed"], CHECK["steps"],
                          base_lrs["lora"]["lr"], DECAY["lora"])
    return {**CHECK, "lr": base_lrs["lora"]["lr"], "base_losses": _round(hist["loss"], 6),
            "losses": _round(ft["loss"], 6)}


def main(args):
    t0 = time.perf_counter()
    result = {"provenance": provenance(),
              "config": {"shape": L.SHAPE, "batch_size": L.BATCH, "base": L.BASE,
                         "steps": args.steps, "seeds": args.seeds, "eval_windows": L.EVAL_WINDOWS,
                         "lr_grid": {k: list(v) for k, v in LR_GRID.items()},
                         "weight_decay": DECAY, "pilot": PILOT, "alpha": "r (s = 1)",
                         "warmup": "steps // 10", "min_lr": "lr / 10", "clip": 1.0,
                         "time_rounds": args.time_rounds}}
    print("pretraining the base model on the Python corpus ...", flush=True)
    base, hist = L.pretrain()
    base_state = base.state_dict()
    verse = L.verse_data(args.seeds[0])
    result["base"] = {"losses": _round(hist["loss"]), "seconds": hist["time"][-1],
                      "python_val_bpb": L.val_bpb(base, L.python_data()),
                      "shakespeare_val_bpb": L.val_bpb(base, verse),
                      "parameters": base.num_parameters(), "file_bytes": file_bytes(base, {"kind": "full"})}
    print(f"base: {result['base']}"[:200], flush=True)
    lrs = result["lr_pick"] = pick_lrs(base_state)
    print(f"learning rates: { {k: v['lr'] for k, v in lrs.items()} }", flush=True)
    table = methods()
    result["methods"], full_models = {}, {}
    for name, method in table.items():
        kind, rows = method["kind"], []
        for seed in args.seeds:
            model, params, h = L.finetune(base_state, method, seed, args.steps, lrs[kind]["lr"],
                                          DECAY[kind], eval_every=50)
            rows.append({"seed": seed, "val_bpb": h["eval"][-1][1]["val_bpb"],
                         "val_curve": [[s, round(m["val_bpb"], 5)] for s, m in h["eval"]],
                         "losses": _round(h["loss"]), "seconds": h["time"][-1]})
            if kind == "full" and seed == args.seeds[0]:
                full_models["full"] = model
            print(f"{name} seed {seed}: val {rows[-1]['val_bpb']:.4f} bits/byte", flush=True)
        vals = np.array([r["val_bpb"] for r in rows])
        result["methods"][name] = {
            **method, "lr": lrs[kind]["lr"], "weight_decay": DECAY[kind], "runs": rows,
            "val_bpb_mean": float(vals.mean()), "val_bpb_std": float(vals.std(ddof=1)),
            "val_bpb_min": float(vals.min()), "val_bpb_max": float(vals.max()),
            "trainable": L.trainable(params), "optimizer_state_bytes": L.optimizer_state_bytes(h["optimizer"]),
            "file_bytes": file_bytes(model, method)}
        write_json(args.out, result)                               # a partial file as runs finish
    print("timing ...", flush=True)
    for name, t in step_times(base_state, table, args.time_rounds).items():
        result["methods"][name]["step_seconds"] = t["median_seconds"]
        result["methods"][name]["step_seconds_all"] = t["seconds"]
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
