"""The worked solutions of the five systems' chapters (10 to 15), checked.

Every number or formula a solution under an exercise list states is asserted here, with the
tolerance that states the claim: SymPy for a derivation, the kernels and models for a number, and
short training runs (the chapter's own settings, one thread) for what training shows. A trained
float32 result depends on the arithmetic, so it is held to the claim's margin, never to its digits.
Test names are ``test_<chapter>_<exercise>_<claim>``.

Also here: the tables of the single attention layer and of the two-layer transformer quote the
kernels' lines (``test_tables_quote_the_kernels_lines``).
"""
import inspect
import math

import numpy as np
import pytest
import sympy as sp

import tformer.nn.functional as F
from tformer.nn.attention import MultiHeadAttention
from tformer.decoding.beam import MarkovTable, beam_search
from tformer.nn.blocks import ResidualBlock
from tformer.data import copy_max, copy_max_centered
from tformer.data.reconstruction import ReconstructionData, mse
from tformer.data.text import TextData, unigram_cross_entropy
from tformer.decoding.generate import sample_from_logits
from tformer.core.gradcheck import check_kernel
from tformer.nn.layers import Linear, Module, ModuleList
from tformer.models.attention_layer import AttentionLayer
from tformer.models.encoder import Encoder
from tformer.models.tinygpt import TinyGPT
from tformer.models.transformer import Transformer
from tformer.models.two_layer import TwoLayerTransformer
from tformer.training.optim import Adam, AdamW, cosine_with_warmup, noam_lr
from tformer.runs.tinygpt import forward_loss as tinygpt_loss
from tformer.runs.tinygpt import make_evaluate
from tformer.training.train import train


# --------------------------------------------------------------------------------------------
# the copy-max runs of the single attention layer and the two-layer transformer (chapters 10, 11)

D_MODEL, SEQ_LEN, BATCH, STEPS = 16, 8, 32, 2000


def fit_copy_max(model, make_batch, held, steps=STEPS):
    """The chapters' ``fit``: AdamW with ε inside the square root on ½‖Y − Y_true‖²."""
    opt = AdamW(model, lr=3e-3, weight_decay=0.01, eps=1e-8, eps_inside_sqrt=True)
    batch = lambda i: make_batch(i, batch_size=BATCH, seq_len=SEQ_LEN, d_model=D_MODEL, seed=0)
    hist = train(model, opt, batch, copy_max.half_sum_loss, steps,
                 evaluate=lambda m: copy_max.evaluate(m, held), eval_every=steps)
    return hist["eval"][-1][1]


def constant_feature_batch(index, **kw):
    """N(0, 1) inputs with the last feature set to 1, and their copy-max targets."""
    x, _ = copy_max_centered.centered_copy_max_batch(index, **kw)
    x[..., -1] = 1.0
    return x, copy_max.copy_max_targets(x)


@pytest.fixture(scope="module")
def trained_attention_layer():
    held = copy_max.held_out(4, batch_size=64, seq_len=SEQ_LEN, d_model=D_MODEL, seed=0)
    model = AttentionLayer(d_model=D_MODEL, seed=0)
    final = fit_copy_max(model, copy_max.copy_max_batch, held)
    return model, held, final


def test_10_1_a_constant_feature_gives_the_queries_their_common_direction():
    # by hand: M = W_q W_kᵀ = c e_d e_0ᵀ scores every key by its first feature, W_v W_o = I
    d, c = D_MODEL, 1e4
    layer = AttentionLayer(d_model=d, seed=0, dtype=np.float64)
    layer.W_q[...] = 0.0
    layer.W_q[d - 1, 0] = c                      # q_i = c e_0 for every query (x_{i,d-1} = 1)
    layer.W_k[...] = 0.0
    layer.W_k[0, 0] = 1.0                        # k_j = x_{j,0} e_0: S_ij = c x_{j,0} / √d
    layer.W_v[...] = np.eye(d)
    layer.W_o[...] = np.eye(d)
    held = [constant_feature_batch(i, batch_size=64, seq_len=SEQ_LEN, d_model=d, seed=0,
                                   split="test", dtype=np.float64) for i in range(4)]
    assert copy_max.evaluate(layer, held)["accuracy"] == 1.0
    # the symmetry bound no longer applies: -X has the constant feature -1, never drawn
    # trained as in the chapter, the layer goes far past 1/2
    model = AttentionLayer(d_model=d, seed=0)
    held32 = [constant_feature_batch(i, batch_size=64, seq_len=SEQ_LEN, d_model=d, seed=0,
                                     split="test") for i in range(4)]
    assert fit_copy_max(model, constant_feature_batch, held32)["accuracy"] > 0.9


