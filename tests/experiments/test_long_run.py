"""The long run (python -m tformer long-run): the effective-data law, the prediction, a tiny run
killed and resumed bit for bit, the result added beside the prediction, the word share."""
import argparse
import json
import math

import numpy as np
import pytest

from tformer.training.checkpoint import read_checkpoint
from tformer.data import words as W
from tformer.experiments import long_run as LR
from tformer.experiments import scaling_fit as sf
from tformer.experiments import scaling_sweep as S
from tformer.runs.flags import UsageError


def parse(*argv):
    p = argparse.ArgumentParser()
    LR.add_arguments(p)
    return p.parse_args(list(argv))


def test_effective_tokens_is_muennighoffs_eq5_and_its_limits():
    U, R = 1000.0, LR.R_STAR
    D = np.array([10.0, 999.0, 1000.0, 2000.0, 16000.0, 1e9])
    Dx = LR.effective_tokens(D, U)
    assert np.array_equal(Dx[:3], D[:3])                             # one epoch: every token new
    r = D[3:] / U - 1
    np.testing.assert_allclose(Dx[3:], U + U * R * (1 - np.exp(-r / R)), rtol=1e-15)
    assert np.all(np.diff(Dx) > 0) and Dx[-1] <= U * (1 + R)         # grows, but is bounded
    # small R: a repeated token is worth almost a new one (the slope at one epoch is 1)
    eps = 1e-6
    assert abs((LR.effective_tokens(U * (1 + eps), U) - U) / (U * eps) - 1) < 1e-5


def synthetic_sweep(theta, U=2e6, V=8192, noise=0.0, seed=0):
    """A sweep whose losses are the law L(N, D') of ``theta`` (plus noise): the plan's runs."""
    rng = np.random.default_rng(seed)
    runs = S.plan([2.5e12, 6.3e12, 1.6e13], [V], [0], 5)
    for r in runs:
        Dx = LR.effective_tokens(r["tokens"], U)
        r["val_nats_per_char"] = float(sf.predict(theta, r["n_weights"], Dx) * np.exp(noise * rng.normal()))
        r["seconds"] = r["cpu_seconds"] = 1.0
    return dict(runs=runs, corpora={str(V): dict(train_tokens=int(U))})


THETA = np.array([np.log(30.0), np.log(8.0), np.log(0.9), 0.40, 0.20])


def test_prediction_recovers_a_known_law_and_chooses_its_best_shape():
    pred = LR.predict_plan(synthetic_sweep(THETA), 1.6e14, n_boot=8)
    c = pred["fit"]["constants"]
    for k, v in sf.constants(THETA).items():
        assert abs(c[k]["value"] - v) <= 1e-3 * abs(v), (k, c[k]["value"], v)
    rows = LR.candidates(THETA, 1.6e14, 8192, 2e6)
    assert pred["plan"]["shape"] == rows[0]["shape"]
    assert pred["predicted_nats_per_char"] == pytest.approx(rows[0]["predicted"], rel=1e-4)
    lo, hi = pred["predicted_interval"]
    assert lo <= pred["predicted_nats_per_char"] + 1e-6 and hi >= pred["predicted_nats_per_char"] - 1e-6
    p = pred["plan"]
    step = S.flops_per_token(tuple(p["shape"]), 8192, 64) * 12 * 64
    assert abs(p["flops"] - 1.6e14) <= 0.5 * step and p["tokens"] == p["steps"] * 12 * 64
    # the law without the correction counts repeated tokens as new: it predicts a lower loss
    assert pred["without_repetition"]["predicted"] < pred["predicted_nats_per_char"]


def test_prediction_refuses_a_small_budget_and_too_few_runs():
    sweep = synthetic_sweep(THETA)
    with pytest.raises(UsageError, match=r"--budget: expected at least 10× .* got 1e\+14"):
        LR.predict_plan(sweep, 1e14, n_boot=2)
    with pytest.raises(UsageError, match="--sweep: expected at least 5 finished runs"):
        LR.predict_plan(dict(sweep, runs=sweep["runs"][:4]), 1.6e14, n_boot=2)


def test_words_leave_out_speakers_and_count_letter_runs():
    text = "FIRST CITIZEN:\nBefore we proceed any further, hear me speak.\n\nALL:\nSpeak, speak. O'er 'tis\n"
    assert W.words(text) == ["before", "we", "proceed", "any", "further", "hear", "me", "speak",
                             "speak", "speak", "o", "er", "tis"]
    vocab = W.corpus_words([b"Speak hear me O er TIS"])
    assert W.share("Speak, frobnicate!\nKING HENRY:\nhear", vocab) == (2, 3)
    assert W.share(b"ROMEO:\n", vocab) == (0, 0)
    with pytest.raises(TypeError, match="text: expected str or bytes, got int"):
        W.words(3)


