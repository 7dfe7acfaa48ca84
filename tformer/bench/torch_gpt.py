"""The PyTorch twin of ``tformer.models.TinyGPT``, with the weights copied from a TinyGPT.

    X = W_te[tokens] + W_pe[:T]                      (B, T, C)
    X ← X + Attn(LN(X));  X ← X + MLP(LN(X))         n_layers times
    Z = LN(X) W_lm + b_lm                            (B, T, V)

The same architecture in the form a PyTorch user would write it: ``nn.Embedding``,
``nn.LayerNorm``, ``nn.Linear`` (fused ``W_qkv``),
``F.scaled_dot_product_attention(is_causal=True)`` and ``F.gelu(approximate="tanh")`` (or,
as TinyGPT's ``mlp`` says, ``F.relu`` or ``F.relu(h).square()``; and, as its ``norm``
says, ``nn.RMSNorm`` in every LayerNorm's place). ``nn.Linear`` stores
``weight: (d_out, d_in)``, the transpose of tformer's ``W: (d_in, d_out)``, so
``from_tinygpt`` copies ``W.T`` and ``grads_as_tformer`` transposes back. ``decode`` and
``greedy_kv`` generate with a key/value cache kept as a list of tensors grown by
``torch.cat``. Used by the benchmark and by the tests
(tests/experiments/test_benchmarks.py, and the training-trajectory test in
tests/kernels/test_torch_parity.py).
"""
import numpy as np
import torch
from torch import nn
from torch.nn import functional as TF

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


ACTIVATIONS = {"gelu": lambda h: TF.gelu(h, approximate="tanh"), "relu": TF.relu,
               "relu2": lambda h: TF.relu(h).square()}
NORMS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}     # γx / √(mean(x²) + ε)


class Block(nn.Module):
    """X ← X + Attn(LN₁(X)),  X ← X + MLP(LN₂(X)); causal, fused qkv, GELU (tanh) or ``mlp``'s
    activation, biases."""

    def __init__(self, C, H, d_ff, eps=1e-5, mlp="gelu"):
        super().__init__()
        self.H = H
        self.act = ACTIVATIONS[mlp]
        self.ln1 = nn.LayerNorm(C, eps=eps)
        self.qkv = nn.Linear(C, 3 * C)
        self.o = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=eps)
        self.fc1 = nn.Linear(C, d_ff)
        self.fc2 = nn.Linear(d_ff, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)                          # (B, T, C) each
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = TF.scaled_dot_product_attention(q, k, v, is_causal=True)             # (B, H, T, D)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))                       # (B, T, C)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))                     # (B, T, C)

    def decode(self, x, past=None):
        """The same block for generation: ``past`` = the (k, v) of earlier positions, (B, H, t, D)
        each, or None; returns ``(x, (k, v))`` with the new positions appended (``torch.cat``)."""
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)  # (B, H, t + T, D)
        # one new query sees every cached key: no mask; a prompt (no past) is causal
        y = TF.scaled_dot_product_attention(q, k, v, is_causal=past is None and T > 1)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(self.act(self.fc1(self.ln2(x)))), (k, v)


class TorchGPT(nn.Module):
    """logits = TorchGPT(tokens): ``tokens: (B, T)`` int64 -> ``logits: (B, T, V)``."""

    def __init__(self, d_model, n_heads, n_layers, max_len, vocab_size=256, d_ff=None,
                 mlp="gelu", norm="layernorm"):
        super().__init__()
        C = d_model
        self.norm = norm
        self.wte = nn.Embedding(vocab_size, C)
        self.wpe = nn.Embedding(max_len, C)
        self.blocks = nn.ModuleList(Block(C, n_heads, d_ff or 4 * C, mlp=mlp)
                                    for _ in range(n_layers))
        if norm != "layernorm":                       # the blocks' norms, the same names
            for block in self.blocks:
                block.ln1, block.ln2 = NORMS[norm](C, eps=1e-5), NORMS[norm](C, eps=1e-5)
        self.ln_f = NORMS[norm](C, eps=1e-5)
        self.lm_head = nn.Linear(C, vocab_size)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe.weight[:T]                               # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))                                        # (B, T, V)

    def decode(self, tokens, past=None):
        """Logits of new tokens after the cached ones: ``tokens: (B, T)`` -> ``((B, T, V), past)``,
        ``past`` a list of one (k, v) per block (None: nothing cached yet)."""
        start = 0 if past is None else past[0][0].shape[2]
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe.weight[start:start + T]                  # (B, T, C)
        new_past = []
        for i, block in enumerate(self.blocks):
            x, kv = block.decode(x, None if past is None else past[i])
            new_past.append(kv)
        return self.lm_head(self.ln_f(x)), new_past