def test_10_2_trained_value_output_product_is_near_the_identity(trained_attention_layer):
    model, _, _ = trained_attention_layer
    P = model.W_v.astype(np.float64) @ model.W_o.astype(np.float64)
    assert np.linalg.norm(P - np.eye(D_MODEL)) / np.linalg.norm(np.eye(D_MODEL)) < 0.05
    # and the loss is zero exactly when A is one-hot on j* and W_v W_o = I: Y_t = x_{j*}
    x, y_true = copy_max.copy_max_batch(0, batch_size=4, seq_len=SEQ_LEN, d_model=D_MODEL)
    A = np.zeros((4, SEQ_LEN, SEQ_LEN))
    A[np.arange(4), :, copy_max.argmax_rows(x)] = 1.0
    assert np.array_equal(A @ x @ np.eye(D_MODEL), y_true)


def test_10_3_argmax_attention_share_is_at_least_the_nearest_row_accuracy(
        trained_attention_layer):
    model, held, final = trained_attention_layer
    xs = np.concatenate([b[0] for b in held])
    y = model.forward(xs)
    j = copy_max.argmax_rows(xs)[:, None]
    arg_ok = model.att.argmax(-1) == j
    near_ok = copy_max.nearest_rows(y, xs) == j
    assert arg_ok.mean() >= near_ok.mean() > 0.93
    assert (near_ok & ~arg_ok).mean() <= 0.002 and (arg_ok & ~near_ok).mean() < 0.02


# --------------------------------------------------------------------------------------------
# chapter 11: the two-layer transformer


