"""The worked solutions of the exercises of the scaling chapters (Performance, Fitting in memory,
Fewer bits, Many processes, Attention that never stores T × T, The modern block): every number and
formula a solution states, checked. Each test names its chapter and exercise; derivations are
checked with SymPy, numbers with NumPy and the package."""
import json
import math
from pathlib import Path

import numpy as np
import sympy as sp

import tformer.nn.functional as F

DATA = Path(__file__).resolve().parents[2] / "book" / "data"


# --- Performance ------------------------------------------------------------------------------
def test_20_1_fixed_blocks_give_the_same_bits_for_any_thread_count():
    rng = np.random.default_rng(0)
    dy = rng.standard_normal((2048, 64)).astype(np.float32)     # B·T = 2048 rows, C = 64
    blocks = [dy[i:i + 256].sum(axis=0) for i in range(0, 2048, 256)]

    def reduce_in_order(sums):
        total = np.zeros(64, np.float32)
        for s in sums:
            total += s
        return total

    # whichever thread computed a block, the blocks are added in the same order: the same bits
    one_thread = reduce_in_order(blocks)
    two_threads = reduce_in_order([blocks[i] for i in range(8)])   # blocks 0-3 and 4-7, in order
    assert np.array_equal(one_thread, two_threads)
    # but another association than one reduction over all rows: equal to float rounding only
    whole = dy.sum(axis=0)
    assert np.abs(one_thread - whole).max() <= 1e-5 * np.abs(dy).sum(axis=0).max()
    assert len(blocks) == 8 and dy.size == 2**17                   # 8 blocks, 131,072 numbers
    assert dy.nbytes == 512 * 1024                                 # one pass over 512 KiB


def test_20_2_share_of_the_score_matrix_the_causal_tiles_compute():
    def computed(T, t):
        # tile [a, a + t) of the queries meets the keys [0, a + t)
        return sum(t * (a + t) for a in range(0, T, t))

    for T in (256, 1024):
        for t in (16, 32, 64, 128):
            n = T // t
            assert sp.Rational(computed(T, t), T * T) == sp.Rational(n + 1, 2 * n)
    assert sp.Rational(computed(256, 64), 256**2) == sp.Rational(5, 8)
    assert sp.Rational(computed(256, 16), 256**2) == sp.Rational(17, 32)
    assert sp.Rational(computed(1024, 64), 1024**2) == sp.Rational(17, 32)
    assert sp.Rational(computed(1024, 16), 1024**2) == sp.Rational(65, 128)
    # going from t = 64 to t = 16 at T = 1024 saves 3/128 of T²
    assert sp.Rational(17, 32) - sp.Rational(65, 128) == sp.Rational(3, 128)
    # the number of tiles, and so of calls, grows as T / t
    assert 1024 // 16 == 4 * (1024 // 64)


def test_20_3_amdahl_bound_of_two_blas_threads():
    s = sp.Symbol("s", positive=True)        # the share of the step in BLAS products
    speedup = 1 / ((1 - s) + s / 2)
    assert sp.simplify(speedup - 2 / (2 - s)) == 0
    assert sp.simplify(speedup.subs(s, 1) - 2) == 0 and speedup.subs(s, 0) == 1
    # it grows with s: below 4/3 while the products are less than half of the step
    assert sp.simplify(sp.diff(speedup, s) - 2 / (2 - s) ** 2) == 0
    assert speedup.subs(s, sp.Rational(1, 2)) == sp.Rational(4, 3)


def test_20_4_three_parts_on_two_cores():
    from tformer.training.batch_threads import parts

    sizes = [b - a for a, b in parts(32, 3)]
    assert sizes == [10, 11, 11]
    assert [b - a for a, b in parts(32, 2)] == [16, 16]
    # the best that two cores can do with three parts: one core runs two of them
    best = min(max(sum(sizes[i] for i in g), sum(sizes) - sum(sizes[i] for i in g))
               for g in ([0], [1], [2]))
    assert best == 21
    assert sp.Rational(best, 16) == sp.Rational(21, 16)        # 21/16 of the two-part time