@torch.inference_mode()
def greedy_kv(tm, prompt, max_new_tokens):
    """Greedy decoding with a KV cache, the loop a PyTorch user writes: the prompt once, then one
    token per step. ``prompt: (B, T0)`` int64 tensor -> ``(B, T0 + max_new_tokens)``."""
    out, past, feed = prompt, None, prompt
    for _ in range(max_new_tokens):
        logits, past = tm.decode(feed, past)                                     # (B, T, V)
        feed = logits[:, -1].argmax(dim=-1, keepdim=True)                        # (B, 1)
        out = torch.cat((out, feed), dim=1)
    return out


def _name_map(n_layers, norm="layernorm"):
    """tformer name -> (torch name, transpose?) for every parameter of a TinyGPT (its
    ``norm``: RMSNorm has no β)."""
    m = {"wte.W": ("wte.weight", False), "wpe.W": ("wpe.weight", False),
         "ln_f.gamma": ("ln_f.weight", False), "ln_f.beta": ("ln_f.bias", False),
         "lm_head.W": ("lm_head.weight", True), "lm_head.b": ("lm_head.bias", False)}
    for i in range(n_layers):
        ours, theirs = f"blocks.{i}.", f"blocks.{i}."
        for a, b in (("ln1", "ln1"), ("ln2", "ln2")):
            m[ours + a + ".gamma"] = (theirs + b + ".weight", False)
            m[ours + a + ".beta"] = (theirs + b + ".bias", False)
        for a, b in (("attn.qkv", "qkv"), ("attn.o", "o"), ("ffn.fc1", "fc1"), ("ffn.fc2", "fc2")):
            m[ours + a + ".W"] = (theirs + b + ".weight", True)
            m[ours + a + ".b"] = (theirs + b + ".bias", False)
    if norm == "rmsnorm":
        m = {k: v for k, v in m.items() if not k.endswith(".beta")}
    return m


def from_tinygpt(model):
    """A ``TorchGPT`` computing exactly what the TinyGPT ``model`` computes (same dtype, copied
    weights); a ValueError for a piece of the modern block the twin does not build."""
    cfg = model.config
    if cfg["dropout"]:
        raise ValueError(f"model: the torch twin has no dropout, got dropout = {cfg['dropout']}")
    built = {"norm": tuple(NORMS), "positions": ("learned",), "mlp": tuple(ACTIVATIONS),
             "tie_embeddings": (False,), "norm_position": ("pre",)}
    for key, allowed in built.items():
        if cfg.get(key, allowed[0]) not in allowed:
            raise ValueError(f"model: the torch twin builds {key} in {allowed}, got {cfg[key]!r}")
    if cfg.get("n_kv_heads", cfg["n_heads"]) != cfg["n_heads"]:
        raise ValueError(f"model: the torch twin has no grouped-query attention, got n_kv_heads = "
                         f"{cfg['n_kv_heads']} for {cfg['n_heads']} heads")
    tm = TorchGPT(cfg["d_model"], cfg["n_heads"], cfg["n_layers"], cfg["max_len"], cfg["vocab_size"],
                  cfg["d_ff"], cfg.get("mlp", "gelu"), cfg.get("norm", "layernorm"))
    tm = tm.to(_DTYPES[cfg["dtype"]])
    theirs = dict(tm.named_parameters())
    names = _name_map(cfg["n_layers"], tm.norm)
    with torch.no_grad():
        for name, p, _ in model.named_parameters():
            tname, transpose = names[name]
            src = torch.from_numpy(np.ascontiguousarray(p.T if transpose else p))
            if theirs[tname].shape != src.shape:
                raise ValueError(f"{name}: shape {tuple(src.shape)} does not fit {tname} "
                                 f"{tuple(theirs[tname].shape)}")
            theirs[tname].copy_(src)
    if len(names) != len(theirs):
        raise ValueError(f"model: {len(names)} tformer parameters for {len(theirs)} torch parameters")
    return tm


def grads_as_tformer(tm, n_layers):
    """``{tformer name: gradient as a NumPy array in tformer's layout}`` of a ``TorchGPT``."""
    theirs = dict(tm.named_parameters())
    out = {}
    for name, (tname, transpose) in _name_map(n_layers, tm.norm).items():
        g = theirs[tname].grad.detach().numpy()
        out[name] = g.T if transpose else g
    return out
