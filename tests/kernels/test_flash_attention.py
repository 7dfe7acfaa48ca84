"""The online-softmax attention kernel (chapter 24) against the plain kernel, finite differences and
its memory claim; the modules and models that select it with ``attention="flash"``.

"Equal" is the normwise relative error of ``tformer.core.gradcheck.rel_error`` (max |a − b| / max |b|)
of y and of every gradient, in float64, below 1e-12. PyTorch parity is in
``test_torch_parity_flash.py``.
"""
import json
import os
import tracemalloc

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.core import parallel
from tformer.__main__ import main as cli
from tformer.nn.attention import MultiHeadAttention
from tformer.training.checkpoint import read_checkpoint
from tformer.core.gradcheck import check_kernel, check_module, rel_error
from tformer.fast import flash_attention as fa
from tformer.models.tinygpt import TinyGPT
from tformer.models.transformer import Transformer

TOL = 1e-12


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def qkv(B=2, H=4, T=11, T_k=None, H_kv=None, D=5, D_v=3, seed=0):
    T_k = T if T_k is None else T_k
    H_kv = H if H_kv is None else H_kv
    return (randn(B, H, T, D, seed=seed), randn(B, H_kv, T_k, D, seed=seed + 1),
            randn(B, H_kv, T_k, D_v, seed=seed + 2))


def both(q, k, v, plain_kw, flash_kw, seed=9):
    """y and (dq, dk, dv) of the plain kernel and of the flash kernel, same random upstream gradient."""
    y, cache = F.attention_forward(q, k, v, **plain_kw)
    dy = randn(*y.shape, seed=seed)
    plain = (y, *F.attention_backward(dy, cache))
    y2, cache2 = F.flash_attention_forward(q, k, v, **flash_kw)
    return plain, (y2, *F.flash_attention_backward(dy, cache2))


def assert_equal_to_plain(plain, flash, tol=TOL):
    for name, a, b in zip(("y", "dq", "dk", "dv"), flash, plain):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.all(np.isfinite(a)), name
        assert rel_error(a, b) < tol, (name, rel_error(a, b))


PAD = np.array([[1] * 8 + [0] * 3, [1] * 11])           # the first sequence ends in 3 padding tokens


def padding(T=11):
    return F.padding_mask(PAD[:, :T])                   # (B, 1, 1, T)


# The same attention, asked of each kernel in its own terms (the plain kernel takes a combined mask).
CASES = {
    "none": ({}, {}),
    "causal": ({"is_causal": True}, {"is_causal": True}),
    "causal_mask": ({"mask": F.causal_mask(11)}, {"mask": F.causal_mask(11)}),
    "padding": ({"mask": padding()}, {"mask": padding()}),
    "causal+padding": ({"mask": padding() & F.causal_mask(11)}, {"mask": padding(), "is_causal": True}),
    "additive": ({"mask": 0.5 * randn(11, 11, seed=3)}, {"mask": 0.5 * randn(11, 11, seed=3)}),
    "causal+additive": ({"mask": np.where(F.causal_mask(11), 0.5 * randn(11, 11, seed=3), -np.inf)},
                        {"mask": 0.5 * randn(11, 11, seed=3), "is_causal": True}),
    "per_head": ({"mask": randn(2, 4, 11, 11, seed=4) > -0.5}, {"mask": randn(2, 4, 11, 11, seed=4) > -0.5}),
    "scale": ({"scale": 0.3, "is_causal": True}, {"scale": 0.3, "is_causal": True}),
}


@pytest.mark.parametrize("blocks", [(4, 3), (3, 8), (16, 16), (None, None)])
@pytest.mark.parametrize("case", list(CASES))
def test_equals_the_plain_kernel(case, blocks):
    """T = 11 is a multiple of no tile but 1; (16, 16) is one tile larger than T; None: the defaults."""
    plain_kw, flash_kw = CASES[case]
    q, k, v = qkv()
    plain, flash = both(q, k, v, plain_kw, dict(flash_kw, block_q=blocks[0], block_k=blocks[1]))
    assert_equal_to_plain(plain, flash)


