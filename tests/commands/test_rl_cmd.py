"""``python -m tformer rl``: a smoke run of every part on a tiny stand-in for the long run's model (the
shipped tokenizer, the plays' text cut short, toy judges so that some lines pass and DPO has pairs),
its result file, ``--resume`` repeating a dropped run bit for bit, and bad input refused before any
work; its files declared; the hostile command-line test draws it. The best-of-n estimates are checked
against their definitions."""
import contextlib
import io
import json
import math
import os

import numpy as np
import pytest

import cli_hostile
from tformer.__main__ import main as cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _even(line):
    return len(line) % 2 == 0


def _four(line):
    return len(line) % 4 == 0


@pytest.fixture
def stand_in(monkeypatch):
    """The long run's model replaced by a tiny TinyGPT of its vocabulary, the texts cut short, 40
    training prompts, toy judges (even length; a multiple of four, the strict one)."""
    from tformer.data.bpe import BPETokenizer
    from tformer.experiments import preference as PF
    from tformer.experiments import rl, rl_judged
    from tformer.experiments.long_run import SHIPPED_TOKENIZER
    from tformer.models.tinygpt import TinyGPT
    monkeypatch.chdir(ROOT)                                  # the declared book/data files
    tok = BPETokenizer.load(SHIPPED_TOKENIZER)
    model = TinyGPT(d_model=8, n_heads=2, n_layers=1, max_len=64, vocab_size=tok.vocab_size,
                    seed=0).eval()
    train_text, eval_text = PF.texts()
    monkeypatch.setattr(rl, "load_base", lambda: (model, tok))
    monkeypatch.setattr(PF, "texts", lambda: (train_text[:200_000], eval_text[:8_000]))
    monkeypatch.setattr(PF, "PAIR_PROMPTS", 40)
    monkeypatch.setattr(PF, "scans", _even)                  # DPO's pairs and every lenient verdict
    monkeypatch.setattr(rl, "scans", _even)                  # GRPO's reward
    monkeypatch.setattr(rl_judged, "strict_judge", lambda: _four)
    return rl


