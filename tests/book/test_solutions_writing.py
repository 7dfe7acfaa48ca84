"""The worked solutions of the exercises of the chapters on language models that write
(TinyGPT learns Shakespeare, Byte-pair encoding, Fine-tuning with LoRA): every number and formula
they state, checked.

Each test names its chapter and exercise; the solution's text (a collapsed block under the
exercises) states what is asserted here.
"""
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

from tformer.data import bpe
from tformer.data import bpe_reference as ref
from tformer.data.bpe import BPETokenizer
from tformer.data import shakespeare as corpus
from tformer.data.text import TextData, decode, encode
from tformer.decoding.generate import sample
from tformer.models.tinygpt import TinyGPT

DATA = Path(__file__).resolve().parents[2] / "book" / "data"
SHAKESPEARE = json.loads((DATA / "shakespeare.json").read_text())
SPREAD = SHAKESPEARE["summary"]["val_nats_std"]


@pytest.fixture(scope="module")
def plays_split():
    """The eight plays split as the BPE chapter splits them: (training text, validation text)."""
    data = TextData(corpus.shakespeare_documents(), 64, 12, 0.1)
    return data.train.tobytes().decode("ascii"), data.val.tobytes().decode("ascii")


# --- TinyGPT learns Shakespeare ----------------------------------------------------------------
def test_30_1_uniform_loss_and_the_bytes_that_never_occur():
    assert abs(math.log(65) - 4.174) < 5e-4
    assert abs(math.log(256) - math.log(65) - 1.371) < 5e-4
    text = corpus.shakespeare_text()
    assert 256 - len(set(text)) == 193 == 256 - SHAKESPEARE["corpus"]["distinct_chars"]


def _macs_per_position(n_layers, d_model, block, vocab=256):
    # forward multiply-adds per position: the blocks' weights, attention over T, the LM head
    return 12 * n_layers * d_model**2 + 2 * n_layers * block * d_model + d_model * vocab


def test_30_2_the_command_lines_default_against_the_recipe():
    rec = SHAKESPEARE["recipe"]
    train_bytes = SHAKESPEARE["corpus"]["train_bytes"]
    recipe_chars = rec["steps"] * rec["batch_size"] * rec["block_size"]
    default_chars = 500 * 64 * 64
    assert (recipe_chars, default_chars) == (1_536_000, 2_048_000)
    assert round(recipe_chars / train_bytes, 2) == 1.57
    assert round(default_chars / train_bytes, 2) == 2.09
    recipe = TinyGPT(d_model=128, n_heads=4, n_layers=4, max_len=64, seed=0)
    default = TinyGPT(d_model=128, n_heads=4, n_layers=3, max_len=64, seed=0)
    assert recipe.num_parameters() == 867_328
    assert default.num_parameters() == 669_056
    assert (_macs_per_position(3, 128, 64), _macs_per_position(4, 128, 64)) == (671_744, 884_736)
    work = {
        "recipe": recipe_chars * _macs_per_position(4, 128, 64),
        "default": default_chars * _macs_per_position(3, 128, 64),
    }
    assert abs(work["default"] / work["recipe"] - 1.01) < 0.005   # the same arithmetic
    # the command line's defaults, read from its parser
    from tformer.runs import tinygpt as cmd
    import argparse

    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    a = p.parse_args([])
    assert (a.d_model, a.n_layers, a.max_len, a.batch_size, a.steps, a.lr) == (
        128, 3, 64, 64, 500, 3e-3)


def test_30_4_two_comedies_move_the_unigram_model_by_about_one_seed_spread():
    swapped = tuple(p for p in corpus.PLAYS if p[1] not in ("othello", "the-merchant-of-venice"))
    swapped += (("comedies", "twelfth-night"), ("comedies", "as-you-like-it"))
    assert len(swapped) == 8

    def unigram_on_val(plays):
        data = corpus.shakespeare_data(64, 12, 0.1, seed=0, plays=plays)
        p = np.bincount(data.train, minlength=256) / data.train.size
        q = np.bincount(data.val, minlength=256)
        seen = q > 0
        assert (p[seen] > 0).all()                 # every validation byte occurs in training
        return float(-(q[seen] * np.log(p[seen])).sum() / q.sum())

    before, after = unigram_on_val(corpus.PLAYS), unigram_on_val(swapped)
    assert abs(before - 3.324) < 5e-4 and abs(after - 3.315) < 5e-4
    assert abs((after - before) - (-0.009)) < 5e-4
    assert 0.9 < abs(after - before) / SPREAD < 1.3         # about one spread of the seeds


