"""Same numbers: every array a training step and a decoding run compute, saved, then compared bit
for bit between two trees of tformer (issue 52: the refactor must change no number).

    python tools/same_numbers.py --out A.npz          # run the option matrix, save every array
    python tools/same_numbers.py --compare A.npz B.npz   # per case: how many arrays are identical

The option matrix, on small models (float64 and float32 where both make sense):

- **train**: a few AdamW steps through the one training loop (``train``) of a TinyGPT, for every
  configuration of ``CONFIGS`` (defaults, gradient checkpointing, flash attention, tied embeddings,
  the modern block, post-norm, sinusoidal positions, dropout, accumulation, clipping, frozen
  layers, LoRA, all together) × every precision (float64, float32, bf16, fp16 with float32
  masters) × threads 1, 2, 3 (the batch cut across threads, forced at this size). **train-wide**:
  six of them on a wider model at threads 1, 2, 3 without the batch cut (the kernels split their
  rows). Saved: the gradient each step hands the optimizer (after unscaling and clipping), every
  parameter after the steps, and the history (loss, gradient norm, clip ratio, learning rate,
  loss scale, skipped steps).
- **mpi2**: the same configurations × precisions on 2 MPI ranks (``mpiexec -n 2``, each rank a
  slice of the global batch; rank 0 saves), plus ZeRO-1.
- **decode**: logits of a forward pass; token ids of greedy and sampled generation with and
  without the KV cache (also past ``max_len``); the logits of each generated position through the
  cache and through full forward passes; for the float32/float64 default, modern, flash, tied,
  post-norm, sinusoidal models, LoRA (adapters and merged), int8 w8 and w8a8, and at 2 threads.
- **speculative**: greedy speculative decoding (lookahead 1, 2, 4, past the window), the modern
  block, an int8 target, a LoRA draft, and two sampled runs: tokens and the rounds' statistics.
- **dpo**: the DPO loss and its logit gradients on random logits; one DPO step through a model
  (loss, logit gradient, every parameter gradient), full and LoRA; a few ``tune`` steps (DPO,
  full and LoRA, threads 1/2/3; SFT).

Every name is looked up through ``resolve``, which tries the module paths of ``HOMES`` (the
refactor's new folders first, today's second) and the names of ``NAMES``: the same script runs on
the tree before the refactor and after it. Extend the two tables when a name moves. Only public
functions, classes and attributes are used (``MIN_PART_MACS``, the batch cut's public threshold,
is set as the tests set it, and restored).

``--compare`` prints, per case, how many arrays are bit-identical (same dtype, same shape,
``np.array_equal``, NaN equal to NaN), each array that differs with its largest absolute and
relative difference, and last ``N of M arrays bit-identical``; it exits 1 if any array differs or
a key is missing on either side. The output file also holds a JSON manifest of the cases (key
``__manifest__``, written beside it as ``FILE.json`` too): what each case ran, its array count, its
time, and where each name was found.

For the refactor: run ``--out`` on the tree before it (a ``git archive`` of main unpacked in a
folder, that folder on ``PYTHONPATH``; the script itself may live anywhere) and on the tree after
it, then ``--compare`` the two files. ``--only train/lora decode/`` runs some cases; ``--no-mpi``
skips the 2-rank job. A renamed parameter shows as a key missing on one side.

Runs in under a minute on 2 cores, deterministically: one BLAS thread, a fixed hash seed (the
script re-executes itself with the environment pinned, as the Makefile pins it).
"""
import os
import sys

PINNED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
          "TFORMER_NUM_THREADS": "1", "TFORMER_PROGRESS": "0", "PYTHONHASHSEED": "0"}
if any(os.environ.get(k) != v for k, v in PINNED.items()):
    # before NumPy is imported: BLAS reads its thread count once, Python its hash seed at start
    os.environ.update(PINNED)
    os.execv(sys.executable, [sys.executable, *sys.argv])

import argparse            # noqa: E402
import contextlib          # noqa: E402
import copy                # noqa: E402
import importlib           # noqa: E402
import json                # noqa: E402
import platform            # noqa: E402
import subprocess          # noqa: E402
import tempfile            # noqa: E402
import time                # noqa: E402

import numpy as np         # noqa: E402

if os.environ.get("PYTHONPATH"):
    # A tree named on PYTHONPATH is the only tformer: an editable install (pip install -e) puts a
    # finder on sys.meta_path that maps any tformer.* name to its checkout, so a module the tree
    # lacks (the new layout's folders, in the tree before the refactor) would load from there.
    sys.meta_path[:] = [f for f in sys.meta_path if not f.__module__.startswith("__editable__")]

