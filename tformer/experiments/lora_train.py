"""The runs of the LoRA experiment (``python -m tformer lora``), and of its chapter's live check.

A base TinyGPT is pretrained on the Python corpus (``TextData.from_stdlib``), then adapted to
Shakespeare (``tformer.data.shakespeare``) in one of four ways, all for the same steps with the
same batches for a given seed:

- ``full``: every parameter trained, from the base weights;
- ``lora``: rank-r adapters on the named linear layers (``tformer.nn.lora``), only A and B trained;
- ``scratch``: a fresh TinyGPT of the same shape trained on Shakespeare alone.

Every run goes through the book's one training loop (``tformer.training.train.train``): AdamW, clipping
at 1, linear warm-up and cosine decay to a tenth of the peak rate.
"""
import numpy as np

from tformer.nn import functional as F
from tformer.data.shakespeare import shakespeare_data
from tformer.data.text import TextData, bits_per_byte, evaluate_loss
from tformer.nn.lora import Adapters, LoRALinear, apply_lora, linear_layers
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW, cosine_with_warmup
from tformer.training.train import train

# The model and batches (TinyGPT's own default width, four heads), and both phases' schedules.
SHAPE = {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_len": 64}
BATCH = 32
BASE = {"steps": 1000, "lr": 3e-3, "warmup": 50, "weight_decay": 0.1, "seed": 0}
EVAL_WINDOWS = 256


def python_data(seed=0):
    return TextData.from_stdlib(SHAPE["max_len"], BATCH, 0.1, seed)


def verse_data(seed):
    return shakespeare_data(SHAPE["max_len"], BATCH, 0.1, seed)


def val_bpb(model, data):
    """Bits per byte of ``model`` on ``EVAL_WINDOWS`` fixed windows of ``data``'s validation split."""
    x, y = data.windows("val", EVAL_WINDOWS)
    was = model.training
    bpb = bits_per_byte(evaluate_loss(model.eval(), x, y))
    model.train(was)
    return bpb


def forward_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model.forward(x), y)


def fit(model, params, data, steps, lr, weight_decay, warmup, total=None, eval_every=0):
    """Train the parameters ``params`` sees (the model, or its ``Adapters``) for ``steps`` steps
    of a ``total``-step schedule (default ``steps``); returns the history of ``train``."""
    total = steps if total is None else total
    opt = AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)

    def schedule(step):
        return cosine_with_warmup(step, lr, warmup, total, lr / 10)

    def evaluate(m):
        return {"val_bpb": val_bpb(m, data)}
    hist = train(params, opt, data.batch, forward_loss, steps, clip_norm=1.0, lr_schedule=schedule,
                 evaluate=evaluate if eval_every else None, eval_every=eval_every,
                 progress_bar=False)
    hist["optimizer"] = opt
    return hist


def pretrain(steps=None):
    """The base model: ``steps`` (default all ``BASE["steps"]``) steps of the base schedule on the
    Python corpus. Returns ``(model, hist)``."""
    model = TinyGPT(**SHAPE, seed=BASE["seed"])
    hist = fit(model, model, python_data(BASE["seed"]), steps or BASE["steps"], BASE["lr"],
               BASE["weight_decay"], BASE["warmup"], total=BASE["steps"])
    return model, hist


def adapted(base_state, method, seed):
    """``(model, params)``: the model a method starts from and what its optimizer trains.
    ``method``: ``{"kind": "full" | "lora" | "scratch", "r": ..., "targets": ..., "s": ...}``
    (``s`` = α / r, default 1)."""
    model = TinyGPT(**SHAPE, seed=seed)
    if method["kind"] == "scratch":
        return model, model
    model.load_state_dict(base_state)
    if method["kind"] == "full":
        return model, model
    alpha = method.get("s", 1.0) * method["r"]
    apply_lora(model, method["r"], alpha, method["targets"], seed=seed)
    return model, Adapters(model)