def _run(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli(argv)
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def test_a_quick_run_writes_every_part_and_resume_repeats_a_dropped_run(stand_in, tmp_path):
    out = str(tmp_path / "rl.json")
    argv = ["rl", "--quick", "--steps", "4", "--seeds", "1", "2", "--out", out, "--no-progress",
            "--threads", "1"]
    assert _run(argv) == (0, "")
    with open(out) as f:
        result = json.load(f)
    assert result["config"]["eval_steps"] == [2, 4] and result["config"]["quick"]
    assert result["pilot"]["lr"] == 1e-3 and set(result["pilot"]["runs"]) == {"0.001"}
    for method in ("grpo", "dpo-lora", "dpo-full"):
        runs = result["runs"][method]
        assert set(runs) == {"1", "2"}, method
        for r in runs.values():
            assert [p["step"] for p in r["points"]] == [2, 4]
            for p in r["points"]:
                assert 0 <= p["rate_strict"] <= p["rate"] <= 1 and p["kl_per_line"] >= 0
                assert len(p["per_prompt"]["scans"]) == 12
        rows = result["analysis"]["frontiers"][method]
        assert [r["step"] for r in rows] == [0, 2, 4]
        for r in rows:
            rate, lo, hi = r["rate"]
            assert lo <= rate <= hi
    assert len(result["runs"]["grpo"]["1"]["hist"]["reward"]) == 4
    assert result["base"]["kl_per_line"] == 0
    assert set(result["best_of"]["by"]) == {"lenient", "strict"}
    assert set(result["best_of"]["by"]["strict"]) == {"1", "2", "4"}     # 4 lines per prompt
    assert {"dpo-lora", "dpo-full", "best-of-1 (lenient)", "best-of-4 (strict)"} <= \
        set(result["analysis"]["matched_kl"])
    # --resume: a run dropped from the file is run again, the same to the bit; the others kept
    kept = result["runs"]["grpo"].pop("2")
    with open(out, "w") as f:
        json.dump(result, f)
    assert _run(argv + ["--resume", "--parts", "grpo"]) == (0, "")
    with open(out) as f:
        again = json.load(f)
    redone = again["runs"]["grpo"]["2"]
    assert redone["points"][-1]["per_prompt"] == kept["points"][-1]["per_prompt"]
    assert {k: v for k, v in redone["hist"].items() if k != "time"} == \
        {k: v for k, v in kept["hist"].items() if k != "time"}
    assert again["runs"]["dpo-lora"] == result["runs"]["dpo-lora"]
    assert len(again["earlier_sessions"]) == 1


@pytest.mark.parametrize("extra, message", [
    (["--steps", "5"], "--steps: expected at least 10"),
    (["--seeds", "1"], "--seeds: expected at least two different seeds"),
    (["--seeds", "1", "1"], "--seeds: expected at least two different seeds"),
    (["--seeds", "1", "100"], "other than the pilot's 100"),
    (["--parts", "grpo"], "--parts: grpo takes the pilot's learning rate"),
    (["--parts", "dance"], "--parts: invalid choice"),
    (["--steps", "0"], "--steps"),
    (["--resume", "--out", "NOTJSON"], "--out: expected a result of `rl` to --resume"),
    (["--out", "book/data/preference.json"], "--out: expected another file than the Preference "),
])
def test_bad_input_is_a_usage_error_that_writes_nothing(extra, message, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    extra = [str(bad) if a == "NOTJSON" else a for a in extra]
    out = str(tmp_path / "rl.json")
    argv = ["rl", "--out", out, *extra] if "--out" not in extra else ["rl", *extra]
    code, err = _run(argv)
    assert code == 2 and message in err, err
    assert err.strip().splitlines()[-1].startswith("python -m tformer rl: error:")
    assert not os.path.exists(out) and bad.read_text() == "not json"


def test_the_preference_result_must_hold_dpo_s_chosen_rates(tmp_path):
    from tformer.experiments import rl
    good = {"methods": {"dpo-lora": {"lr": 3e-3, "kl_per_line": [14.6, 8.0, 21.2]},
                        "dpo-full": {"lr": 3e-4, "kl_per_line": [13.2, 10.9, 15.6]}}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(good))
    assert rl.dpo_rates(str(path)) == ({"dpo-lora": 3e-3, "dpo-full": 3e-4}, 14.6)
    for bad in ({"methods": {"dpo-lora": {"lr": 3e-3}}}, [1], {"methods": {
            "dpo-lora": {"lr": -1, "kl_per_line": [1]}, "dpo-full": {"lr": 1, "kl_per_line": [1]}}}):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="the Preference chapter's result"):
            rl.dpo_rates(str(path))


def test_the_files_it_reads_and_writes_are_declared():
    from tformer.__main__ import build_parser
    from tformer.experiments import rl
    args = build_parser().parse_args(["rl", "--out", "x.json"])
    declared = {d.path: d.role for d in rl.files(args)}
    assert declared == {"book/data/long_run_w8.npz": "reads", "book/data/long_run_tokenizer.json":
                        "reads", "book/data/long_run.json": "reads",
                        "book/data/preference.json": "reads", "x.json": "writes"}
    args = build_parser().parse_args(["rl", "--out", "x.json", "--resume"])
    assert {d.path: d.role for d in rl.files(args)}["x.json"] == "updates"


def test_the_hostile_command_line_test_draws_it():
    from tformer.__main__ import COMMANDS
    assert COMMANDS["rl"][0] == "tformer.experiments.rl" and "rl" in cli_hostile.DRY
    assert cli_hostile._path_flags("rl") == ["--out"]


def test_best_of_n_rate_is_unbiased_and_its_kl_is_the_binomial_s():
    from tformer.experiments import rl_judged
    from tformer.fast.losses import bernoulli_kl
    m, n = 8, 4
    k = np.arange(m + 1)
    # the unbiased estimate: its mean over k ~ Bin(m, p) is 1 − (1 − p)^n, for any p
    for p in (0.05, 0.3, 0.9):
        pmf = np.array([math.comb(m, j) * p ** j * (1 - p) ** (m - j) for j in k])
        assert pmf @ rl_judged.pass_at(n, k, m) == pytest.approx(1 - (1 - p) ** n, abs=1e-12)
    # per prompt: q = 1 − (1 − p)^n, KL(q ‖ p), and 0 where every or no line scans
    kl = rl_judged.best_of_n_kl(k / m, n)
    assert kl[0] == kl[-1] == 0 and (kl[1:-1] > 0).all()
    assert kl[3] == pytest.approx(float(bernoulli_kl(1 - (5 / 8) ** 4, 3 / 8)), rel=1e-14)
    # the plug-in's bias is the binomial expectation of f(k'/m) minus f(p̂)
    bias = rl_judged.plug_in_bias([0, 3, 8], m, n)
    p = 3 / 8
    pmf = np.array([math.comb(m, j) * p ** j * (1 - p) ** (m - j) for j in k])
    assert bias[0] == bias[2] == 0 and bias[1] == pytest.approx(pmf @ kl - kl[3], rel=1e-12)
    # the strict verdict of a lenient choice: all lenient lines strict -> the rate of a lenient pick
    same = rl_judged.strict_of_lenient([2, 0], [2, 0], [2, 0], 4, 2)
    np.testing.assert_allclose(same, rl_judged.pass_at(2, [2, 0], 4))


def test_a_frontier_is_read_between_its_points_and_never_past_the_last():
    from tformer.experiments import rl_frontier
    assert rl_frontier.read_at([0, 2, 1], [0.2, 0.6, 0.4], 1.5) == pytest.approx(0.5)
    assert math.isnan(rl_frontier.read_at([0, 1, 2], [0.2, 0.4, 0.6], 2.5))
    assert rl_frontier.best_within([0, 3, 1, 2], [0.2, 0.9, 0.5, 0.4], 2.5) == 0.5