# ------------------------------------------------------------------------------------------------
# Where each name lives. HOMES: module paths tried in order, the refactor's new home first and
# today's last. NAMES: what this script calls -> (home, names tried in order). Add a path or a
# name here when the refactor moves or renames one; nothing else in the file names a module.

HOMES = {
    "models":      ["tformer.models.tinygpt", "tformer.models"],
    "functional":  ["tformer.functional", "tformer.nn.functional", "tformer.fast.losses"],
    "optim":       ["tformer.training.optim", "tformer.optim"],
    "train":       ["tformer.training.train", "tformer.training", "tformer.train"],
    "threads":     ["tformer.core.parallel", "tformer.parallel"],
    "batch_cut":   ["tformer.training.batch_cut", "tformer.training.batch_threads",
                    "tformer.scaling.batch_threads"],
    "precision":   ["tformer.training.precision", "tformer.scaling.precision"],
    "mpi":         ["tformer.training.mpi", "tformer.scaling.mpi"],
    "lora":        ["tformer.nn.lora", "tformer.lora"],
    "generate":    ["tformer.decoding.generate", "tformer.generate"],
    "kv_cache":    ["tformer.decoding.kv_cache", "tformer.kv_cache"],
    "speculative": ["tformer.decoding.speculative", "tformer.speculative"],
    "int8":        ["tformer.decoding.int8", "tformer.decoding.quantize", "tformer.scaling.quantize"],
    "dpo":         ["tformer.tuning.dpo", "tformer.dpo"],
    "tune":        ["tformer.tuning.tune", "tformer.tuning", "tformer.tune"],
}

NAMES = {
    "TinyGPT":            ("models", ["TinyGPT"]),
    "cross_entropy":      ("functional", ["cross_entropy"]),
    "AdamW":              ("optim", ["AdamW"]),
    "train":              ("train", ["train"]),
    "set_num_threads":    ("threads", ["set_num_threads"]),
    "MIN_PART_MACS":      ("batch_cut", ["MIN_PART_MACS"]),      # a module constant, set and restored
    "MixedPrecision":     ("precision", ["MixedPrecision"]),
    "DataParallel":       ("mpi", ["DataParallel"]),
    "get_world":          ("mpi", ["get_world"]),
    "local_slice":        ("mpi", ["local_slice"]),
    "run_command":        ("mpi", ["run_command"]),
    "launch":             ("mpi", ["launch"]),
    "find_mpiexec":       ("mpi", ["find_mpiexec"]),
    "apply_lora":         ("lora", ["apply_lora"]),
    "Adapters":           ("lora", ["Adapters"]),
    "merge_lora":         ("lora", ["merge_lora"]),
    "greedy":             ("generate", ["greedy"]),
    "sample":             ("generate", ["sample"]),
    "Decoder":            ("kv_cache", ["Decoder"]),
    "new_caches":         ("kv_cache", ["new_caches"]),
    "speculative_sample": ("speculative", ["speculative_sample"]),
    "quantize_model":     ("int8", ["quantize_model"]),
    "dpo_forward":        ("dpo", ["dpo_forward"]),
    "dpo_backward":       ("dpo", ["dpo_backward"]),
    "dpo_loss":           ("dpo", ["dpo_loss"]),
    "sequence_logp":      ("dpo", ["sequence_logp"]),
    "Pairs":              ("tune", ["Pairs"]),
    "dpo_step_loss":      ("tune", ["dpo_step_loss"]),
    "tune":               ("tune", ["tune"]),
}

_found = {}


def locate(what):
    """``(module, attribute name)`` of ``what``: the first module of its home that imports and
    has one of its names. A candidate module that does not exist is skipped; one that exists but
    fails to import raises (that is a bug to see, not a path to skip)."""
    if what not in _found:
        home, names = NAMES[what]
        tried = []
        for path in HOMES[home]:
            try:
                module = importlib.import_module(path)
            except ModuleNotFoundError as e:
                if e.name and (path == e.name or path.startswith(e.name + ".")):
                    tried.append(f"{path} (no such module)")
                    continue
                raise
            name = next((n for n in names if hasattr(module, n)), None)
            if name is not None:
                _found[what] = (module, name)
                break
            tried.append(f"{path} (has none of {names})")
        else:
            raise LookupError(f"{what}: not found; tried " + "; ".join(tried)
                              + " (extend HOMES or NAMES at the top of tools/same_numbers.py)")
    return _found[what]


def resolve(what):
    """The object called ``what`` in this tree of tformer (see ``HOMES`` and ``NAMES``)."""
    module, name = locate(what)
    return getattr(module, name)


def submodule(model, path):
    """The module at ``path`` (``"blocks.0.attn"``), through public attributes and indexing."""
    for part in path.split("."):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