# --- Byte-pair encoding ------------------------------------------------------------------------
def test_31_1_the_cheapest_uniform_model_is_at_4096(plays_split):
    train, val = plays_split
    r = {}
    for V in (256, 512, 1024, 2048, 4096, 8192):
        tok = BPETokenizer.train(train, V)
        r[V] = len(val) / len(tok.encode(val))
    cost = {V: math.log2(V) / r[V] for V in r}
    assert [round(c, 2) for c in cost.values()] == [8.00, 4.66, 4.17, 3.93, 3.81, 3.84]
    assert min(cost, key=cost.get) == 4096
    assert r[8192] / r[4096] < 13 / 12                          # too little for one more bit
    assert all(r[2 * V] / r[V] > 1 for V in (256, 512, 1024, 2048, 4096))


@pytest.mark.parametrize("ell", range(1, 10))
def test_31_2_a_run_of_one_byte(ell):
    pairs, _ = bpe.count_pairs([[97] * ell], [1])
    assert pairs.get((97, 97), 0) == ell - 1
    left = bpe.merge_word([97] * ell, (97, 97), 256)
    assert len(left) == math.ceil(ell / 2) == ell - ell // 2


def test_31_4_bytes_numbered_down(plays_split):
    train, _ = plays_split
    up = ref.tformer_merges(train, 2048)
    down = ref.tformer_merges(train, 2048, order=range(255, -1, -1))
    i = ref.first_difference(up, down)            # 0-based: the first 145 agree, the 146th not
    assert i == 145 and up[:i] == down[:i]
    assert (up[i], down[i]) == ((b"i", b"f"), (b"i", b"l"))
    assert ref.pair_count(train, up[:i], up[i]) == ref.pair_count(train, up[:i], down[i]) == 695
    assert set(up) != set(down)


# --- Fine-tuning with LoRA ---------------------------------------------------------------------
def _lora_layer_gradients():
    N, C_in, C_out, r = 2, 3, 2, 2

    def m(name, rows, cols):
        return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}{i}{j}", real=True))

    X, W, G = m("x", N, C_in), m("w", C_in, C_out), m("g", N, C_out)
    A, B = m("a", C_in, r), m("b", r, C_out)
    s = sp.Symbol("s", positive=True)
    L = sum(G.multiply_elementwise(X * (W + s * A * B)))
    dA = A.applyfunc(lambda v: sp.diff(L, v))
    dB = B.applyfunc(lambda v: sp.diff(L, v))
    return A, B, dA, dB, X, W, s


def test_32_1_either_zero_factor_starts_at_the_base_and_the_other_moves_first():
    A, B, dA, dB, X, W, s = _lora_layer_gradients()
    zero_A = {a: 0 for a in A}
    zero_B = {b: 0 for b in B}
    assert (s * A * B).subs(zero_A) == sp.zeros(*(A * B).shape)
    assert dB.subs(zero_A) == sp.zeros(*B.shape) and dA.subs(zero_A) != sp.zeros(*A.shape)
    assert dA.subs(zero_B) == sp.zeros(*A.shape) and dB.subs(zero_B) != sp.zeros(*B.shape)


def test_32_2_break_even_rank_of_the_fused_qkv():
    n, ci, co, rk = sp.symbols("N C_in C_out r", positive=True)
    saved = n * (ci * co - 3 * rk * (ci + co))
    r_even = sp.solve(sp.Eq(saved, 0), rk)[0]
    C = sp.Symbol("C", positive=True)
    assert sp.simplify(r_even.subs({ci: C, co: 3 * C}) - C / 4) == 0
    assert r_even.subs({ci: 128, co: 384}) == 32


def test_32_2_break_even_rank_of_a_whole_step_with_adapters_on_attention():
    C, V, nL, N, T, r = sp.symbols("C V n_L N T r", positive=True)
    P = nL * 12 * C**2 + C * V                      # Σ C_in C_out: qkv, o, fc1, fc2; the head
    S = nL * (4 * C + 2 * C)                        # Σ (C_in + C_out) of qkv and o
    attention = 6 * nL * N * T * C
    full, lora = 3 * N * P + attention, 2 * N * P + attention + 3 * N * r * S
    r_whole = sp.solve(sp.Eq(full, lora), r)[0]
    assert sp.simplify(r_whole - (2 * C / 3 + V / (18 * nL))) == 0
    assert r_whole.subs({C: 128, V: 256, nL: 3}) == sp.Rational(2432, 27)
    assert r_whole.subs({C: 64, V: 256, nL: 2}) == sp.Rational(448, 9)     # the chapter's ≈ 50