# --- Fitting in memory ------------------------------------------------------------------------
B, T, C, H, d_ff, L, V, s, k = sp.symbols("B T C H d_ff L V s k", positive=True)
M_BLOCK = B * T * (8 * C + H * T + 3 * d_ff + 4)


def _kept_bytes(model, tokens):
    def owner(a):
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a

    skip = {id(owner(model.flat_buffers()[0])), id(owner(tokens))}
    seen = {}

    def visit(x):
        if isinstance(x, np.ndarray):
            o = owner(x)
            if id(o) not in skip:
                seen[id(o)] = o.nbytes
        elif isinstance(x, (tuple, list)):
            for y in x:
                visit(y)

    for m in model.modules():
        visit(m.saved_values())
    return sum(seen.values())


def test_21_1_rope_and_swiglu_in_the_cache_count():
    from tformer.models.tinygpt import TinyGPT

    tokens = np.random.default_rng(0).integers(0, 256, (3, 20))
    kw = dict(d_model=32, n_heads=2, n_layers=3, max_len=20, seed=0)
    base = TinyGPT(**kw)
    base.forward(tokens)
    kept = {"base": _kept_bytes(base, tokens)}
    for name, extra in (("rope", dict(positions="rope")),
                        ("swiglu", dict(mlp="swiglu", d_ff=85))):
        m = TinyGPT(**kw, **extra)
        m.forward(tokens)
        kept[name] = _kept_bytes(m, tokens)
    subs = {B: 3, T: 20, C: 32, H: 2, d_ff: 128, L: 3, s: 4}
    table = s * (B * T * C + L * M_BLOCK + B * T * C + 2 * B * T)
    assert kept["base"] == table.subs(subs)
    # RoPE: per block, the rotated q and k (2 B T C) and the cos and sin tables of each
    # ((T, D/2) twice, for q and for k: 2 T D), in 4-byte floats
    BTd = 3 * 20
    D = 16
    assert kept["rope"] - kept["base"] == 3 * 4 * (2 * BTd * 32 + 2 * 20 * D)
    # SwiGLU of hidden width h: the GELU MLP's 3 B T d_ff become 4 B T h (a, b, silu(a), its
    # product with b); with h = 85 against d_ff = 128, per block and in bytes:
    h = 85
    assert kept["swiglu"] - kept["base"] == 3 * 4 * BTd * (4 * h - 3 * 128)


def test_21_2_checkpointing_only_the_mlp():
    attn = 2 * B * T + 5 * B * T * C + B * H * T**2          # LN_1, W_qkv's input, q k v, P, W_o's
    mlp = 3 * B * T * C + 2 * B * T + 3 * B * T * d_ff        # LN_2, W_1's input, GELU, W_2's, out
    assert sp.expand(attn + mlp - M_BLOCK) == 0
    # kept: the attention half's caches, its output (LN_2's input) and the block's output
    # (the next block's input)
    kept_per_block = attn + 2 * B * T * C
    assert sp.expand(M_BLOCK - kept_per_block - (B * T * C + 3 * B * T * d_ff + 2 * B * T)) == 0
    # the backward pass rebuilds one MLP's other caches at a time
    rebuilt = mlp - 2 * B * T * C
    saved = sp.expand(L * (M_BLOCK - kept_per_block) - rebuilt)
    assert sp.expand(saved - (L - 1) * (B * T * C + 3 * B * T * d_ff + 2 * B * T)) == 0
    # time: the MLP's forward (two products of 2·B·T·C·4C) computed again
    F_layer = 24 * B * T * C**2 + 4 * B * T**2 * C            # one layer's forward, d_ff = 4C
    extra = 16 * B * T * C**2
    ratio_mlp = sp.simplify((3 * F_layer + extra) / (3 * F_layer))
    ratio_all = sp.simplify((4 * F_layer) / (3 * F_layer))
    assert ratio_all == sp.Rational(4, 3)
    assert sp.limit(ratio_mlp, T, 0) == sp.Rational(11, 9)