@contextlib.contextmanager
def threads(n, cut=True):
    """Run with ``n`` threads; ``cut``: every batch is worth cutting across them (the tests'
    ``MIN_PART_MACS = 0``), else the batch cut's own threshold (at these sizes: kernels split)."""
    module, name = locate("MIN_PART_MACS")
    before = getattr(module, name)
    if cut:
        setattr(module, name, 0)
    resolve("set_num_threads")(n)
    try:
        yield
    finally:
        resolve("set_num_threads")(1)
        setattr(module, name, before)


# ------------------------------------------------------------------------------------------------
# training: the configurations × precisions of tests/step_matrix.py, with AdamW steps

STEPS = 3
V = 64
# (B, T, model): "small" cuts into 2 and 3 thread parts and 2 rank slices; "wide" is large enough
# (rows × width ≥ tformer.parallel's smallest part) for the kernels themselves to split their rows.
SIZES = {"small": (6, 16, dict(d_model=32, n_heads=4, n_layers=2, max_len=16, vocab_size=V, seed=0)),
         "wide": (8, 64, dict(d_model=64, n_heads=4, n_layers=2, max_len=64, vocab_size=V, seed=0))}
MODERN = dict(norm="rmsnorm", positions="rope", mlp="swiglu", n_kv_heads=2)

CONFIGS = {
    "defaults": ({}, {}),
    "recompute": (dict(gradient_checkpointing=True), {}),
    "flash": (dict(attention="flash"), {}),
    "tied": (dict(tie_embeddings=True), {}),
    "modern": (MODERN, {}),
    "post-norm": (dict(norm_position="post"), {}),
    "sinusoidal": (dict(positions="sinusoidal"), {}),
    "dropout": (dict(dropout=0.1), {}),        # draws masks: the batch is never cut
    "accumulation": ({}, dict(accum_steps=2)),
    "clipping": ({}, dict(clip_norm=0.05)),
    "frozen": (dict(freeze=("wte", "wpe", "blocks.0.attn", "blocks.1.ffn.fc2", "lm_head")),
               dict(clip_norm=0.05)),
    "lora": (dict(lora=dict(r=2, alpha=4.0, targets="all", seed=1)), dict(clip_norm=1.0)),
    "all-together": (dict(gradient_checkpointing=True, attention="flash", tie_embeddings=True,
                          freeze=("wte", "blocks.0.ln1", "blocks.1.attn.o", "lm_head"), **MODERN),
                     dict(accum_steps=2, clip_norm=0.05)),
}
# model dtype, compute precision; fp16's loss scale starts at 2¹⁰ (no step of these models overflows)
PRECISIONS = {"float64": (np.float64, None), "float32": (np.float32, None),
              "bf16": (np.float32, "bf16"), "fp16": (np.float32, "fp16")}


class Recording:
    """An optimizer that keeps a copy of the gradients it is handed (after unscaling and clipping:
    what it applies), then lets ``inner`` step."""

    def __init__(self, inner, params):
        self.inner, self.params, self.grads = inner, params, []

    @property
    def lr(self):
        return self.inner.lr

    @lr.setter
    def lr(self, value):
        self.inner.lr = value

    def step(self):
        self.grads.append({n: np.array(g, copy=True) for n, _, g in self.params.named_parameters()
                           if g is not None})
        self.inner.step()


def randomize(params, seed, scale, base=None):
    """Add N(0, scale²) to every parameter of ``params`` (to ``base``'s values if given), in place."""
    rng = np.random.default_rng(seed)
    pairs = zip(params.named_parameters(),
                list((base if base is not None else params).named_parameters()))
    for (_, p, _), (_, b, _) in pairs:
        p[...] = b + rng.standard_normal(p.shape) * scale
    return params


def build(config, dtype, shape):
    """``(model, params)``: the TinyGPT of ``config`` and what the optimizer trains (the model, or
    LoRA's adapters)."""
    model_kw = dict(CONFIGS[config][0])
    frozen, lora = model_kw.pop("freeze", ()), model_kw.pop("lora", None)
    model = resolve("TinyGPT")(**shape, dtype=dtype, **model_kw)
    for path in frozen:
        submodule(model, path).freeze()
    params = model
    if lora is not None:
        resolve("apply_lora")(model, lora["r"], lora["alpha"], lora["targets"], seed=lora["seed"])
        params = randomize(resolve("Adapters")(model), 5, 0.1)      # B = 0 at the start: move off it
    return model, params


def history_arrays(hist):
    out = {f"hist.{k}": np.asarray(hist[k], np.float64)
           for k in ("loss", "grad_norm", "clip_ratio", "lr", "loss_scale") if k in hist}
    if "skipped" in hist:
        out["hist.skipped"] = np.asarray(hist["skipped"], np.int64)
    return out


