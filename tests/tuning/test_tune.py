"""Preference tuning (``tformer.tuning.tune``) and its rows (``tformer.tuning.pairs``): the padded rows score
each response as it scores alone; a DPO step's parameter gradient is the finite differences of the
DPO loss through the whole model (float64), with every weight and with LoRA; LoRA's step moves the
adapters alone; the step is the same on 1, 2 and 3 threads; SFT is cross-entropy on the chosen
tokens alone; pairs and line cuts follow their rules."""
import copy
import math

import numpy as np
import pytest

from tformer.core import parallel
from tformer.tuning import pairs as PR
from tformer.tuning.dpo import dpo_loss, sequence_logp
from tformer.core.gradcheck import numerical_grad
from tformer.kernels.losses import log_softmax
from tformer.nn.lora import Adapters, apply_lora
from tformer.training import batch_threads
from tformer.models.tinygpt import TinyGPT
from tformer.tuning.tune import Pairs, dpo_step_loss, margins, objective, order, sft_step_loss, tune

V = 11


def _model(dtype=np.float64, seed=0):
    return TinyGPT(d_model=8, n_heads=2, n_layers=2, max_len=16, vocab_size=V, dtype=dtype,
                   seed=seed).eval()


def _pairs(n=6, seed=0, ragged=True):
    rng = np.random.default_rng(seed)
    P, R = 5, 6
    prompt = rng.integers(0, V, (n, P))
    p_len = rng.integers(2, P + 1, n) if ragged else None
    chosen, rejected = rng.integers(0, V, (n, R)), rng.integers(0, V, (n, R))
    return Pairs(prompt, chosen, rng.integers(1, R + 1, n), rejected, rng.integers(1, R + 1, n),
                 p_len)


def test_sequences_place_prompt_then_response_and_mask_the_response_targets():
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    resp = np.array([[7, 8, 9], [10, 1, 2]])
    x, t, m = PR.sequences(prompt, resp, np.array([2, 3]), prompt_lengths=np.array([3, 1]))
    assert x.tolist() == [[1, 2, 3, 7], [4, 10, 1, 2]]
    assert t.tolist() == [[2, 3, 7, 8], [10, 1, 2, 0]]
    assert m.tolist() == [[False, False, True, True], [True, True, True, False]]


def test_padded_rows_score_each_response_as_it_scores_alone():
    model, pairs = _model(), _pairs()
    x, t, m = pairs.batch(np.arange(len(pairs)))
    batched = sequence_logp(model.forward(x), t, m)
    for i in range(len(pairs)):
        for resp, k, j in ((pairs.chosen, pairs.chosen_len, i), (pairs.rejected, pairs.rejected_len,
                                                                 i + len(pairs))):
            seq = np.concatenate([pairs.prompt[i, :pairs.prompt_len[i]], resp[i, :k[i]]])[None]
            lp = log_softmax(model.forward(seq[:, :-1]))[0]
            alone = lp[np.arange(pairs.prompt_len[i] - 1, seq.shape[1] - 1), resp[i, :k[i]]].sum()
            assert abs(batched[j] - alone) < 1e-12


def _grads(model, params, forward_loss, idx):
    params.zero_grad()
    _, dout = forward_loss(model, idx)
    model.backward(dout)
    return {n: g.copy() for n, _, g in params.named_parameters()}


@pytest.mark.parametrize("lora", [False, True])
def test_a_dpo_step_s_gradient_is_the_finite_differences_of_the_dpo_loss(lora):
    ref = _model()
    pairs = _pairs().reference(ref)
    model = copy.deepcopy(ref)
    params = model
    if lora:
        apply_lora(model, 2, None, "all", seed=3)
        params = Adapters(model)
        for _, p, _ in params.named_parameters():       # B = 0 at the start: move off it
            p += np.random.default_rng(4).standard_normal(p.shape) * 0.1
    else:
        for _, p, _ in model.named_parameters():          # the policy away from the reference
            p += np.random.default_rng(4).standard_normal(p.shape) * 0.05
    idx = np.array([0, 2, 3, 5])
    step = dpo_step_loss(pairs, 0.3)
    analytic = _grads(model, params, step, idx)
    rng = np.random.default_rng(5)
    for name, p, _ in params.named_parameters():
        num, flat = numerical_grad(lambda: step(model, idx)[0], p, 1e-6, rng, 6)
        assert np.allclose(analytic[name].reshape(-1)[flat], num, atol=1e-8, rtol=1e-5), name