class TwoBlocks(Module):
    """Two blocks of the two-layer transformer, each with or without its MLP, any activation."""

    def __init__(self, mlp=(True, True), activation="swish", d_ff=4 * D_MODEL, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.blocks = ModuleList(
            ResidualBlock(D_MODEL, n_heads=1, d_ff=d_ff, activation=activation, bias=False,
                          rng=rng) if m else
            MultiHeadAttention(D_MODEL, n_heads=1, bias=False, rng=rng) for m in mlp)

    def forward(self, x):
        for b in self.blocks:
            x = b(x) if isinstance(b, ResidualBlock) else x + b(x)
        return x

    def backward(self, dy):
        for b in reversed(list(self.blocks)):
            dy = b.backward(dy) if isinstance(b, ResidualBlock) else dy + b.backward(dy)
        return dy


def centered_accuracy(model):
    held = copy_max_centered.held_out(4, batch_size=64, seq_len=SEQ_LEN, d_model=D_MODEL, seed=0)
    return fit_copy_max(model, copy_max_centered.centered_copy_max_batch, held)["accuracy"]


def test_11_1_relu_is_not_odd_and_the_model_learns_the_zero_mean_task():
    p = sp.Symbol("p", positive=True)
    relu = lambda e: sp.Max(0, e)
    for h in (p, -p):                                            # both signs of h
        assert sp.simplify((relu(h) - relu(-h)) / 2 - h / 2) == 0          # odd part h/2
        assert sp.simplify((relu(h) + relu(-h)) / 2 - sp.Abs(h) / 2) == 0  # even part |h|/2
    assert centered_accuracy(TwoBlocks(activation="relu")) > 0.9


def test_11_2_which_mlp_matters():
    first_only = centered_accuracy(TwoBlocks(mlp=(True, False)))
    second_only = centered_accuracy(TwoBlocks(mlp=(False, True)))
    assert first_only > 0.9                       # layer 2's attention sees the even part
    assert 0.5 < second_only < first_only - 0.1   # not odd any more, but layer 2 cannot find j*


@pytest.mark.parametrize("d_ff, low", [(4, 0.85), (16, 0.9), (64, 0.9)])
def test_11_3_even_a_narrow_mlp_breaks_the_symmetry(d_ff, low):
    assert centered_accuracy(TwoLayerTransformer(d_model=D_MODEL, d_ff=d_ff, seed=0)) > low


def test_tables_quote_the_kernels_lines():
    """The tables of 'The single attention layer' and 'The two-layer transformer' quote these
    lines of the kernels (and of ResidualBlock.backward) as the code of each backward line."""
    from tformer.kernels.attention import attention_backward
    from tformer.kernels.linear import linear_backward

    quoted = {
        linear_backward: ["dW = x2.T @ dy2", "dx = dy2 @ W.T"],
        attention_backward: [
            "dv = P.swapaxes(-1, -2) @ dy",
            "dP = dy @ v.swapaxes(-1, -2)",
            "dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))",
            "dq = scale * (dS @ k)",
            "dk = scale * (dS.swapaxes(-1, -2) @ q)",
        ],
        ResidualBlock.backward: ["dz = dy + self.ffn.backward(dy)",
                                 "dz + self.attn.backward(dz)"],
        MultiHeadAttention.backward: ["dx = self.q.backward(dq)"],
    }
    for fn, lines in quoted.items():
        source = inspect.getsource(fn)
        assert all(line in source for line in lines), fn.__qualname__


# --------------------------------------------------------------------------------------------
# chapter 12: the post-LN encoder


def fit_encoder(model, data, loss, epochs, hook=None):
    """Adam at η = 1e-3 over ``epochs`` passes of ``data``, as ``tformer.runs.encoder.run``."""
    if hook is not None:
        backward = model.backward

        def hooked(dy):
            dx = backward(dy)
            hook(model)
            return dx
        model.backward = hooked
    return train(model, Adam(model, lr=1e-3), data.batch, loss, epochs * data.steps_per_epoch)


def reconstruct(model, x):
    return F.mse_loss(model.forward(x), x)


class EncoderWithHead(Module):
    """The headline encoder followed by a linear layer d -> d."""

    def __init__(self):
        super().__init__()
        self.enc = Encoder(d_model=64, n_heads=4, n_layers=2, d_ff=256, seed=0)
        self.head = Linear(64, 64, rng=np.random.default_rng(1))

    def forward(self, x):
        return self.head(self.enc(x))

    def backward(self, dy):
        return self.enc.backward(self.head.backward(dy))


def test_12_1_raw_rows_leave_a_floor_that_a_final_linear_layer_removes():
    data = ReconstructionData()
    raw = np.random.default_rng([0, 3]).standard_normal((65, 64))        # the same draw, raw
    data.table = raw.astype(np.float32)
    data.train, data.test = data.table[data.train_tokens], data.table[data.test_tokens]
    # the floor of a LayerNorm output with γ = 1, β = 0: E[mean²] + E[(std − 1)²] ≈ 1/d + 1/(2d)
    d = sp.Symbol("d", positive=True)
    assert sp.simplify(1 / d + 1 / (2 * d) - sp.Rational(3, 2) / d) == 0
    rows = np.random.default_rng(0).standard_normal((200_000, 64))
    floor = np.mean(rows.mean(1) ** 2 + (rows.std(1) - 1) ** 2)
    assert abs(floor - 1.5 / 64) < 0.0005                                   # 0.0234
    enc = Encoder(d_model=64, n_heads=4, n_layers=2, d_ff=256, seed=0)
    fit_encoder(enc, data, reconstruct, 50)
    plain = mse(enc, data.train)
    assert 0.5 * 1.5 / 64 < plain < 1.5 * 1.5 / 64       # stuck near the floor (learned γ, β)
    head = EncoderWithHead()
    fit_encoder(head, data, reconstruct, 50)
    assert mse(head, data.train) < plain / 5              # the linear layer removes the floor


def test_12_2_sinusoids_make_the_offset_minus_one_a_fixed_linear_map():
    # M = blockdiag(R(ω_i)) maps the code of position t to that of t − 1: PE_t M PE_jᵀ peaks at j = t−1
    from tformer.kernels.positional import sinusoidal_positions
    T, d = 16, 64
    pe = sinusoidal_positions(T, d, dtype=np.float64)                        # (T, d)
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    M = np.zeros((d, d))
    for i, w in enumerate(omega):                   # rows (sin, cos) of pair i, moved back by 1
        c, s = np.cos(w), np.sin(w)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, s], [-s, c]]
    assert np.allclose(pe[1:] @ M, pe[:-1], atol=1e-12)                     # PE_t M = PE_{t−1}
    scores = pe @ M @ pe.T
    assert np.array_equal(scores[1:].argmax(axis=1), np.arange(T - 1))