def test_21_3_flash_attention_memory_prediction():
    head = (B * T * C + 2 * B * T) + B * T * V
    M_block_f = M_BLOCK.subs(H, 0)                             # the B H T² term gone
    S_f = 2 * B * T * d_ff + 2 * B * T * C
    W = 7 * B * T * C
    M_off = s * (B * T * C + L * M_block_f + head + S_f + W)
    M_1 = s * (L * B * T * C + B * T * C + M_block_f + head + S_f + W)
    subs = {B: 8, T: 4096, C: 128, H: 4, d_ff: 512, L: 4, V: 256, s: 4}
    assert M_off.subs(subs) == 1_696_858_112
    assert M_1.subs(subs) == 755_761_152
    # the plain kernel would add L + 1 copies of B H T² floats (L caches and the work array dS)
    assert (5 * 8 * 4 * 4096**2 * 4) == 10_737_418_240
    # what the online softmax keeps instead of P: two numbers per row, m and ℓ (2 B H T per
    # block), on top of the table without its B H T² term, counted on a real model
    from tformer.models.tinygpt import TinyGPT

    tokens = np.random.default_rng(0).integers(0, 256, (3, 20))
    model = TinyGPT(d_model=32, n_heads=2, n_layers=3, max_len=20, seed=0, attention="flash")
    model.forward(tokens)
    small = {B: 3, T: 20, C: 32, H: 2, d_ff: 128, L: 3, s: 4}
    table_f = s * (B * T * C + L * M_block_f + B * T * C + 2 * B * T)
    assert _kept_bytes(model, tokens) == (table_f + s * L * 2 * B * H * T).subs(small)


# --- Fewer bits -------------------------------------------------------------------------------
def test_22_1_the_scaler_from_one():
    from tformer.training.precision import DynamicLossScaler

    steps = json.loads((DATA / "fewer_bits.json").read_text())["config"]["steps"]
    sc = DynamicLossScaler(init_scale=1.0)
    interval = sc.growth_interval
    assert interval == 2000 and steps < interval         # PyTorch's default; the run is shorter
    for _ in range(steps):
        sc.update(False)
    assert sc.scale == 1.0                               # the chapter's run: not one doubling
    for _ in range(interval - steps):
        sc.update(False)
    assert sc.scale == 2.0                               # the first after 2000
    assert 16 * interval == 32_000                       # 2¹⁶ after 32,000 clean steps
    # the chapter's float16 run, at S = 2¹⁶, skipped no step
    runs = json.loads((DATA / "fewer_bits.json").read_text())["runs"]
    assert runs["fp16"]["skipped"] == [] and runs["fp16"]["history"]["loss_scale"][0] == 2.0**16


def test_22_2_headroom_of_the_loss_scale():
    from tformer.experiments.fewer_bits import build, run_args

    args = run_args([])
    data, gpt, _, _ = build(args)
    xb, yb = data.batch(0)
    _, dlogits = F.cross_entropy(gpt.forward(xb), yb)
    gpt.zero_grad()
    gpt.backward(dlogits)
    g_max = float(np.abs(gpt.flat_buffers()[1]).max())
    S_max = 65504 / g_max
    assert 0 < math.log2(S_max / 2**16) < 1                 # less than one binade of headroom
    assert S_max < 2**17                                    # one more doubling overflows
    # exercise 1: with S = 1 the largest gradient is below 1, far below 65504
    assert g_max < 1
    # the loss gradients, times 2^16: more than ten binades below float16's largest number
    assert math.log2(65504 / (float(np.abs(dlogits).max()) * 2**16)) > 10


