"""The online-softmax attention kernel against PyTorch in float64 (skipped without torch).

``torch.nn.functional.scaled_dot_product_attention`` with the same inputs and masks, built on the
torch side from the same description (causal, padding, grouped-query heads), and a random
upstream gradient: y and the three gradients to 1e-12 relative (``rel_error``, normwise).
"""
import numpy as np
import pytest

import tformer.nn.functional as F
from tformer.core.gradcheck import rel_error

pytestmark = pytest.mark.torch_parity      # every test here; without torch the module is skipped, and the run fails
torch = pytest.importorskip("torch")
tF = torch.nn.functional
TOL = 1e-12


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


LENGTHS = [11, 7]                                    # valid tokens of each sequence (T = 11)


def torch_mask(kind, T):
    """The boolean mask (True = attend) of each case, built with torch."""
    pad = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]           # (B, T)
    pad = pad[:, None, None, :]                                                # (B, 1, 1, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return {"none": None, "causal": causal, "padding": pad, "causal+padding": pad & causal}[kind]


def ours(kind, T):
    """The same case as keywords of ``flash_attention_forward``."""
    tokens = (np.arange(T)[None, :] < np.array(LENGTHS)[:, None]).astype(np.int64)   # 1 = token, 0 = pad
    pad = F.padding_mask(tokens, pad_idx=0)
    return {"none": {}, "causal": {"is_causal": True}, "padding": {"mask": pad},
            "causal+padding": {"mask": pad, "is_causal": True}}[kind]


@pytest.mark.parametrize("H_kv", [4, 2, 1])
@pytest.mark.parametrize("kind", ["none", "causal", "padding", "causal+padding"])
def test_flash_attention_matches_torch_sdpa(kind, H_kv):
    B, H, T, D = 2, 4, 11, 6
    q, k, v = randn(B, H, T, D, seed=1), randn(B, H_kv, T, D, seed=2), randn(B, H_kv, T, D, seed=3)
    g = randn(B, H, T, D, seed=4)
    y, cache = F.flash_attention_forward(q, k, v, block_q=4, block_k=3, **ours(kind, T))
    grads = F.flash_attention_backward(g, cache)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    ty = tF.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch_mask(kind, T), enable_gqa=H_kv != H)
    ty.backward(torch.tensor(g))
    for a, b in zip((y, *grads), (ty, tq.grad, tk.grad, tv.grad)):
        b = b.detach().numpy()
        assert a.shape == b.shape
        assert rel_error(a, b) < TOL, rel_error(a, b)


def test_flash_attention_matches_torch_at_the_default_tiles():
    """Several default tiles and a ragged last one, causal."""
    B, H, T, D = 1, 2, 300, 16
    q, k, v, g = (randn(B, H, T, D, seed=s) for s in (5, 6, 7, 8))
    y, cache = F.flash_attention_forward(q, k, v, is_causal=True)
    grads = F.flash_attention_backward(g, cache)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    ty = tF.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    ty.backward(torch.tensor(g))
    for a, b in zip((y, *grads), (ty, tq.grad, tk.grad, tv.grad)):
        assert rel_error(a, b.detach().numpy()) < TOL
