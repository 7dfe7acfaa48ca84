"""FLOP count of one TinyGPT training step (forward, backward, AdamW update).

Only matrix products are counted (they are > 95 % of the work at every size benchmarked here);
a product of an (M, K) by a (K, N) matrix costs 2·M·K·N FLOPs (one multiply and one add per term).
With N_tok = B·T tokens, C = d_model, F = d_ff, V = vocab_size, L = n_layers:

- **Forward, per layer**: the four projections W_qkv (C×3C), W_o (C×C), W_1 (C×F), W_2 (F×C) cost
  2·N_tok·(4C² + 2CF); attention costs 2·B·T²·C for S = QKᵀ and the same for Y = PV (summed over
  the H heads of width D = C/H, so H·D = C). The full T×T score matrix is counted, the usual
  convention for "model FLOPs" (nanoGPT's MFU, PaLM's appendix B), although the causal path of
  ``attention_forward`` computes only the tiles on and below the diagonal (5/8 of them at T = 256),
  as PyTorch's flash attention does too.
- **Forward, head**: the LM head W_lm (C×V) costs 2·N_tok·C·V. Embedding lookups are gathers, 0 FLOPs.
- **Backward**: every product Y = XW has two products in its backward (dX = dY Wᵀ and
  dW = Xᵀ dY) of the same size, and attention's two have four (dV, dP, dQ, dK): backward = 2 × forward.

So a training step costs 3 × forward, the "6·N·tokens" rule of Kaplan et al. (2020) plus the
attention term of Chowdhery et al. (2022, PaLM, appendix B):

    FLOPs = 6·N_tok·N_mm + 12·L·B·T²·C,    N_mm = L·(4C² + 2CF) + C·V

where N_mm counts the weights that enter a matrix product (biases, LayerNorm and embeddings are
left out). Elementwise work (LayerNorm, GELU, softmax, AdamW: ~10-30 FLOPs per element) is not
counted: it is memory-bound, and counting it would flatter a slow implementation.
"""


def _cfg(config):
    C, L, V = config["d_model"], config["n_layers"], config["vocab_size"]
    F = config.get("d_ff") or 4 * C
    return C, L, V, F


def matmul_shapes(config, B, T):
    """Every matrix product of one training step as ``(what, count, M, K, N)``.

    ``config`` is a TinyGPT ``.config`` dict (``d_model``, ``n_layers``, ``vocab_size``, ``d_ff``,
    ``n_heads``). ``count`` multiplies batched products (``B·H`` heads of attention).
    """
    C, L, V, F = _cfg(config)
    H = config["n_heads"]
    D, N = C // H, B * T
    rows = []
    for name, (k, n) in (("qkv", (C, 3 * C)), ("o", (C, C)), ("fc1", (C, F)), ("fc2", (F, C))):
        rows += [(f"{name} fwd", L, N, k, n), (f"{name} dX", L, N, n, k), (f"{name} dW", L, k, N, n)]
    rows += [("S = QK^T", L * B * H, T, D, T), ("Y = PV", L * B * H, T, T, D),
             ("dV = P^T dY", L * B * H, T, T, D), ("dP = dY V^T", L * B * H, T, D, T),
             ("dQ = dS K", L * B * H, T, T, D), ("dK = dS^T Q", L * B * H, T, T, D)]
    rows += [("lm_head fwd", 1, N, C, V), ("lm_head dX", 1, N, V, C), ("lm_head dW", 1, C, N, V)]
    return rows


def train_step_flops(config, B, T):
    """FLOPs of one training step: 6·B·T·N_mm + 12·L·B·T²·C (see the module docstring)."""
    C, L, V, F = _cfg(config)
    n_mm = L * (4 * C * C + 2 * C * F) + C * V
    return 6 * B * T * n_mm + 12 * L * B * T * T * C


def breakdown(config, B, T):
    """``{"dense": ..., "attention": ..., "total": ...}``: the 6·N·tokens part and the T² part."""
    C, L, V, F = _cfg(config)
    dense = 6 * B * T * (L * (4 * C * C + 2 * C * F) + C * V)
    attn = 12 * L * B * T * T * C
    return {"dense": dense, "attention": attn, "total": dense + attn}


def gemm_flops(M, K, N):
    """2·M·K·N: the FLOPs of one (M, K) @ (K, N) product."""
    return 2 * M * K * N