def test_22_3_per_tensor_step_error_ratio():
    rng = np.random.default_rng(0)
    # columns of very different scales, as trained weights have
    W = rng.standard_normal((256, 128)) * np.exp(rng.standard_normal(128))
    x = rng.standard_normal((512, 256))

    def quantize(W, step):
        return np.round(W / step) * step

    s_col = np.abs(W).max(axis=0) / 127
    s_all = np.abs(W).max() / 127
    e_col = np.linalg.norm(x @ quantize(W, s_col) - x @ W)
    e_all = np.linalg.norm(x @ quantize(W, s_all) - x @ W)
    # rounding error of each entry ~ uniform in ±step/2: the error grows with the rms step
    predicted = s_all / np.sqrt(np.mean(s_col**2))
    assert abs(e_all / e_col / predicted - 1) < 0.1


def test_22_4_exact_float32_limit_from_the_width():
    Kmax = 2**24 // 127**2
    assert Kmax == 1040
    assert 4 * 260 <= Kmax < 4 * 261


# --- Many processes ---------------------------------------------------------------------------
p, N, alpha, beta = sp.symbols("p N alpha beta", positive=True)
T_RING = 2 * (p - 1) * alpha + 2 * (p - 1) / p * N * beta
T_RD = sp.log(p, 2) * (alpha + N * beta)


def test_23_1_overlap_bound_of_the_head():
    from tformer.models.tinygpt import TinyGPT

    n = TinyGPT(d_model=128, n_heads=4, n_layers=3, max_len=64).num_parameters()
    head = 128 * 256 + 256
    assert n == 669_056 and head == 33_024
    assert abs(head / n - 0.049) < 0.001


def test_23_2_recursive_doubling_against_the_ring():
    # p = 2: one latency less, whatever N
    assert sp.simplify(T_RING.subs(p, 2) - T_RD.subs(p, 2)) == alpha
    # p = 4: recursive doubling wins below N* = 8 α / β
    N_star = sp.solve(sp.Eq(T_RD.subs(p, 4), T_RING.subs(p, 4)), N)[0]
    assert sp.simplify(N_star - 8 * alpha / beta) == 0
    # general p (a power of two): N* = (2(p−1) − log₂p) α / ((log₂p − 2(p−1)/p) β)
    general = (2 * (p - 1) - sp.log(p, 2)) * alpha / ((sp.log(p, 2) - 2 * (p - 1) / p) * beta)
    assert sp.simplify(general.subs(p, 4) - N_star) == 0
    assert sp.simplify(general.subs(p, 8) - sp.Rational(44, 5) * alpha / beta) == 0
    ar = json.loads((DATA / "many_processes.json").read_text())["allreduce"]
    a_hat, b_hat = ar["fit"]["a_seconds"] / 2, ar["fit"]["b_seconds_per_number"]
    assert 9_000 < 8 * a_hat / b_hat < 10_500


def test_23_3_a_nan_reaches_every_rank():
    rng = np.random.default_rng(0)
    grads = rng.standard_normal((4, 10))
    grads[2, 3] = np.nan
    summed = grads.sum(axis=0)                     # what every rank holds after the all-reduce
    assert np.isnan(summed[3]) and np.isfinite(np.delete(summed, 3)).all()
    ranks = [summed.copy() for _ in range(4)]      # every rank holds the same sum
    assert all(not np.isfinite(r).all() for r in ranks)   # so every rank's check refuses it