def test_12_3_key_bias_does_nothing_and_the_value_bias_folds_into_the_output_bias():
    data = ReconstructionData()

    def zero_key_bias(m):
        for b in m.blocks:
            b.attn.k.grads["b"][...] = 0.0

    losses = {}
    for name, hook in (("trained", None), ("frozen", zero_key_bias)):
        enc = Encoder(d_model=64, n_heads=4, n_layers=2, d_ff=256, seed=0)
        losses[name] = np.array(fit_encoder(enc, data, reconstruct, 10, hook=hook)["loss"])
    assert np.max(np.abs(losses["trained"] - losses["frozen"]) / losses["trained"]) < 1e-3
    # b^V: softmax rows sum to 1, so A(V + b^V) W^O = A V W^O + b^V W^O, a constant b^O absorbs
    enc = Encoder(d_model=8, n_heads=2, n_layers=1, d_ff=12, max_len=8, seed=1, dtype=np.float64)
    x = np.random.default_rng(2).standard_normal((2, 5, 8))
    attn = enc.blocks[0].attn
    attn.v.b[...] = np.random.default_rng(3).standard_normal(8)
    before = enc.forward(x)
    attn.o.b[...] += attn.v.b @ attn.o.W
    attn.v.b[...] = 0.0
    assert np.allclose(enc.forward(x), before, rtol=0, atol=1e-12)


def script_dW(x, dy, order="script", divide=True):
    """The published script's dW (reshape in the wrong order, divided by B), or variants."""
    B, T, d_in = x.shape
    if order == "script":
        dW = x.transpose(0, 2, 1).reshape(d_in, B * T) @ dy.reshape(B * T, -1)
    else:
        dW = x.reshape(B * T, d_in).T @ dy.reshape(B * T, -1)
    return dW / B if divide else dW


@pytest.mark.parametrize("order, divide, expected", [("right", True, 2 / 3),
                                                     ("script", False, None)])
def test_12_4_division_by_B_scales_the_gradient_by_one_third(order, divide, expected):
    def backward(dy, cache):
        dx, _, db = F.linear_backward(dy, cache)
        return dx, script_dW(cache.x, dy, order, divide), db

    rng = np.random.default_rng(6)
    W, b = rng.standard_normal((5, 6)), rng.standard_normal(6)
    x3 = rng.standard_normal((3, 4, 5))
    err = check_kernel(F.linear_forward, backward, [x3, W, b], wrt=[1])
    if expected is not None:
        assert abs(err - expected) < 1e-6              # 1 − 1/B for B = 3
        # Adam's step m̂/(√v̂ + ε) does not change when every gradient is divided by B
        g = rng.standard_normal((20, 5))
        steps = []
        for scale in (1.0, 1 / 3):
            m = v = 0.0
            for t, gt in enumerate(g * scale, start=1):
                m, v = 0.9 * m + 0.1 * gt, 0.999 * v + 0.001 * gt * gt
            steps.append((m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8))
        assert np.allclose(steps[0], steps[1], rtol=1e-6)
    else:
        assert err > 0.5                               # the wrong order stays wrong
        # for B = 1 the reshape reads the right entries and there is nothing to divide by
        assert check_kernel(F.linear_forward, backward, [x3[:1], W, b], wrt=[1]) < 1e-7


def test_12_2_a_trained_first_layer_leans_on_the_previous_position():
    data = ReconstructionData()

    def previous(model, x):
        target = np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
        return F.mse_loss(model.forward(x), target)

    enc = Encoder(d_model=64, n_heads=4, n_layers=2, d_ff=256, seed=0)
    fit_encoder(enc, data, previous, 50)
    enc.forward(data.test[:8])
    A = enc.attention_maps()[0]                                  # layer 1: (8, 4, 16, 16)
    share = A[:, :, np.arange(1, 16), np.arange(15)].mean(axis=(0, 2))   # (H,)
    assert share.min() > 2 / 16                                  # every head: > 2× uniform


# --------------------------------------------------------------------------------------------
# chapter 13: the complete Transformer


def test_13_1_final_learning_rates_of_the_two_schedules():
    steps, warmup, peak = 1500, 150, 2e-3                        # run transformer's defaults
    noam = peak * warmup ** 0.5 * noam_lr(steps, 1, warmup)
    cosine = cosine_with_warmup(steps, peak, warmup, steps, 0.05 * peak)
    assert abs(noam - peak * math.sqrt(warmup / steps)) < 1e-15 and abs(noam - 6.32e-4) < 1e-6
    assert abs(cosine - 1e-4) < 1e-15
    assert noam / cosine > 6


