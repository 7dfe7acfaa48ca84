"""The pieces of ``python -m tformer decoding`` on tiny models: a draft trained, shipped in int8 and
read back; α as the overlap Σ min(p, q) against its definitions; the tokens per round and the
paper's speed-up against their sums and limits; distinct-n and the model's log-likelihood against
hand computations; the timing harness's accounting of rounds and tokens."""
import argparse

import numpy as np
import pytest
import sympy as sp

from tformer.data.bpe import BPETokenizer
from tformer.data.tokens import TokenData
from tformer.experiments import decoding as D
from tformer.experiments.scaling_corpus import Corpus
from tformer.models.tinygpt import TinyGPT
from tformer.decoding.samplers import probabilities
from tformer.decoding.quantize import quantize_model

TEXT = ("FIRST CITIZEN:\nBefore we proceed any further, hear me speak.\n\nALL:\nSpeak, speak.\n\n"
        "FIRST CITIZEN:\nYou are all resolved rather to die than to famish?\n\n") * 12


def tiny_pair(V=7, max_len=12):
    cfg = dict(d_model=8, n_heads=2, n_layers=1, vocab_size=V, max_len=max_len)
    return TinyGPT(seed=1, **cfg).eval(), TinyGPT(seed=2, **cfg).eval()


def test_alpha_is_the_overlap_one_minus_total_variation_and_argmax_agreement_at_zero():
    target, draft = tiny_pair()
    tokens = np.random.default_rng(0).integers(0, 7, (3, 10))
    a = D.overlap(target, draft, tokens, 4, dict(temperature=1.0))
    assert a.shape == (3, 6)                                 # predictions of positions 4 … 9
    V = 7
    p = probabilities(target.forward(tokens[:, :-1])[:, 3:].reshape(-1, V))
    q = probabilities(draft.forward(tokens[:, :-1])[:, 3:].reshape(-1, V))
    tv = 0.5 * np.abs(p - q).sum(axis=-1)
    np.testing.assert_allclose(a.ravel(), 1 - tv, atol=1e-12)
    # the chance min(1, p/q) of keeping d ~ q, averaged over q, is the same number
    keep = (q * np.minimum(1, p / q)).sum(axis=-1)
    np.testing.assert_allclose(a.ravel(), keep, atol=1e-12)
    g = D.overlap(target, draft, tokens, 4, dict(temperature=0.0))
    agree = p.argmax(-1) == q.argmax(-1)
    assert np.array_equal(g.ravel(), agree.astype(float))
    assert D.overlap(target, target, tokens, 4, dict(temperature=0.7)) == pytest.approx(1.0, abs=1e-12)


def test_tokens_per_round_and_the_predicted_speedup():
    r, k = sp.symbols("r k", positive=True)
    a, i = 1 / (1 + r), sp.Symbol("i", integer=True)                # 0 < α < 1
    # a round writes a + 1 tokens, P(a = i) = α^i (1 − α) for i < k and α^k for i = k
    E = sp.Sum((i + 1) * a**i * (1 - a), (i, 0, k - 1)).doit() + (k + 1) * a**k
    assert sp.simplify(E - (1 - a**(k + 1)) / (1 - a)) == 0
    for alpha in (0.0, 0.3, 0.8):
        for kk in (1, 4):
            assert D.tokens_per_round(alpha, kk) == pytest.approx((1 - alpha**(kk + 1)) / (1 - alpha))
    assert D.tokens_per_round(1.0, 5) == 6
    assert D.predicted_speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)     # nothing accepted
    assert D.predicted_speedup(1.0, 3, 0.0) == 4                           # free, perfect draft
    assert D.predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))


def test_distinct_n_and_the_log_likelihood():
    assert D.distinct("a b a b a".split(), 1) == 2 / 5
    assert D.distinct("a b a b a".split(), 2) == 2 / 4        # ab, ba, ab, ba
    assert D.distinct("a b c".split(), 3) == 1.0 and np.isnan(D.distinct(["a"], 2))
    model, _ = tiny_pair()
    tokens = np.random.default_rng(1).integers(0, 7, (2, 9))
    ll = D.log_likelihood(model, tokens, 3)
    z = model.forward(tokens[:, :-1]).astype(np.float64)
    want = [[z[b, t - 1, tokens[b, t]] - np.log(np.exp(z[b, t - 1]).sum()) for t in range(3, 9)]
            for b in range(2)]
    np.testing.assert_allclose(ll, want, atol=1e-6)