# --- Attention that never stores T × T --------------------------------------------------------
def test_24_1_probabilities_from_the_log_sum_exp():
    rng = np.random.default_rng(0)
    worst = {}
    for dtype in (np.float64, np.float32):
        S = (rng.uniform(-1, 1, (64, 64)) * 1e4).astype(dtype)
        m = S.max(axis=-1, keepdims=True)
        ell = np.exp(S - m).sum(axis=-1, keepdims=True)
        P_ml = np.exp(S - m) / ell
        P_lse = np.exp(S - (m + np.log(ell)))
        exact = np.exp(S.astype(np.float64) - m.astype(np.float64))
        exact /= exact.sum(axis=-1, keepdims=True)
        big = exact > 1e-6
        worst[dtype] = (np.abs(P_lse[big] - exact[big]) / exact[big]).max(), \
            (np.abs(P_ml[big] - exact[big]) / exact[big]).max()
    assert worst[np.float64][0] < 2e-12                      # near one ulp of m = 1e4
    assert 1e-4 < worst[np.float32][0] < 1e-3                # a few 1e-4 in float32
    assert worst[np.float32][1] < 1e-6 < worst[np.float32][0]   # more than e^{S−m}/ℓ's rounding
    # one ulp of m = 1e4: 2⁻³⁹ in float64, 2⁻¹⁰ in float32
    assert np.spacing(1e4) == 2.0**-39 and np.spacing(np.float32(1e4)) == 2.0**-10


def test_24_2_two_halves_merge_into_one_pass():
    rng = np.random.default_rng(1)
    s, v = rng.standard_normal(40) * 3, rng.standard_normal((40, 8))

    def state(s, v):
        m = s.max()
        e = np.exp(s - m)
        return m, e.sum(), e @ v

    def merge(a, b):
        m = max(a[0], b[0])
        fa, fb = np.exp(a[0] - m), np.exp(b[0] - m)
        return m, fa * a[1] + fb * b[1], fa * a[2] + fb * b[2]

    p = np.exp(s - s.max())
    for cut in range(1, len(s)):                   # whatever the split
        m, ell, o = merge(state(s[:cut], v[:cut]), state(s[cut:], v[cut:]))
        assert np.allclose(o / ell, p @ v / p.sum(), rtol=1e-12, atol=1e-12)


def test_24_3_dq_is_a_sum_over_key_tiles():
    rng = np.random.default_rng(2)
    q, k, v, dy = rng.standard_normal((4, 1, 1, 32, 8))
    _, cache = F.attention_forward(q, k, v)
    dq, dk, dv = F.attention_backward(dy, cache)
    P = cache.P[0, 0]
    dP = dy[0, 0] @ v[0, 0].T
    dS = P * (dP - (dP * P).sum(-1, keepdims=True))
    scale = 1 / np.sqrt(8)
    tiles = [slice(j, j + 8) for j in range(0, 32, 8)]
    # key tiles outside: dK and dV of a tile are finished inside it, dQ gathers from every tile
    dq_sum = sum(scale * dS[:, t] @ k[0, 0][t] for t in tiles)
    assert np.allclose(dq_sum, dq[0, 0], rtol=1e-10, atol=1e-12)
    for t in tiles:
        assert np.allclose(scale * dS[:, t].T @ q[0, 0], dk[0, 0][t], rtol=1e-10, atol=1e-12)


# --- The modern block -------------------------------------------------------------------------
def test_25_1_rmsnorm_with_a_bias_against_layernorm():
    n = 3
    xs = sp.symbols(f"x1:{n + 1}", real=True)
    gs = sp.symbols(f"g1:{n + 1}", real=True)       # γ ⊙ dy
    ms = sum(x**2 for x in xs) / n
    rms = [x / sp.sqrt(ms) for x in xs]              # + β: its gradient is Σ dy, as LayerNorm's
    mu = sum(xs) / n
    var = sum((x - mu) ** 2 for x in xs) / n
    ln = [(x - mu) / sp.sqrt(var) for x in xs]
    d_rms = [sum(g * sp.diff(y, x) for g, y in zip(gs, rms)) for x in xs]
    d_ln = [sum(g * sp.diff(y, x) for g, y in zip(gs, ln)) for x in xs]
    # on a zero-mean row the outputs agree, the input gradients differ by rstd · mean(g)
    row = {xs[0]: 1, xs[1]: -3, xs[2]: 2}
    for a, b in zip(rms, ln):
        assert sp.simplify(a.subs(row) - b.subs(row)) == 0
    rstd = 1 / sp.sqrt(var.subs(row))
    for a, b in zip(d_rms, d_ln):
        assert sp.simplify((a - b).subs(row) - rstd * sum(gs) / n) == 0
    # β is absorbed by the next linear layer's bias: (x̂γ + β) W + b = x̂γW + (βW + b)
    rng = np.random.default_rng(0)
    xh, beta_, W, b = rng.standard_normal((4, 5)), rng.standard_normal(5), \
        rng.standard_normal((5, 3)), rng.standard_normal(3)
    assert np.allclose((xh + beta_) @ W + b, xh @ W + (beta_ @ W + b))