@pytest.mark.parametrize("H_kv", [1, 2, 4])
@pytest.mark.parametrize("case", ["none", "causal", "causal+padding", "per_head"])
def test_grouped_query_attention_equals_the_plain_kernel(H_kv, case):
    plain_kw, flash_kw = CASES[case]
    q, k, v = qkv(H_kv=H_kv, seed=10)
    plain, flash = both(q, k, v, plain_kw, dict(flash_kw, block_q=4, block_k=3))
    assert_equal_to_plain(plain, flash)


@pytest.mark.parametrize("T,T_k", [(1, 1), (1, 9), (4, 9), (9, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_one_query_and_cross_lengths(T, T_k, causal):
    """T = 1, and T_q ≠ T_k: with ``is_causal`` the queries are the last T_q positions (a KV cache),
    the plain kernel's ``causal_mask(T_q, T_k)``."""
    if causal and T_k < T:
        with pytest.raises(ValueError, match="is_causal: needs T_k ≥ T_q"):
            F.flash_attention_forward(*qkv(T=T, T_k=T_k), is_causal=True)
        return
    q, k, v = qkv(T=T, T_k=T_k, seed=20)
    plain_kw = {"mask": F.causal_mask(T, T_k)} if causal else {}
    plain, flash = both(q, k, v, plain_kw, {"is_causal": causal, "block_q": 2, "block_k": 3})
    assert_equal_to_plain(plain, flash)


def test_two_and_three_dimensional_calls():
    q, k, v = qkv(seed=30)
    for kw in ({}, {"is_causal": True}, {"mask": F.causal_mask(11)}):
        for sl in ((0, 1), (1,)):                         # a (T, D) call, a (H, T, D) call
            qs, ks, vs = (a[sl] for a in (q, k, v))
            plain, flash = both(qs, ks, vs, {"mask": F.causal_mask(11)} if kw.get("is_causal") else kw,
                                dict(kw, block_q=4, block_k=3))
            assert_equal_to_plain(plain, flash)


def test_long_sequence_with_the_default_tiles():
    """Several default tiles in both directions and a ragged last one: T = 2·BLOCK_Q + 37."""
    T = 2 * fa.BLOCK_Q + 37
    q, k, v = qkv(B=1, H=2, T=T, H_kv=1, D=8, D_v=8, seed=40)
    plain, flash = both(q, k, v, {"is_causal": True}, {"is_causal": True})
    assert_equal_to_plain(plain, flash)
    plain, flash = both(q, k, v, {}, {})
    assert_equal_to_plain(plain, flash)


def test_scores_of_plus_minus_1e4():
    """Scores of ±1e4 with an O(1) spread among the largest: e^(s − m) neither overflows nor
    underflows to a wrong answer, and the gradients (which are O(1) here) agree to round-off.

    The first channel makes every score ±1e4 (q₀ = 100, k₀ = ±100, scale 1); the other channels
    spread the scores of a row's +1e4 keys by O(1), so that each row's softmax is a real
    distribution over them. (The running max m is kept apart from ℓ for exactly this case: the
    sum L = m + log ℓ would round to the 1.8e-12 spacing of floats near 1e4, and every recomputed
    probability of the row would inherit that error; chapter 24 measures it.)"""
    q, k, v = qkv(B=2, H=3, T=37, D=6, D_v=6, seed=50)
    q[..., 0] = 100.0
    k[..., 0] = 100.0 * np.random.default_rng(51).choice([-1.0, 1.0], size=k.shape[:-1])
    for kw in ({"scale": 1.0}, {"scale": 1.0, "is_causal": True}):
        y, cache = F.attention_forward(q, k, v, **kw)
        assert np.abs(np.einsum("bhtd,bhsd->bhts", q, k)).max() > 9e3
        plain, flash = both(q, k, v, kw, dict(kw, block_q=8, block_k=8))
        assert_equal_to_plain(plain, flash)
        assert np.abs(flash[1]).max() > 1e-3               # a gradient of size, not round-off


def test_saturated_rows_give_the_same_output():
    """Scores of ±1e4 spread widely: each row's softmax is one-hot (the others underflow to 0).
    The outputs agree to round-off; the gradients through a one-hot softmax are exactly zero in
    exact arithmetic, so both kernels return round-off noise there and only its size is checked."""
    q, k, v = qkv(seed=55)
    q, k = 100 * q, 100 * k
    plain, flash = both(q, k, v, {"is_causal": True}, {"is_causal": True, "block_q": 4, "block_k": 3})
    assert rel_error(flash[0], plain[0]) < TOL
    for a, b in zip(flash[1:], plain[1:]):
        assert np.all(np.isfinite(a))
        assert np.abs(a - b).max() < 1e-12 * np.abs(q).max() * np.abs(k).max()


def test_all_masked_rows_give_zero_output_and_zero_gradient():
    """Rows with no visible key: a query whose mask row is all False, a query in a sequence that is
    all padding, and a key tile that is all masked for some rows (T = 11 in tiles of 3)."""
    q, k, v = qkv(seed=60)
    mask = np.ones((2, 1, 11, 11), bool)
    mask[0, 0, 3] = False                                 # query 3 of sequence 0 sees nothing
    mask[1, 0, :, :] = False                              # sequence 1 sees nothing at all
    mask[0, 0, 5, :6] = False                             # query 5 sees keys 6… only (whole tiles masked)
    y, cache = F.flash_attention_forward(q, k, v, mask=mask, block_q=4, block_k=3)
    dq, dk, dv = F.flash_attention_backward(randn(*y.shape, seed=61), cache)
    for a in (y, dq, dk, dv):
        assert np.all(np.isfinite(a))
    assert np.all(y[0, :, 3] == 0) and np.all(y[1] == 0)
    assert np.all(dq[0, :, 3] == 0) and np.all(dq[1] == 0) and np.all(dk[1] == 0) and np.all(dv[1] == 0)
    plain, flash = both(q, k, v, {"mask": mask}, {"mask": mask, "block_q": 4, "block_k": 3})
    assert_equal_to_plain(plain, flash)
    for causal in (False, True):                          # every key masked (additive −inf as well)
        mask_inf = np.full((11, 11), -np.inf)
        y, cache = F.flash_attention_forward(q, k, v, mask=mask_inf, is_causal=causal, block_q=4, block_k=3)
        grads = F.flash_attention_backward(randn(*y.shape, seed=62), cache)
        assert all(np.array_equal(a, np.zeros_like(a)) for a in (y, *grads))


def test_no_keys_at_all():
    q, k, v = qkv(T=3, T_k=0, seed=65)
    y, cache = F.flash_attention_forward(q, k, v)
    dq, dk, dv = F.flash_attention_backward(randn(*y.shape, seed=66), cache)
    assert y.shape == (2, 4, 3, 3) and np.all(y == 0) and np.all(dq == 0) and dk.shape == k.shape


@pytest.mark.parametrize("case", ["none", "causal", "causal+padding", "additive"])
def test_finite_differences(case):
    _, flash_kw = CASES[case]
    q, k, v = qkv(seed=70)
    err = check_kernel(F.flash_attention_forward, F.flash_attention_backward, [q, k, v],
                       kwargs=dict(flash_kw, block_q=4, block_k=3))
    assert err < 1e-7


def test_finite_differences_grouped_and_cross_lengths():
    q, k, v = qkv(T=5, T_k=9, H_kv=2, seed=75)
    err = check_kernel(F.flash_attention_forward, F.flash_attention_backward, [q, k, v],
                       kwargs=dict(is_causal=True, scale=0.7, block_q=2, block_k=4))
    assert err < 1e-7


def test_float32_agrees_with_float64():
    q, k, v = qkv(B=2, H=2, T=100, D=16, D_v=16, seed=80)
    y64, _ = F.attention_forward(q, k, v, is_causal=True)
    y32, cache = F.flash_attention_forward(*(a.astype(np.float32) for a in (q, k, v)), is_causal=True,
                                           block_q=32, block_k=16)
    assert y32.dtype == np.float32 and rel_error(y32, y64) < 1e-5
    dy = randn(*y64.shape, seed=81)
    g64 = F.attention_backward(dy, F.attention_forward(q, k, v, is_causal=True)[1])
    g32 = F.flash_attention_backward(dy.astype(np.float32), cache)
    for a, b in zip(g32, g64):
        assert a.dtype == np.float32 and rel_error(a, b) < 1e-4


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("H_kv", [2, 1])
def test_float16_and_bfloat16_compute_their_tiles_in_float32(dt, H_kv):
    """Mixed precision: the same inputs, rounded to the low format, against the float32 kernel on
    their exact float32 values. The claim of ``tests/training/test_precision.py`` for every kernel (a few
    units of the format's roundoff u) holds; y and the gradients come back in the low format."""
    from tformer.core.dtypes import bfloat16, float16
    low = {"float16": float16, "bfloat16": bfloat16}[dt]
    u = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dt]
    q, k, v = (a.astype(low) for a in qkv(B=2, H=2, T=70, H_kv=H_kv, D=8, D_v=6, seed=85))
    mask = F.padding_mask((np.arange(70) < np.array([[60], [70]])).astype(int))
    y, cache = F.flash_attention_forward(q, k, v, mask=mask, is_causal=True, block_q=32, block_k=16)
    up = [a.astype(np.float32) for a in (q, k, v)]
    y_ref, cache_ref = F.attention_forward(*up, mask=mask & F.causal_mask(70))
    assert y.dtype == low and rel_error(y, y_ref) < 8 * u
    dy = randn(*y.shape, seed=86).astype(low)
    grads = F.flash_attention_backward(dy, cache)
    for g, g_ref in zip(grads, F.attention_backward(dy.astype(np.float32), cache_ref)):
        assert g.dtype == low and rel_error(g, g_ref) < 8 * u


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_tinygpt_with_flash_trains_in_low_precision(precision):
    """One SGD step of TinyGPT(attention="flash") in fp16 (with loss scaling) or bf16 against the
    same step in float32: ``tests/training/test_precision.py``'s tolerance for the modern block."""
    from tformer.training.optim import SGD
    from tformer.training.precision import MixedPrecision
    from tformer.training.train import train

    def batch(i):
        w = np.random.default_rng([7, i]).integers(0, 256, (4, 9))
        return w[:, :-1], w[:, 1:]

    def forward_loss(model, b):
        return F.cross_entropy(model.forward(b[0]), b[1])
    ref, low = (TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=3, attention="flash")
                for _ in range(2))
    mp = MixedPrecision(low, precision)
    before = ref.state_dict()
    train(ref, SGD(ref, lr=0.1), batch, forward_loss, 1, progress_bar=False)
    h = train(low, SGD(low, lr=0.1), batch, forward_loss, 1, precision=mp, progress_bar=False)
    assert h["skipped"] == []
    upd = [np.concatenate([(m.state_dict()[k] - before[k]).ravel() for k in before]) for m in (ref, low)]
    assert rel_error(upd[1], upd[0]) < {"fp16": 1e-2, "bf16": 6e-2}[precision]


def test_writes_into_head_merged_views():
    """``out=`` for y and for the three gradients, as MultiHeadAttention passes them (GQA layout)."""
    B, T, H, H_kv, D = 2, 9, 4, 2, 3
    q, k, v = qkv(B, H, T, H_kv=H_kv, D=D, D_v=D, seed=90)
    merged = np.empty((B, T, H * D))
    view = merged.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    y, cache = F.flash_attention_forward(q, k, v, is_causal=True, out=view, block_q=4, block_k=4)
    assert y is view and np.array_equal(merged, F.merge_heads(
        F.flash_attention_forward(q, k, v, is_causal=True, block_q=4, block_k=4)[0]))
    dy = randn(B, H, T, D, seed=91)
    fused = np.full((B, T, (H + 2 * H_kv) * D), np.nan)
    views = (fused[..., :H * D].reshape(B, T, H, D).transpose(0, 2, 1, 3),
             fused[..., H * D:(H + H_kv) * D].reshape(B, T, H_kv, D).transpose(0, 2, 1, 3),
             fused[..., (H + H_kv) * D:].reshape(B, T, H_kv, D).transpose(0, 2, 1, 3))
    F.flash_attention_backward(dy, cache, out=views)
    for a, b in zip(views, F.flash_attention_backward(dy, cache)):
        assert np.array_equal(a, b)


def test_two_threads_give_the_same_bits():
    q, k, v = qkv(B=4, H=2, T=40, D=8, D_v=8, seed=95)
    dy = randn(4, 2, 40, 8, seed=96)

    def run():
        y, cache = F.flash_attention_forward(q, k, v, is_causal=True, block_q=16, block_k=8)
        return (y, *F.flash_attention_backward(dy, cache))
    one = run()
    previous = parallel.set_num_threads(2)
    try:
        parallel.MIN_PART, saved = 1, parallel.MIN_PART      # split even this small job
        two = run()
    finally:
        parallel.MIN_PART = saved
        parallel.set_num_threads(previous)
    assert all(np.array_equal(a, b) for a, b in zip(one, two))


def peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_grows_linearly_and_stays_far_below_the_plain_kernel():
    """Forward + backward at T = 512 and 1024 (float32, causal): the plain kernel's peak holds the
    (B, H, T, T) probabilities and its dS; the online softmax's holds O(T·D) arrays and a few tiles."""
    def step(kernel_fw, kernel_bw, T, **kw):
        q, k, v = (a.astype(np.float32) for a in qkv(B=1, H=2, T=T, D=32, D_v=32, seed=97))
        dy = np.ones_like(q)

        def run():
            y, cache = kernel_fw(q, k, v, is_causal=True, **kw)
            kernel_bw(dy, cache)
        return peak_bytes(run)
    plain = {T: step(F.attention_forward, F.attention_backward, T) for T in (512, 1024)}
    flash = {T: step(F.flash_attention_forward, F.flash_attention_backward, T) for T in (512, 1024)}
    P_bytes = 2 * 1024 * 1024 * 4                                        # (1, 2, T, T) float32 at T = 1024
    assert plain[1024] > P_bytes                                         # P at least
    assert flash[1024] < plain[1024] / 8
    assert flash[1024] < 2.5 * flash[512]                                # linear in T, not quadratic
    tiles = 2 * 2 * fa.BLOCK_Q * fa.BLOCK_K * 4                          # the backward's two tile buffers
    qkv_bytes = 2 * 1024 * 32 * 4                                        # one (1, 2, T, 32) float32 array
    assert flash[1024] < 12 * qkv_bytes + 2 * tiles, (flash, qkv_bytes, tiles)


def test_nan_or_inf_scores_raise():
    q, k, v = qkv(seed=100)
    q[0, 0, 2, 0] = np.nan
    with pytest.raises(ValueError, match="scores: contain NaN or \\+inf"):
        F.flash_attention_forward(q, k, v)
    q[0, 0, 2, 0] = np.inf
    with pytest.raises(ValueError, match="scores: contain NaN or \\+inf"):
        F.flash_attention_forward(q, k, v, block_q=4, block_k=3)
    q, k, v = qkv(seed=100)
    q[0, 0, 2, 0] = np.nan                                                # a query whose
    mask = np.ones((11, 11), bool)
    mask[2] = False                                                       # row is masked: fine,
    y, _ = F.flash_attention_forward(q, k, v, mask=mask)                  # as in the plain kernel
    assert np.all(np.isfinite(y)) and np.all(y[0, 0, 2] == 0)


def test_rejects_bad_input():
    q, k, v = qkv()
    for kw, err, msg in [
        ({"block_q": 0}, ValueError, r"block_q: expected a positive integer tile size, got 0"),
        ({"block_k": 2.5}, ValueError, r"block_k: expected a positive integer tile size, got 2.5"),
        ({"block_q": True}, ValueError, r"block_q: expected a positive integer"),
        ({"mask": [[True]]}, TypeError, r"mask: expected a boolean or float NumPy array, got list"),
        ({"mask": np.ones((3, 3), bool)}, ValueError,
         r"mask: shape \(3, 3\) does not broadcast to scores \(2, 4, 11, 11\)"),
        ({"mask": np.ones((11, 11), np.int64)}, TypeError, r"mask: expected dtype bool or float, got int64"),
        ({"is_causal": 1}, TypeError, r"is_causal: expected True or False, got 1"),
        ({"out": np.empty((2, 4, 11, 5))}, ValueError,
         r"out: expected a float64 array of shape \(2, 4, 11, 3\)"),
    ]:
        with pytest.raises(err, match=msg):
            F.flash_attention_forward(q, k, v, **kw)
    with pytest.raises(TypeError, match="dtype mismatch"):
        F.flash_attention_forward(q, k.astype(np.float32), v)
    with pytest.raises(ValueError, match=r"k: expected key size D = 5"):
        F.flash_attention_forward(q, k[..., :4], v)
    with pytest.raises(ValueError, match=r"v: expected 11 positions"):
        F.flash_attention_forward(q, k, v[..., :4, :])
    with pytest.raises(ValueError, match=r"H = 4 query heads to be a multiple of the key/value heads "
                                         r"H_kv, got H_kv = 3"):
        F.flash_attention_forward(q, k[:, :3], v[:, :3])
    y, cache = F.flash_attention_forward(q, k, v)
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 4, 11, 3\), got \(2, 4, 11, 5\)"):
        F.flash_attention_backward(q, cache)
    with pytest.raises(ValueError, match="out: expected three arrays"):
        F.flash_attention_backward(y, cache, out=(np.empty_like(q),))