def test_31_3_one_chunk_per_line(plays_split):
    train, val = plays_split
    lines = BPETokenizer.train(train, 2048, pattern=r"[^\n]*\n?")
    words = BPETokenizer.train(train, 2048)
    first = [t.decode() for t in lines.tokens[256:276]]
    assert first[:6] == ["e ", "th", "t ", "s ", ", ", "d "]
    assert {":\n", ".\n"} <= set(first)
    assert {b"and ", b"the ", b"to "} <= set(lines.tokens)
    new = [t for t in lines.tokens[256:] if t not in set(words.tokens)]
    assert len(new) == 1384
    r_lines = len(val) / len(lines.encode(val))
    r_words = len(val) / len(words.encode(val))
    assert (round(r_lines, 2), round(r_words, 2)) == (3.00, 2.80)
    assert round(r_lines / r_words - 1, 2) == 0.07


def test_32_3_the_mlp_and_the_lm_head_share_of_the_adapters_gain():
    from tformer.experiments import lora_train

    base, _ = lora_train.pretrain(200)
    state, verse = base.state_dict(), lora_train.verse_data(1)
    lr = 0.03                                       # the exercise's rate
    bpb, n = {}, {}
    for name, targets in (("attn", "attn"), ("attn+mlp", ["attn", "mlp"]), ("all", "all")):
        method = {"kind": "lora", "r": 4, "targets": targets}
        model, params, _ = lora_train.finetune(state, method, 1, 100, lr, 0.0)
        bpb[name], n[name] = lora_train.val_bpb(model, verse), params.num_trainable()
    assert n == {"attn": 3072, "attn+mlp": 8192, "all": 9472}
    assert n["attn+mlp"] - n["attn"] == 4 * 2 * 2 * (64 + 256)
    assert n["all"] - n["attn+mlp"] == 4 * (64 + 256)
    assert abs(lora_train.val_bpb(base, verse) - 4.43) < 0.03
    for name, want in (("attn", 3.83), ("attn+mlp", 3.67), ("all", 3.47)):
        assert abs(bpb[name] - want) < 0.05, (name, bpb[name])
    gain = bpb["attn"] - bpb["all"]
    mlp, head = bpb["attn"] - bpb["attn+mlp"], bpb["attn+mlp"] - bpb["all"]
    assert abs(gain - 0.36) < 0.05 and abs(mlp - 0.15) < 0.05 and abs(head - 0.21) < 0.05
    assert abs(mlp / gain - 0.4) < 0.05                              # about two fifths
    per_number = (head / 1280) / (mlp / 5120)
    assert abs(per_number - 5) < 1                                   # about five times


def test_30_3_what_top_k_and_top_p_cut_from_the_300_step_model():
    from tformer.experiments import shakespeare as run
    from tformer.decoding.generate import top_k_filter, top_p_filter

    model, data, _ = run.train_tformer(0, steps=300, progress_bar=False)
    x, y = run.eval_windows(data)["val"]
    assert x.shape == (200, 64)
    z = model.forward(x).astype(np.float64)                      # (200, 64, 256)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    found = {}
    for name, kept in (("k", np.isfinite(top_k_filter(z, 10))),
                       ("p", np.isfinite(top_p_filter(z, 0.9)))):
        found[name] = {
            "cut": float((p * ~kept).sum(axis=-1).mean()),
            "size": kept.sum(axis=-1),
            "miss": float(1 - np.take_along_axis(kept, y[..., None], axis=-1).mean()),
        }
    k, nucleus = found["k"], found["p"]
    assert (k["size"] == 10).all()
    assert abs(k["cut"] - 0.17) < 0.02 and abs(k["miss"] - 0.16) < 0.02
    assert nucleus["cut"] <= 0.1 + 1e-12 and abs(nucleus["miss"] - 0.07) < 0.02
    assert abs(nucleus["size"].mean() - 13) < 1.5
    assert nucleus["size"].min() == 1 and nucleus["size"].max() > 25
    assert k["miss"] > 1.5 * nucleus["miss"]                    # one in six against one in 14