def test_25_2_half_split_rope_is_a_permutation():
    from tformer.kernels.rope import rope_forward

    D = 8
    perm = np.r_[0:D:2, 1:D:2]          # interleaved (2i, 2i + 1) -> half-split (i, i + D/2)
    Pi = np.eye(D)[:, perm]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 5, D))
    y, _ = rope_forward(x)
    # half-split rotation of the permuted vector = the interleaved rotation, permuted
    half = x @ Pi                                        # channel i and i + D/2 pair up
    c = np.cos(np.outer(np.arange(5), 10000.0 ** (-np.arange(0, D, 2) / D)))
    sn = np.sin(np.outer(np.arange(5), 10000.0 ** (-np.arange(0, D, 2) / D)))
    a, bb = half[..., :D // 2], half[..., D // 2:]
    y_half = np.concatenate([a * c - bb * sn, a * sn + bb * c], axis=-1)
    assert np.allclose(y_half, y @ Pi, rtol=1e-12, atol=1e-12)
    # scores are unchanged when W_q and W_k are both permuted: (xΠ)·(x'Π) = x·x'
    k_, _ = rope_forward(rng.standard_normal((1, 5, D)))
    assert np.allclose((y @ Pi) @ (k_ @ Pi).swapaxes(-1, -2), y @ k_.swapaxes(-1, -2))


def test_25_3_second_block_keys_depend_on_dropped_tokens():
    from tformer.models.tinygpt import TinyGPT

    m = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=16, positions="rope", seed=0)
    m.eval()
    tokens = np.random.default_rng(0).integers(0, 256, (1, 12))
    full, window = tokens, tokens[:, 1:]
    x_full, x_win = m.embed(full), m.embed(window)
    # block 1's input (what its keys are made from) is the same token by token
    assert np.array_equal(x_full[:, 1:], x_win)
    first = m.blocks[0]
    y_full, y_win = first.forward(x_full)[:, 1:], first.forward(x_win)
    # block 1's output, the input of block 2's keys, changed: it attended to token 0
    assert np.abs(y_full - y_win).max() > 1e-4


def test_25_4_decoding_flops_and_bytes_with_grouped_heads():
    t, H, D, C, L = 4096, 64, 128, 8192, 80
    for H_kv in (64, 8):
        flops_attention = 4 * t * H * D                  # q·K and P·V, every query head
        assert flops_attention == 134_217_728
        kv_bytes_read = 2 * t * H_kv * D * 2             # K and V of the layer, 2-byte floats
        assert kv_bytes_read == {64: 134_217_728, 8: 16_777_216}[H_kv]
        assert flops_attention / kv_bytes_read == {64: 1, 8: 8}[H_kv]
    # the K and V projections of the new token shrink too: 2 C · 2 H_kv D multiply-adds
    assert 2 * C * 2 * 64 * D == 268_435_456 and 2 * C * 2 * 8 * D == 33_554_432
    assert 80 * 4 * t * H * D == 10_737_418_240           # over the 80 layers: 10.7 GFLOP