# --- the modules and models -------------------------------------------------------------------

def mha_pair(**kw):
    return (MultiHeadAttention(16, 4, dtype=np.float64, seed=3, **kw),
            MultiHeadAttention(16, 4, dtype=np.float64, seed=3, attention="flash", **kw))


@pytest.mark.parametrize("kw", [dict(causal=True, fused_qkv=True), dict(causal=False),
                                dict(causal=True, n_kv_heads=2, rope=True), dict(causal=True, n_kv_heads=1)])
@pytest.mark.parametrize("with_mask", [False, True])
def test_multi_head_attention_with_flash_equals_plain(kw, with_mask):
    plain, flash = mha_pair(**kw)
    x, dy = randn(2, 11, 16, seed=110), randn(2, 11, 16, seed=111)
    mask = padding() if with_mask else None
    y_p, y_f = plain(x, mask), flash(x, mask)
    assert flash.att is None and plain.att is not None
    assert rel_error(y_f, y_p) < TOL
    assert rel_error(flash.backward(dy), plain.backward(dy)) < TOL
    assert_same_gradients(plain, flash, TOL)


def assert_same_gradients(plain, flash, tol):
    """Every parameter gradient equal to ``tol``, each array's scale floored at 1e-2 of the largest
    gradient (as in ``tformer.core.gradcheck``): the key bias's gradient is zero in exact arithmetic
    (softmax ignores a shift shared by all keys), so both kernels return only round-off there."""
    floor = 1e-2 * max(np.abs(g).max() for _, _, g in plain.named_parameters())
    for (name, _, g_p), (_, _, g_f) in zip(plain.named_parameters(), flash.named_parameters()):
        assert rel_error(g_f, g_p, floor) < tol, (name, rel_error(g_f, g_p, floor))