def train_case(config, precision, world=None, zero=False, size="small"):
    """The arrays of ``STEPS`` AdamW steps of ``config`` in ``precision`` (on this rank's slices
    of the global batches when ``world`` has several ranks)."""
    dtype, low = PRECISIONS[precision]
    B, T, shape = SIZES[size]
    model, params = build(config, dtype, shape)
    mp = resolve("MixedPrecision")(model, low, init_scale=2.0 ** 10) if low else None
    several = world is not None and world.size > 1
    dp = resolve("DataParallel")(model, world, zero=zero) if several else None

    def make(m):
        return resolve("AdamW")(m, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    opt = Recording(dp.optimizer(make) if dp is not None and zero else make(params), params)

    def batch(i):
        w = np.random.default_rng([3, i]).integers(0, V, (B, T + 1))
        xy = (w[:, :-1], w[:, 1:])
        return resolve("local_slice")(xy, world) if several else xy

    def forward_loss(m, b):
        return resolve("cross_entropy")(m.forward(b[0]), b[1])

    hist = resolve("train")(params, opt, batch, forward_loss, STEPS, progress_bar=False,
                            data_parallel=dp, precision=mp, **CONFIGS[config][1])
    out = history_arrays(hist)
    for name in opt.grads[0] if opt.grads else ():
        out[f"grad.{name}"] = np.stack([g[name] for g in opt.grads])       # (steps, *shape)
    out.update({f"param.{k}": np.array(v) for k, v in model.state_dict().items()})
    return out


def training_cases():
    cases = []
    for config in CONFIGS:
        for precision in PRECISIONS:
            for n in (1, 2, 3):
                cases.append((f"train/{config}/{precision}/threads{n}",
                              f"{STEPS} AdamW steps, {config}, {precision}, {n} thread(s), batch cut",
                              lambda c=config, p=precision, n=n: _threaded(n, True, train_case, c, p)))
    for config in ("defaults", "recompute", "flash", "modern", "frozen", "lora"):
        for precision in ("float64", "float32", "bf16"):
            for n in (1, 2, 3):
                cases.append((f"train-wide/{config}/{precision}/threads{n}-kernels",
                              f"{STEPS} AdamW steps, {config}, {precision}, B 8 × T 64, d_model 64, "
                              f"{n} thread(s), no batch cut: kernels split their rows",
                              lambda c=config, p=precision, n=n: _threaded(
                                  n, False, train_case, c, p, None, False, "wide")))
    return cases


def _threaded(n, cut, fn, *args):
    with threads(n, cut):
        return fn(*args)


# ------------------------------------------------------------------------------------------------
# 2 MPI ranks: this script again, under mpiexec (as tests/training/test_distributed.py launches its worker)

def mpi_cases_in_worker(world):
    cases = [(f"mpi2/{c}/{p}", f"{STEPS} AdamW steps, {c}, {p}, 2 MPI ranks (rank 0's arrays)",
              lambda c=c, p=p: train_case(c, p, world)) for c in CONFIGS for p in PRECISIONS]
    cases += [(f"mpi2-zero1/{c}/{p}", f"{STEPS} AdamW steps, {c}, {p}, 2 MPI ranks, ZeRO-1",
               lambda c=c, p=p: train_case(c, p, world, zero=True))
              for c in ("defaults", "clipping", "frozen") for p in ("float64", "float32")]
    return cases


def mpi_worker(args):
    world = resolve("get_world")()
    arrays, manifest = run_cases(mpi_cases_in_worker(world), verbose=world.is_root, catch=False)
    if world.is_root:
        save(args.out, arrays, manifest, header())
    return 0


def mpi_cases(args):
    """Launch this script's worker on 2 ranks; its cases' arrays and manifest entries."""
    if resolve("find_mpiexec")() is None:
        raise FileNotFoundError("no mpiexec beside this Python nor on PATH")
    import tformer
    tree = os.path.dirname(os.path.dirname(os.path.abspath(tformer.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "mpi.npz")
        t0 = time.perf_counter()
        r = resolve("launch")(2, [os.path.abspath(__file__), "--mpi-worker", "--out", out],
                              timeout=600, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"mpiexec -n 2 failed ({r.returncode}):\n{r.stderr[-3000:]}")
        sys.stdout.write(r.stdout)
        arrays, manifest = load(out)
        with np.load(out, allow_pickle=False) as z:
            theirs = json.loads(str(z["__manifest__"]))["tformer"]
    if theirs != os.path.abspath(tformer.__file__):
        raise RuntimeError(f"the ranks imported {theirs}, this process {tformer.__file__}")
    print(f"  [mpiexec -n 2: {time.perf_counter() - t0:.1f} s]", flush=True)
    return arrays, manifest


# ------------------------------------------------------------------------------------------------
# decoding

DEC = dict(d_model=32, n_heads=4, n_layers=2, max_len=16, vocab_size=64)
DECODE_MODELS = {
    "defaults": {}, "modern": MODERN, "flash": dict(attention="flash"),
    "tied": dict(tie_embeddings=True), "post-norm": dict(norm_position="post"),
    "sinusoidal": dict(positions="sinusoidal"),
}
NEW = 10          # tokens generated; LONG: past max_len (the window slides)
LONG = 20


def decode_model(kind, dtype, variant=None):
    model = randomize(resolve("TinyGPT")(**DEC, seed=0, dtype=dtype, **DECODE_MODELS[kind]), 1, 0.3)
    if variant in ("lora", "lora-merged"):
        resolve("apply_lora")(model, 2, 4.0, "all", seed=1)
        randomize(resolve("Adapters")(model), 2, 0.1)
        if variant == "lora-merged":
            resolve("merge_lora")(model)
    elif variant in ("w8", "w8a8"):
        resolve("quantize_model")(model, variant)
    return model.eval()


def cached_step(model):
    """``step(tokens, caches) -> logits`` of decoding with a cache, and ``caches(B)``: through the
    first strategy this tree has (today ``Decoder`` / ``new_caches``; the issue's
    ``model.forward(tokens, kv_cache=caches)`` second)."""
    new_caches = resolve("new_caches")
    try:
        dec = resolve("Decoder")(model)
        return dec, lambda b: new_caches(model, b)
    except LookupError:
        return (lambda tokens, caches: model.forward(tokens, kv_cache=caches)), \
            (lambda b: new_caches(model, b))


def decode_arrays(model):
    greedy, sample = resolve("greedy"), resolve("sample")
    rng = np.random.default_rng(11)
    V_ = model.config["vocab_size"]
    out = {"forward_logits": model.forward(rng.integers(0, V_, (3, DEC["max_len"])))}
    prompt = rng.integers(0, V_, (2, 4))
    for cache in (True, False):
        tag = "cache" if cache else "nocache"
        out[f"greedy.{tag}"] = greedy(model, prompt, NEW, use_cache=cache)
        out[f"greedy_long.{tag}"] = greedy(model, prompt, LONG, use_cache=cache)
        out[f"sample.{tag}"] = sample(model, prompt, NEW, temperature=1.0, seed=3, use_cache=cache)
        out[f"sample_filtered.{tag}"] = sample(model, prompt, NEW, temperature=0.8, top_k=20,
                                               top_p=0.95, min_p=0.02, seed=4, use_cache=cache)
        out[f"sample_long.{tag}"] = sample(model, prompt, LONG, temperature=0.9, seed=5,
                                           use_cache=cache)
    # the logits each generated token was chosen from: fed one token at a time through the cache
    # (as generation with the cache feeds them), and by a full forward pass of each prefix (without)
    step, caches_of = cached_step(model)
    for run in ("greedy", "sample_filtered"):
        seq = out[f"{run}.cache"]
        caches = caches_of(prompt.shape[0])
        logits = [step(prompt, caches)]                                 # the prompt, then one token
        for t in range(prompt.shape[1], seq.shape[1] - 1):
            logits.append(step(seq[:, t:t + 1], caches))
        out[f"{run}.logits.cache"] = np.concatenate(logits, axis=1)   # (B, T0 + NEW − 1, V)
        out[f"{run}.logits.nocache"] = np.stack(
            [model.forward(seq[:, :t])[:, -1] for t in range(prompt.shape[1], seq.shape[1])], axis=1)
    return out


def decoding_cases():
    cases = []
    for kind in DECODE_MODELS:
        for dtype in (np.float32, np.float64):
            name = np.dtype(dtype).name
            cases.append((f"decode/{kind}/{name}", f"decoding, {kind} TinyGPT, {name}",
                          lambda k=kind, d=dtype: decode_arrays(decode_model(k, d))))
    for variant in ("lora", "lora-merged", "w8", "w8a8"):
        for kind in ("defaults", "modern"):
            cases.append((f"decode/{kind}/float32/{variant}", f"decoding, {kind}, float32, {variant}",
                          lambda k=kind, v=variant: decode_arrays(decode_model(k, np.float32, v))))
    for kind, variant in (("defaults", None), ("modern", None), ("defaults", "w8")):
        cases.append((f"decode/{kind}/float32/{variant or 'float'}/threads2",
                      f"decoding, {kind}, float32, {variant or 'float'}, 2 threads",
                      lambda k=kind, v=variant: _threaded(
                          2, False, lambda: decode_arrays(decode_model(k, np.float32, v)))))
    return cases


# ------------------------------------------------------------------------------------------------
# speculative decoding (tests/decoding/test_speculative.py's pairs)

def spec_pair(dtype=np.float32, target_variant=None, draft_variant=None, **kw):
    cfg = dict(d_model=16, n_heads=4, n_layers=2, max_len=24, vocab_size=40, dtype=dtype, **kw)
    TinyGPT = resolve("TinyGPT")
    target = randomize(TinyGPT(seed=0, **cfg), 3, 0.3)
    draft = randomize(TinyGPT(seed=0, **cfg), 4, 0.08, base=target)
    for model, variant in ((target, target_variant), (draft, draft_variant)):
        if variant == "w8":
            resolve("quantize_model")(model, "w8")
        elif variant == "lora":
            resolve("apply_lora")(model, 2, targets=("attn", "mlp"), seed=1)
            randomize(resolve("Adapters")(model), 9, 0.1)
    return target.eval(), draft.eval()


def spec_arrays(pair, runs):
    target, draft = pair
    out = {}
    for tag, prompt, n, kw in runs:
        tokens, stats = resolve("speculative_sample")(target, draft, np.array(prompt), n, **kw)
        out[f"{tag}.tokens"] = tokens
        out[f"{tag}.proposed"] = np.asarray(stats.proposed, np.int64)
        out[f"{tag}.accepted"] = np.asarray(stats.accepted, np.int64)
        out[f"{tag}.plain"] = np.asarray(stats.plain, np.int64)
        if kw.get("temperature") == 0:
            out[f"{tag}.greedy"] = resolve("greedy")(target, np.array(prompt), n)
    return out


def speculative_cases():
    greedy_runs = [(f"k{k}.n{n}", [[5, 1, 7]], n, dict(lookahead=k, temperature=0))
                   for k in (1, 2, 4) for n in (12, 30)]
    one = [("k3.n16", [[4, 9]], 16, dict(lookahead=3, temperature=0))]
    sampled = [("sampled", [[1, 3]], 16, dict(lookahead=3, temperature=1.0, seed=1)),
               ("filtered", [[1, 3]], 16, dict(lookahead=2, temperature=0.8, top_k=10, top_p=0.9,
                                               min_p=0.05, seed=2))]
    return [
        ("speculative/greedy/float32", "greedy speculative decoding, lookahead 1/2/4, to 12 and "
         "30 tokens (past max_len)", lambda: spec_arrays(spec_pair(), greedy_runs)),
        ("speculative/greedy/float64", "greedy speculative decoding, float64",
         lambda: spec_arrays(spec_pair(np.float64), one)),
        ("speculative/greedy/modern", "greedy speculative decoding, modern block",
         lambda: spec_arrays(spec_pair(**MODERN), one)),
        ("speculative/greedy/w8-target", "greedy speculative decoding, int8 target",
         lambda: spec_arrays(spec_pair(target_variant="w8"), one)),
        ("speculative/greedy/lora-draft", "greedy speculative decoding, LoRA draft",
         lambda: spec_arrays(spec_pair(draft_variant="lora"), one)),
        ("speculative/sampled/float64", "sampled speculative decoding, plain and filtered",
         lambda: spec_arrays(spec_pair(np.float64), sampled)),
    ]


# ------------------------------------------------------------------------------------------------
# DPO (tests/tuning/test_dpo.py's random pairs, tests/tuning/test_tune.py's model and pairs)

DPO_V = 11


def dpo_kernel_arrays(dtype):
    rng = np.random.default_rng(0)
    args = []
    for T_ in (6, 5):
        z = (2 * rng.standard_normal((3, T_, 7))).astype(dtype)
        y = rng.integers(0, 7, (3, T_))
        pos = np.arange(T_)
        start = rng.integers(1, 3, 3)[:, None]
        end = np.maximum(T_ - rng.integers(0, 3, 3)[:, None], start + 1)
        m = (pos >= start) & (pos < end)
        args.append((z, np.where(m, y, -100), m))
    (zw, yw, mw), (zl, yl, ml) = args
    logp = resolve("sequence_logp")
    ref_w = logp(rng.standard_normal(zw.shape).astype(dtype), yw, mw)
    ref_l = logp(rng.standard_normal(zl.shape).astype(dtype), yl, ml)
    losses, cache = resolve("dpo_forward")(zw, yw, mw, zl, yl, ml, ref_w, ref_l, 0.7)
    dw, dl = resolve("dpo_backward")(np.linspace(0.5, 1.5, 3).astype(losses.dtype), cache)
    mean, (mw_, ml_) = resolve("dpo_loss")(zw, yw, mw, zl, yl, ml, ref_w, ref_l, 0.7)
    return {"ref_logp_w": ref_w, "ref_logp_l": ref_l, "losses": losses, "dlogits_w": dw,
            "dlogits_l": dl, "mean_loss": np.float64(mean), "mean.dlogits_w": mw_,
            "mean.dlogits_l": ml_}


def dpo_model(dtype, seed=0):
    return resolve("TinyGPT")(d_model=8, n_heads=2, n_layers=2, max_len=16, vocab_size=DPO_V,
                              dtype=dtype, seed=seed).eval()


def dpo_pairs(n=6, seed=0):
    rng = np.random.default_rng(seed)
    P, R = 5, 6
    prompt = rng.integers(0, DPO_V, (n, P))
    p_len = rng.integers(2, P + 1, n)
    chosen, rejected = rng.integers(0, DPO_V, (n, R)), rng.integers(0, DPO_V, (n, R))
    return resolve("Pairs")(prompt, chosen, rng.integers(1, R + 1, n), rejected,
                            rng.integers(1, R + 1, n), p_len)


def dpo_step_arrays(dtype, lora):
    ref = dpo_model(dtype)
    pairs = dpo_pairs().reference(ref)
    model = copy.deepcopy(ref)
    params = model
    if lora:
        resolve("apply_lora")(model, 2, None, "all", seed=3)
        params = randomize(resolve("Adapters")(model), 4, 0.1)
    else:
        randomize(model, 4, 0.05)
    idx = np.array([0, 2, 3, 5])
    params.zero_grad()
    loss, dout = resolve("dpo_step_loss")(pairs, 0.3)(model, idx)
    model.backward(dout)
    out = {"ref_w": pairs.ref_w, "ref_l": pairs.ref_l, "loss": np.float64(loss), "dlogits": dout}
    out.update({f"grad.{n}": np.array(g) for n, _, g in params.named_parameters()})
    return out


def tune_arrays(loss, lora):
    ref = dpo_model(np.float32)
    pairs = dpo_pairs(n=12).reference(ref)
    tuned, hist = resolve("tune")(ref, pairs, loss, 3e-3, 3, seed=1, lora=lora, batch_pairs=6)
    out = history_arrays(hist)
    out.update({f"param.{n}": np.array(p) for n, p, _ in tuned.named_parameters()})
    return out


def dpo_cases():
    cases = []
    for dtype in (np.float64, np.float32):
        name = np.dtype(dtype).name
        cases.append((f"dpo/kernel/{name}", f"DPO loss and logit gradients, random logits, {name}",
                      lambda d=dtype: dpo_kernel_arrays(d)))
        for lora in (False, True):
            tag = "lora" if lora else "full"
            cases.append((f"dpo/step/{name}/{tag}", f"one DPO step's loss and gradients, {name}, {tag}",
                          lambda d=dtype, l=lora: dpo_step_arrays(d, l)))
    for lora in (None, dict(r=2, targets="attn")):
        tag = "lora" if lora else "full"
        for n in (1, 2, 3):
            cases.append((f"dpo/tune/{tag}/threads{n}", f"3 DPO tune steps, {tag}, {n} thread(s)",
                          lambda l=lora, n=n: _threaded(n, True, tune_arrays, "dpo", l)))
    cases.append(("dpo/tune-sft/full/threads1", "3 SFT tune steps", lambda: tune_arrays("sft", None)))
    return cases


# ------------------------------------------------------------------------------------------------
# running, saving, comparing

SEP = "|"                      # key = case + SEP + array


def run_cases(cases, verbose=True, catch=True):
    """Run ``cases``; an error is recorded and the run goes on (``catch=False``, under MPI: it
    stops the job, since the other rank may wait for this one in a collective)."""
    arrays, manifest = {}, []
    for name, description, fn in cases:
        t0 = time.perf_counter()
        entry = {"case": name, "description": description}
        try:
            got = fn()
            for k, v in got.items():
                arrays[f"{name}{SEP}{k}"] = np.asarray(v)
            entry["arrays"] = len(got)
        except Exception as e:          # noqa: BLE001 — recorded; the run goes on and exits 1
            if not catch:
                raise
            entry["error"] = f"{type(e).__name__}: {e}"
            print(f"ERROR {name}: {entry['error']}", file=sys.stderr, flush=True)
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        manifest.append(entry)
        if verbose:
            print(f"  {name:52s} {entry.get('arrays', 'ERROR'):>5} arrays {entry['seconds']:7.2f} s",
                  flush=True)
    return arrays, manifest


def save(path, arrays, cases, header=None):
    manifest = {**(header or {}), "cases": cases}
    text = json.dumps(manifest, indent=1)
    np.savez(path, **arrays, __manifest__=np.array(text))
    return text


def load(path):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "__manifest__"}
        manifest = json.loads(str(z["__manifest__"])) if "__manifest__" in z.files else {}
    return arrays, manifest.get("cases", [])


def header():
    import tformer
    tree = os.path.dirname(os.path.dirname(os.path.abspath(tformer.__file__)))
    try:
        commit = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--", "tformer"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, ""
    return {"tformer": os.path.abspath(tformer.__file__), "git_commit": commit,
            "tformer_modified_files": dirty.splitlines() if commit else None,
            "python": platform.python_version(), "numpy": np.__version__,
            "machine": platform.machine(), "environment": PINNED,
            "found": {w: f"{m.__name__}.{n}" for w, (m, n) in sorted(_found.items())}}


def produce(args):
    cases = training_cases() + decoding_cases() + speculative_cases() + dpo_cases()
    if args.only:
        cases = [c for c in cases if any(s in c[0] for s in args.only)]
    import tformer
    print(f"tformer: {os.path.dirname(os.path.abspath(tformer.__file__))}", flush=True)
    t0 = time.perf_counter()
    arrays, manifest = run_cases(cases)
    if not args.no_mpi and (not args.only or any("mpi2" in s for s in args.only)):
        try:
            more, more_manifest = mpi_cases(args)
            arrays.update(more)
            manifest += more_manifest
        except Exception as e:          # noqa: BLE001
            manifest.append({"case": "mpi2", "error": f"{type(e).__name__}: {e}"})
            print(f"ERROR mpi2: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t0
    text = save(args.out, arrays, manifest, {**header(), "seconds": round(seconds, 1)})
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        f.write(text + "\n")
    errors = [c["case"] for c in manifest if "error" in c]
    print(f"{len(arrays)} arrays of {len(manifest) - len(errors)} cases written to {args.out} "
          f"in {seconds:.1f} s" + (f"; {len(errors)} case(s) FAILED: {errors}" if errors else ""))
    return 1 if errors else 0


def identical(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def difference(a, b):
    """What differs between ``a`` and ``b``, in words."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"dtype/shape {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.dtype.kind not in "fciub":
        return f"{int(np.sum(a != b))} of {a.size} entries differ"
    x, y = a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(x) != np.isnan(y)
    both = ~(np.isnan(x) | np.isnan(y))
    d = np.abs(x - y)[both]
    scale = np.maximum(np.abs(x), np.abs(y))[both]
    rel = np.where(scale > 0, d / np.where(scale > 0, scale, 1), 0.0)
    n = int(np.sum(x[both] != y[both])) + int(nan.sum())
    return (f"{n} of {a.size} entries differ, max abs {d.max(initial=0):.3g}, "
            f"max rel {rel.max(initial=0):.3g}" + (f", NaN in one only at {int(nan.sum())}" if nan.any() else ""))


def compare(path_a, path_b):
    A, cases_a = load(path_a)
    Bz, cases_b = load(path_b)
    for side, cases in (("A", cases_a), ("B", cases_b)):
        for c in cases:
            if "error" in c:
                print(f"{side}: case {c['case']} failed: {c['error']}")
    keys = list(A) + [k for k in Bz if k not in A]         # A's order (the run's), then B's extra
    cases = {}
    for k in keys:
        cases.setdefault(k.rsplit(SEP, 1)[0], []).append(k)
    same_total = 0
    for case, ks in cases.items():
        lines, same = [], 0
        for k in ks:
            array = k.rsplit(SEP, 1)[1]
            if k not in A or k not in Bz:
                lines.append(f"    {array}: missing in {'A' if k not in A else 'B'}")
            elif identical(A[k], Bz[k]):
                same += 1
            else:
                lines.append(f"    {array}: {difference(A[k], Bz[k])}")
        same_total += same
        for side, src in (("A", A), ("B", Bz)):
            if len(ks) > 1 and not any(k in src for k in ks):
                lines = [f"    the whole case ({len(ks)} arrays) is missing in {side}"]
        print(f"{'ok  ' if same == len(ks) else 'DIFF'} {case:56s} {same:4d} of {len(ks):4d} bit-identical")
        for line in lines:
            print(line)
    print(f"{same_total} of {len(keys)} arrays bit-identical")
    return 0 if same_total == len(keys) else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="run the option matrix, write every array to this .npz")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two outputs")
    p.add_argument("--only", nargs="*", default=[], help="only cases whose name contains one of these")
    p.add_argument("--no-mpi", action="store_true", help="skip the 2-rank cases")
    p.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        p.error("give --out FILE.npz or --compare A.npz B.npz")
    if not args.out.endswith(".npz"):
        args.out += ".npz"                      # np.savez would add it
    if args.mpi_worker:
        return resolve("run_command")(mpi_worker, args)
    return produce(args)


if __name__ == "__main__":
    sys.exit(main())