def test_13_2_accumulation_needs_the_whole_steps_token_count():
    rng = np.random.default_rng(0)
    PAD = 0
    model = Transformer(vocab_size=9, d_model=8, n_heads=2, n_layers=1, d_ff=12, max_len=10,
                        dropout=0.0, dtype=np.float64)
    tokens = rng.integers(3, 9, (4, 10))
    targets = rng.integers(3, 9, (4, 10))
    for row, n in enumerate((1, 3, 6, 10)):                      # unequal answer lengths
        targets[row, n:] = PAD
    grads = lambda: np.concatenate([g.ravel().copy() for _, _, g in model.named_parameters()])
    model.zero_grad()
    model.backward(F.cross_entropy(model.forward(tokens), targets, ignore_index=PAD)[1])
    whole = grads()
    N = (targets != PAD).sum()
    for weight in ("1/k", "n_j/N"):
        model.zero_grad()
        for j in range(4):                                        # 4 micro-batches of 1
            _, dz = F.cross_entropy(model.forward(tokens[j:j + 1]), targets[j:j + 1],
                                    ignore_index=PAD)
            n_j = (targets[j] != PAD).sum()
            model.backward(dz / 4 if weight == "1/k" else dz * n_j / N)
        if weight == "1/k":
            assert np.abs(grads() - whole).max() > 1e-3 * np.abs(whole).max()
        else:
            assert np.allclose(grads(), whole, rtol=0, atol=1e-12 * np.abs(whole).max())


def test_13_3_length_penalty_that_lets_beam_search_finish_the_longer_answer():
    # 0 start, 1 "a", 2 "b", 3 EOS, 4 "c", 5 "d": a EOS (p 0.5) against b c d EOS (p 0.5 · 0.9³)
    P = np.full((6, 6), 1e-12)
    P[0, 1] = P[0, 2] = 0.5
    P[1, 3] = 1.0
    P[2, 4] = P[4, 5] = P[5, 3] = 0.9
    P[2, 3] = P[4, 3] = P[5, 4] = 0.1
    P[3, 3] = 1.0
    toy = MarkovTable(np.log(P / P.sum(1, keepdims=True)))
    s_short, s_long = math.log(0.5), math.log(0.5 * 0.9 ** 3)
    alpha = sp.Symbol("alpha", positive=True)
    lp = lambda L: ((5 + sp.Integer(L)) / 6) ** alpha
    star = sp.solve(sp.Eq(s_short / lp(2), s_long / lp(4)), alpha)
    a_star = math.log(s_long / s_short) / math.log(9 / 7)
    assert len(star) == 1 and abs(float(star[0]) - a_star) < 1e-9 and abs(a_star - 1.495) < 1e-3
    start = np.array([[0]])
    below = beam_search(toy, start, 2, 4, length_penalty=a_star - 0.05, stop_token=3)
    above = beam_search(toy, start, 2, 4, length_penalty=a_star + 0.05, stop_token=3)
    assert below[0, :3].tolist() == [0, 1, 3]
    assert above[0, :5].tolist() == [0, 2, 4, 5, 3]


# --------------------------------------------------------------------------------------------
# chapter 14: TinyGPT


def test_14_1_tying_the_head_saves_V_times_C():
    untied = TinyGPT(d_model=64, n_layers=2, max_len=16)
    tied = TinyGPT(d_model=64, n_layers=2, max_len=16, tie_embeddings=True)
    assert untied.num_parameters() - tied.num_parameters() == 256 * 64 == 16_384


def test_14_2_a_finite_mask_leaks_only_when_it_is_small():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 1, 2, 12, 8)).astype(np.float32)    # (B, H, T, D)
    v2 = v.copy()
    v2[..., 8:, :] += 1.0                                                    # change the future
    causal = F.causal_mask(12)
    for fill, leaks in ((-1e9, False), (-10.0, True)):
        M = np.where(causal, 0.0, fill).astype(np.float32)                  # additive mask
        y1, _ = F.attention_forward(q, k, v, mask=M)
        y2, _ = F.attention_forward(q, k, v2, mask=M)
        assert np.array_equal(y1[..., :8, :], y2[..., :8, :]) != leaks
    # a masked score gets e^{s − 10 − max}: zero in float32 only below e^{−103.3} ≈ 2^{−149}
    assert np.float32(np.exp(np.float32(-103.0))) > 0 and np.exp(np.float32(-104.0)) == 0
    assert abs(math.exp(-10) - 4.54e-5) < 1e-7