def test_multi_head_attention_with_flash_decodes_with_the_kv_cache():
    plain, flash = mha_pair(causal=True, n_kv_heads=2, rope=True)
    x = randn(2, 9, 16, seed=120)
    full = flash(x)
    cache = flash.new_cache(2, 9)
    parts = [flash(x[:, :5], kv_cache=cache)] + [flash(x[:, t:t + 1], kv_cache=cache) for t in range(5, 9)]
    assert rel_error(np.concatenate(parts, axis=1), full) < TOL
    assert rel_error(full, plain(x)) < TOL
    with pytest.raises(RuntimeError, match="used a KV cache"):
        flash.backward(full)


def test_multi_head_attention_rejects_an_unknown_kernel():
    with pytest.raises(ValueError, match=r"attention: expected one of \['plain', 'flash'\], got 'fast'"):
        MultiHeadAttention(12, 4, attention="fast")


def tinygpt(attention, **kw):
    cfg = dict(d_model=16, n_heads=4, n_layers=2, max_len=40, seed=5, dtype=np.float64, attention=attention)
    return TinyGPT(**dict(cfg, **kw))


@pytest.mark.parametrize("kw", [{}, dict(positions="rope", n_kv_heads=2, norm="rmsnorm", mlp="swiglu")])
def test_tinygpt_with_flash_equals_plain(kw):
    tokens = np.random.default_rng(130).integers(0, 256, (3, 37))
    targets = np.random.default_rng(131).integers(0, 256, (3, 37))
    models = {a: tinygpt(a, **kw) for a in ("plain", "flash")}
    assert models["flash"].config["attention"] == "flash" and models["plain"].config["attention"] == "plain"
    losses = {}
    for a, model in models.items():
        loss, dlogits = F.cross_entropy(model.forward(tokens), targets)
        model.backward(dlogits)
        losses[a] = loss
    assert abs(losses["flash"] - losses["plain"]) < TOL * abs(losses["plain"])
    assert_same_gradients(models["plain"], models["flash"], TOL)