def test_the_timing_harness_counts_every_round_and_token():
    target, draft = tiny_pair(max_len=16)
    prompts = [np.array([[1, 2, 3]]), np.array([[4, 5, 6]])]
    modes = {"sample": dict(temperature=1.0), "greedy": dict(temperature=0.0)}
    times, stats = D.time_decoding(target, {"d": draft}, prompts, 10, modes, (1, 3), rounds=2)
    assert set(times) == {(m, *rest) for m in modes for rest in (("target",), ("d",), ("d", 1), ("d", 3))}
    assert all(len(v) == 2 for v in times.values())
    alphas = {m: {"d": 0.5} for m in modes}
    s = D.speed_summary(times, stats, modes, ["d"], (1, 3), alphas, 10 * len(prompts))
    for mode in modes:
        for row in s[mode]["rows"]:
            st = stats[(mode, "d", row["k"])]
            # every round writes its accepted drafts and one token: 10 new tokens per prompt
            assert sum(sum(x.accepted) + len(x.proposed) for x in st) == 10 * len(prompts)
            assert row["accepted"] <= row["tested"] <= row["k"] * row["rounds"]
            assert row["predicted"] == pytest.approx(D.predicted_speedup(0.5, row["k"], row["c"]))
            assert row["speedup"] == pytest.approx(s[mode]["target_seconds_per_token"]
                                                   / row["seconds_per_token"])
    passes = D.pass_seconds(target, prompts[0], [1, 2, 4], dict(temperature=1.0), 3)
    assert set(passes) == {"1", "2", "4"} and all(t > 0 for t in passes.values())


def tiny_corpus(T=16):
    tok = BPETokenizer.train(TEXT, 270)
    ids = tok.encode(TEXT).astype(np.int32)
    cut = int(0.8 * ids.size)
    data = TokenData(ids[:cut], ids[cut:], [len(t) for t in tok.tokens], T, 4)
    return Corpus(data, ids[cut:], tok, {})


def test_a_draft_is_trained_shipped_in_int8_and_read_back(tmp_path):
    corpus = tiny_corpus()
    run = dict(shape=[1, 16], vocab_size=270, block_size=16, batch_size=4, budget=1.0, seed=0,
               lr=1e-3, steps=4)
    model, rec = D.train_draft(run, corpus)
    path = str(tmp_path / "draft.npz")
    rec = D.ship_draft(model, rec, corpus, path)
    assert rec["bytes"] > 0 and np.isfinite(rec["val_nats_per_char"])
    back, run_back = D.load_draft(path, 270, 16)
    assert run_back["steps"] == 4 and run_back["tokenizer"]["fingerprint"] == corpus.tokenizer.fingerprint()
    x = np.arange(10)[None] % 270
    q = quantize_model(model, "w8")
    np.testing.assert_array_equal(back.forward(x), q.forward(x))


def test_a_draft_run_is_planned_as_the_sweep_plans_one():
    from tformer.experiments import scaling_sweep as S
    run = D.draft_run((2, 32), 6.3e12, 8192)
    planned = [r for r in S.plan([6.3e12], [8192], [0], 5) if r["shape"] == [2, 32]]
    assert planned and run["key"] == planned[0]["key"] and run["steps"] == planned[0]["steps"]


def test_the_flags():
    p = argparse.ArgumentParser()
    D.add_arguments(p)
    args = p.parse_args([])
    assert args.modes == ["sample", "greedy"] and args.target is None
    with pytest.raises(SystemExit):
        p.parse_args(["--modes", "beam"])


def test_the_float32_copy_of_an_int8_model_has_its_weights_exactly():
    model, _ = tiny_pair(V=11)
    q = quantize_model(model, "w8")
    f = D.dequantized(q)
    assert getattr(f, "quantization", None) is None
    fp = {n: p for n, p, _ in f.named_parameters()}
    for n, p, _ in q.named_parameters():                       # biases and norms: as they were
        assert np.array_equal(fp[n], p)
    weights = {"wte": q.wte, "lm_head": q.lm_head, "blocks.0.attn.qkv": q.blocks[0].attn.qkv,
               "blocks.0.ffn.fc2": q.blocks[0].ffn.fc2}
    for path, layer in weights.items():                        # Q ⊙ s, bit for bit
        assert np.array_equal(fp[path + ".W"], layer.W)
    x = np.random.default_rng(2).integers(0, 11, (2, 12))
    # the same weights; only the order of (x Q) s against x (Q s) rounds differently
    np.testing.assert_allclose(f.forward(x), q.forward(x), rtol=1e-3, atol=1e-3)