def finetune(base_state, method, seed, steps, lr, weight_decay, eval_every=0):
    """Adapt the base (or start afresh) on Shakespeare, batches seeded by ``seed``, for ``steps``
    steps at peak rate ``lr`` (warm-up: a tenth of the steps). Returns ``(model, params, hist)``."""
    model, params = adapted(base_state, method, seed)
    hist = fit(model, params, verse_data(seed), steps, lr, weight_decay, max(1, steps // 10),
               eval_every=eval_every)
    return model, params, hist


def optimizer_state_bytes(opt):
    """Bytes of the optimizer's per-parameter state (Adam's two moments)."""
    return int(sum(a.nbytes for state in opt.state.values() for a in state.values()))


def trainable(params):
    """Number of scalars the optimizer of ``params`` updates."""
    return params.num_parameters() if isinstance(params, TinyGPT) else params.num_trainable()


def truncated(delta, r):
    """The best rank-r approximation of ``delta`` (its first r singular triplets)."""
    U, S, Vt = np.linalg.svd(delta, full_matrices=False)
    return (U[:, :r] * S[:r]) @ Vt[:r]


def products(model, B, T):
    """The matrix products of one training step of ``model`` on ``(B, T)`` tokens, read from its
    layers' shapes: ``[(what, batch, m, k, n)]``, each ``batch`` products (m, k) @ (k, n), so
    ``batch·m·k·n`` multiply-adds. A linear layer: X W forward, dX = dY Wᵀ and, unless W is
    frozen, dW = Xᵀ dY; an adapter adds its six thin products; attention (per block, B·H heads
    of D = C / H): Q Kᵀ and P V forward, dP = dO Vᵀ, dV = Pᵀ dO, dQ = dS K, dK = dSᵀ Q."""
    N, out = B * T, []
    for path, layer in linear_layers(model):
        base = layer.base if isinstance(layer, LoRALinear) else layer
        ci, co = base.W.shape
        out += [(path + " X W", 1, N, ci, co), (path + " dX", 1, N, co, ci)]
        if not base.is_frozen("W"):
            out.append((path + " dW", 1, ci, N, co))
        if isinstance(layer, LoRALinear):
            r = layer.r
            out += [(path + " X A", 1, N, ci, r), (path + " (XA) B", 1, N, r, co),
                    (path + " G Bᵀ", 1, N, co, r), (path + " dA", 1, ci, N, r),
                    (path + " dB", 1, r, N, co), (path + " (GBᵀ) Aᵀ", 1, N, r, ci)]
    cfg = model.config
    H, D = cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
    for i in range(cfg["n_layers"]):
        for what, m, k, n in (("Q Kᵀ", T, D, T), ("P V", T, T, D), ("dP", T, D, T),
                              ("dV", T, T, D), ("dQ", T, T, D), ("dK", T, T, D)):
            out.append((f"blocks.{i}.attn {what}", B * H, m, k, n))
    return out


def multiply_adds(model, B, T):
    """Σ batch·m·k·n over ``products(model, B, T)``: the multiply-adds of a step's products."""
    return sum(b * m * k * n for _, b, m, k, n in products(model, B, T))


def gradient_bytes(model, params):
    """``(needed, allocated)`` bytes of gradients: those of the trained parameters alone (what a
    framework that frees a frozen parameter's gradient holds, as PyTorch does), and the arrays
    tformer keeps (the flat buffer, whose layout does not depend on what is frozen, and the
    scratch arrays that frozen layers write into), each array counted once."""
    needed = sum(g.nbytes for _, _, g in params.named_parameters() if g is not None)
    seen, allocated = set(), 0
    for m in model.modules():
        for g in m.gradient_arrays():
            root = g if g.base is None else g.base
            if id(root) not in seen:
                seen.add(id(root))
                allocated += root.nbytes
    return int(needed), int(allocated)