def test_14_3_heads_split_the_work_and_end_close():
    # the scores cost B·H·T·T·D = B·T²·C multiply-adds whatever H is (D = C / H)
    B, T, C = 32, 64, 64
    assert {B * H * T * T * (C // H) for H in (1, 2, 4, 8)} == {B * T * T * C}
    data = TextData.from_stdlib(block_size=64, batch_size=32, seed=0)
    H_val = data.unigram_entropy("val")
    val = {}
    for H in (1, 4):
        model = TinyGPT(d_model=64, n_heads=H, n_layers=2, max_len=64, seed=0)
        opt = AdamW(model, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        hist = train(model, opt, data.batch, tinygpt_loss, 400, clip_norm=1.0,
                     lr_schedule=lambda s: cosine_with_warmup(s, 3e-3, 40, 400, 3e-4),
                     evaluate=make_evaluate(data, 64), eval_every=400)
        val[H] = hist["eval"][-1][1]["val_bpb"]
    assert max(val.values()) < 0.75 * H_val and abs(val[1] - val[4]) < 0.1


def test_14_the_validation_floor_is_the_validation_texts_own_entropy():
    data = TextData.from_stdlib(block_size=64, batch_size=32, seed=0)
    H_val = data.unigram_entropy("val")
    fitted = unigram_cross_entropy(data.train, data.val)
    own = unigram_cross_entropy(data.val, data.val)              # add-one smoothed, so ≥ H_val
    assert H_val < own < fitted and abs(H_val - 4.471) < 5e-4 and abs(fitted - 4.478) < 5e-4
    assert abs(data.unigram_entropy("corpus") - 4.492) < 5e-4


# --------------------------------------------------------------------------------------------
# chapter 15: TinyGPT writes


def test_15_1_learned_positions_move_every_key_rope_keeps_the_scores():
    model = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, seed=0, dtype=np.float64)
    tokens = np.random.default_rng(0).integers(0, 256, (1, 9))
    first, slid = model.embed(tokens[:, :8]), model.embed(tokens[:, 1:9])
    assert not np.allclose(first[:, 1:], slid[:, :7])   # the same bytes, other positions
    # RoPE: q_m · k_n depends on m − n only, so shifting every position keeps every score
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 1, 1, 8, 16))
    s0 = F.rope_forward(q, 0)[0] @ F.rope_forward(k, 0)[0].swapaxes(-1, -2)
    s5 = F.rope_forward(q, 5)[0] @ F.rope_forward(k, 5)[0].swapaxes(-1, -2)
    assert np.allclose(s0, s5, rtol=0, atol=1e-12)


def test_15_2_flop_ratios_of_the_cache():
    def ratio(n, t0=16, C=64, V=256, L=2, tile=64):
        def pairs(T):
            return sum((min(a + tile, T) - a) * min(a + tile, T) for a in range(0, T, tile))
        full = sum(L * (24 * C * C * T + 4 * C * pairs(T)) + 2 * C * V * T
                   for T in range(t0 + 1, t0 + n + 1))
        cached = sum(L * (24 * C * C + 4 * T * C) + 2 * C * V for T in range(t0 + 1, t0 + n + 1))
        return full / cached
    r = {n: round(ratio(n)) for n in (64, 128, 256)}
    assert r == {64: 49, 128: 80, 256: 139}


def min_p_filter(logits, ratio):
    """Keep the tokens whose probability is at least ``ratio`` times the largest; −inf elsewhere."""
    z = logits - logits.max(axis=-1, keepdims=True)              # log(p_v / p_max)
    return np.where(z >= np.log(ratio), logits, -np.inf)


def test_15_3_min_p_sampling_never_leaves_its_set():
    probs = np.array([[0.5, 0.2, 0.15, 0.1, 0.05]])
    kept = np.isfinite(min_p_filter(np.log(probs), 0.3))[0]
    assert kept.tolist() == [True, True, True, False, False]      # p ≥ 0.3 · 0.5 = 0.15
    many = np.repeat(min_p_filter(np.log(probs), 0.3), 20_000, axis=0)
    draws = sample_from_logits(many, np.random.default_rng(0), temperature=1.0)
    assert set(np.unique(draws)) == {0, 1, 2}
    freq = np.bincount(draws, minlength=5)[:3] / draws.size
    assert np.abs(freq - probs[0, :3] / probs[0, :3].sum()).max() < 0.01