def test_dpo_with_lora_moves_the_adapters_alone():
    ref = _model(np.float32)
    pairs = _pairs(n=12).reference(ref)
    tuned, hist = tune(ref, pairs, "dpo", 1e-2, 12, seed=1, lora=dict(r=2, targets="all"),
                       batch_pairs=4)
    assert abs(hist["loss"][0] - math.log(2)) < 1e-6                 # π = π_ref at the start
    before = dict((n, p) for n, p, _ in ref.named_parameters())
    for name, p, _ in tuned.named_parameters():
        if name.endswith((".A", ".B")):
            continue
        assert np.array_equal(p, before[name.replace(".base.", ".")]), name
    assert objective(tuned, pairs, "dpo", 0.1) < math.log(2) - 0.01
    assert objective(ref, pairs, "dpo", 0.1) == pytest.approx(math.log(2), abs=1e-6)
    assert np.abs(margins(ref, pairs)).max() < 1e-5 and (margins(tuned, pairs) > 0).mean() > 0.5


@pytest.mark.parametrize("lora", [None, dict(r=2, targets="attn")])
def test_a_dpo_step_is_the_same_on_one_two_and_three_threads(lora, monkeypatch):
    # the batch of 2B rows is cut across the threads even at this size: a part may hold chosen
    # rows and rejected rows of different pairs, and the loss still sees the whole batch
    monkeypatch.setattr(batch_threads, "MIN_PART_MACS", 0)
    cuts = []
    split = batch_threads.Replicas.split
    monkeypatch.setattr(batch_threads.Replicas, "split",
                        lambda self, *a: cuts.append(split(self, *a)) or cuts[-1])
    ref = _model(np.float32)
    pairs = _pairs(n=12).reference(ref)
    out = {}
    before = parallel.get_num_threads()
    try:
        for n in (1, 2, 3):
            parallel.set_num_threads(n)
            tuned, _ = tune(ref, pairs, "dpo", 3e-3, 3, seed=1, lora=lora, batch_pairs=6)
            out[n] = {k: v.copy() for k, v, _ in tuned.named_parameters()}
    finally:
        parallel.set_num_threads(before)
    assert [len(c) for c in cuts if c is not None] == [2] * 3 + [3] * 3   # every step was cut
    for n in (2, 3):
        for k in out[1]:
            assert np.allclose(out[n][k], out[1][k], atol=2e-6, rtol=1e-5), (n, k)


def test_sft_is_cross_entropy_of_the_chosen_tokens_alone():
    model, pairs = _model(), _pairs()
    idx = np.arange(len(pairs))
    loss, _ = sft_step_loss(pairs)(model, idx)
    x, t, m = pairs.batch(idx)
    lp = sequence_logp(model.forward(x), t, m)[:len(pairs)]
    assert abs(loss - (-lp.sum() / pairs.chosen_len.sum())) < 1e-12


def test_the_dpo_loss_of_a_step_is_dpo_loss_of_its_rows():
    ref = _model()
    pairs = _pairs().reference(ref)
    model = _model(seed=1)
    idx = np.array([1, 4])
    loss, dout = dpo_step_loss(pairs, 0.5)(model, idx)
    x, t, m = pairs.batch(idx)
    z = model.forward(x)
    want, (dw, dl) = dpo_loss(z[:2], t[:2], m[:2], z[2:], t[2:], m[2:], pairs.ref_w[idx],
                              pairs.ref_l[idx], 0.5)
    assert loss == want and np.array_equal(dout, np.concatenate([dw, dl]))


def test_order_is_epochs_of_a_seeded_permutation():
    o = order(5, 4, 3, seed=2)
    assert o.shape == (4, 3)
    flat = o.reshape(-1)
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))
    assert np.array_equal(o, order(5, 4, 3, seed=2)) and not np.array_equal(o, order(5, 4, 3, 3))


def test_lines_are_cut_after_their_first_line_break_token():
    breaks = np.zeros(6, bool)
    breaks[[2, 5]] = True
    gen = np.array([[0, 1, 2, 3], [5, 0, 0, 0], [0, 1, 3, 4]])
    assert PR.cut_responses(gen, breaks).tolist() == [3, 1, 4]


def test_pairs_join_each_yes_to_a_no_of_the_same_prompt():
    judged = np.array([[True, False, True, False, False], [True, True, True, True, True],
                       [False, False, True, False, False]])
    assert PR.make_pairs(judged) == [(0, 0, 1), (0, 2, 3), (2, 2, 0)]


def test_prompts_end_after_a_line_inside_a_speech():
    text = ("A:\nOne line of a speech\nand its next line.\n\nB:\nAnother\nand another\n"
            "and the last.\n")
    ends = PR.prompt_ends(text)
    assert [text[:e].rsplit("\n", 2)[-2] for e in ends] == [
        "One line of a speech", "Another", "and another"]