def test_tinygpt_with_flash_passes_the_gradient_check():
    model = tinygpt("flash", d_model=8, n_layers=1, max_len=6)
    tokens = np.random.default_rng(140).integers(0, 256, (2, 6))
    errors = check_module(model, tokens, max_entries=60)
    assert max(errors.values()) < 1e-6, errors


def test_tinygpt_rejects_an_unknown_kernel():
    with pytest.raises(ValueError, match=r"attention: expected one of \['plain', 'flash'\], got 'Flash'"):
        TinyGPT(attention="Flash")
    with pytest.raises(ValueError, match=r"attention: expected one of"):
        Transformer(50, d_model=8, n_heads=2, n_layers=1, d_ff=16, attention=None)


def test_transformer_with_flash_and_padding_equals_plain():
    """The complete Transformer: causal + padding masks, which the flash path reads tile by tile."""
    tokens = np.array([[5, 7, 9, 3, 0, 0, 0], [4, 4, 8, 1, 2, 6, 3]])
    targets = np.roll(tokens, -1, axis=1)
    models, losses = {}, {}
    for a in ("plain", "flash"):
        model = models[a] = Transformer(20, d_model=8, n_heads=2, n_layers=2, d_ff=16, max_len=7,
                                        dropout=0.0, dtype=np.float64, seed=1, attention=a)
        assert model.config["attention"] == a
        losses[a], dlogits = F.cross_entropy(model.forward(tokens), targets)
        model.backward(dlogits)
    assert abs(losses["flash"] - losses["plain"]) < TOL * abs(losses["plain"])
    assert_same_gradients(models["plain"], models["flash"], TOL)