def tiny_prediction(tmp_path, steps=12):
    """A prediction file for a tiny plan (2x16, V = 512): what ``--predict`` writes, made small."""
    plan = dict(shape=[2, 16], vocab_size=512, block_size=16, batch_size=4, budget=1.0, seed=0,
                lr=1e-3, steps=steps, tokens=steps * 64, epochs=0.0, flops=1.0, n_weights=1,
                recipe=S.RECIPE, heads=1)
    pred = dict(budget=1.0, plan=plan, predicted_nats_per_char=3.0, predicted_interval=[2.5, 3.5],
                fit={}, without_repetition={}, chinchilla={}, candidates=[], sweep={},
                prediction_provenance={})
    path = tmp_path / "long_run.json"
    path.write_text(json.dumps(pred))
    return path, pred


@pytest.fixture(scope="module")
def small_corpus():
    """The V = 512 corpus, prepared once for the module (the BPE training takes seconds)."""
    from tformer.experiments.scaling_corpus import prepare
    return prepare(512)


def run(tmp_path, monkeypatch, corpus, *extra, stop_at=None, out=None):
    monkeypatch.setattr(LR, "prepare", lambda V: corpus)
    monkeypatch.setattr(LR, "SAMPLE_SEEDS", 2)
    monkeypatch.setattr(LR, "SAMPLE_TOKENS", 12)
    monkeypatch.setattr(LR, "TRAIN_EVAL_WINDOWS", 8)
    if stop_at is not None:
        from tformer.data.tokens import TokenData
        real = TokenData.batch

        def batch(self, i, split="train"):
            if i == stop_at:
                raise KeyboardInterrupt
            return real(self, i, split)
        monkeypatch.setattr(TokenData, "batch", batch)
    args = parse("--out", str(out), "--checkpoint", str(tmp_path / "ck.npz"), "--eval-every", "4",
                 "--checkpoint-every", "4", "--ship", str(tmp_path / "w8.npz"), "--no-progress", *extra)
    return LR.main(args)


def test_a_killed_run_resumes_bit_for_bit_and_adds_its_result_beside_the_prediction(
        tmp_path, monkeypatch, small_corpus):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    out_a, pred = tiny_prediction(a)
    assert run(a, monkeypatch, small_corpus, out=out_a) == 0
    out_b, _ = tiny_prediction(b)
    with pytest.raises(KeyboardInterrupt):
        run(b, monkeypatch, small_corpus, stop_at=9, out=out_b)       # killed during step 10
    meta, _, _ = read_checkpoint(b / "ck.npz")
    assert meta["step"] == 8 and "val_nats_per_char" not in json.loads(out_b.read_text())
    monkeypatch.undo()
    with pytest.raises(UsageError, match="--checkpoint: .* exists; pass --resume"):
        run(b, monkeypatch, small_corpus, out=out_b)
    assert run(b, monkeypatch, small_corpus, "--resume", out=out_b) == 0
    ma, sa, _ = read_checkpoint(a / "ck.npz")
    mb, sb, _ = read_checkpoint(b / "ck.npz")
    assert ma["step"] == mb["step"] == 12 and sa.keys() == sb.keys()
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    ra, rb = json.loads(out_a.read_text()), json.loads(out_b.read_text())
    assert all(ra[k] == pred[k] for k in pred)                      # the prediction, untouched
    assert ra["val_nats_per_char"] == rb["val_nats_per_char"] and math.isfinite(ra["val_nats_per_char"])
    assert [e["step"] for e in rb["evals"]] == [4, 8, 12] and rb["evals"] == ra["evals"]
    assert len(ra["samples"]) == len(LR.TEMPERATURES) and all(isinstance(s, str) for s in ra["samples"])
    assert ra["params"] > 0 and ra["seconds"] > 0 and ra["flops"] == pred["plan"]["flops"]
    for t, s in ra["word_share"].items():
        assert 0 <= s["known"] <= s["total"] and s["share"] == s["known"] / max(s["total"], 1)
    shipped = ra["shipped"]
    assert shipped["bytes"] <= LR.SHIP_BYTES and abs(shipped["val_nats_per_char"] - ra["val_nats_per_char"]) < 0.05
    with pytest.raises(UsageError, match="already holds the run's result"):
        run(a, monkeypatch, small_corpus, out=out_a)


def test_predict_refuses_to_overwrite_and_run_refuses_a_file_without_a_prediction(tmp_path):
    out = tmp_path / "p.json"
    out.write_text("{}")
    sweep = tmp_path / "sweep.json"
    sweep.write_text("{}")
    with pytest.raises(UsageError, match="already holds a prediction"):
        LR.main(parse("--predict", "--out", str(out), "--sweep", str(sweep)))
    with pytest.raises(UsageError, match=r"--out: expected a long-run prediction .* missing"):
        LR.main(parse("--out", str(out), "--checkpoint", str(tmp_path / "c.npz")))
    out.write_text("[1, 2")
    with pytest.raises(UsageError, match="--out: expected .* does not read as JSON"):
        LR.main(parse("--out", str(out), "--checkpoint", str(tmp_path / "c.npz")))