def test_cli_run_tinygpt_with_flash_and_generate(tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("def add(a, b):\n    return a + b\n\n" * 40)
    ck = str(tmp_path / "ck.npz")
    rc = cli(["run", "tinygpt", "--text", str(text), "--steps", "2", "--d-model", "16",
              "--n-heads", "4", "--n-layers", "1", "--max-len", "24", "--batch-size", "2",
              "--eval-windows", "2", "--eval-every", "2", "--checkpoint", ck, "--sample-tokens", "8",
              "--temperatures", "1", "--no-progress", "--attention", "flash"])
    out = capsys.readouterr().out
    assert rc == 0 and os.path.exists(ck)
    assert "attention: the online softmax (flash)" in out
    assert read_checkpoint(ck)[0]["config"]["attention"] == "flash"
    assert cli(["generate", "--checkpoint", ck, "--prompt", "def ", "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    with pytest.raises(SystemExit):
        cli(["run", "tinygpt", "--attention", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_online_softmax_command_writes_each_part_with_its_commit(tmp_path, monkeypatch, capsys):
    from tformer.experiments import online_softmax
    out = str(tmp_path / "os.json")
    assert cli(["online-softmax", "--out", out, "--parts", "sweep", "--lengths", "64", "--reps", "1"]) == 0
    assert cli(["online-softmax", "--out", out, "--parts", "tiles", "--tile-T", "64",
                "--tile-sizes", "16", "32", "--tile-rounds", "1"]) == 0
    with open(out) as f:
        result = json.load(f)
    sweep, tiles = result["sweep"], result["tiles"]                       # the first part was kept
    assert {r["kernel"] for r in sweep["results"]} == {"plain", "flash"}
    assert all(r["peak_bytes"] > 0 and len(r["seconds"]) == 1 for r in sweep["results"])
    plain = next(r for r in sweep["results"] if r["kernel"] == "plain")
    assert plain["peak_bytes"] > online_softmax.plain_bytes(64, 4, 4)    # P and dS at least
    assert len(tiles["results"]) == 4 and tuple(tiles["best"]) in {(16, 16), (16, 32), (32, 16), (32, 32)}
    for part in (sweep, tiles):
        assert part["command"].startswith("python -m tformer online-softmax") and "commit" in part
    monkeypatch.setattr(online_softmax, "mem_available", lambda: 1 << 10)   # 1 KiB free
    assert cli(["online-softmax", "--out", out, "--parts", "sweep", "--lengths", "64", "--reps", "1"]) == 0
    with open(out) as f:
        plain = next(r for r in json.load(f)["sweep"]["results"] if r["kernel"] == "plain")
    assert "peak_bytes" not in plain and plain["skipped"].startswith("needs at least")
    assert "plain: skipped" in capsys.readouterr().out
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:                        # a usage error (issue 53)
        cli(["online-softmax", "--out", out, "--lengths", "0"])
    assert e.value.code == 2 and "argument --lengths: expected an integer ≥ 1" in capsys.readouterr().err
