"""A command's bad input is its usage error: the command, the flag, what was expected and what was
given, exit status 2, never a traceback. Also ``--resume`` against another ``--steps``."""
import argparse

import pytest

from tformer.__main__ import main as cli
from tformer.runs import fits

TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--max-len", "16",
        "--batch-size", "2", "--eval-windows", "2", "--eval-every", "0", "--sample-tokens", "2",
        "--temperatures", "1", "--no-progress", "--warmup", "1"]


def _usage_error(argv, capsys, command, *parts, started=False):
    with pytest.raises(SystemExit) as e:
        cli(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2, err
    assert started or out == ""                                      # nothing ran
    assert "Traceback" not in err
    assert f"python -m tformer {command}: error: " in err, err
    for part in parts:
        assert part in err, (part, err)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("def add(a, b):\n    return a + b\n\n" * 40)
    return path


def test_run_tinygpt_text_missing(capsys):
    _usage_error(["run", "tinygpt", "--text", "/nonexistent"], capsys, "run tinygpt",
                 "--text: expected a readable file", "'/nonexistent'", "no such file")


@pytest.mark.parametrize("content", [b"", b"ab"])
def test_run_tinygpt_text_empty_or_two_bytes(content, tmp_path, capsys):
    path = tmp_path / "short.txt"
    path.write_bytes(content)
    _usage_error(["run", "tinygpt", "--text", str(path)], capsys, "run tinygpt",
                 "--text: expected a file of at least 646 bytes", "--max-len + 2 = 66",
                 f"of {len(content)} bytes")


def test_the_least_text_file_that_the_message_names_is_enough(tmp_path):
    from tformer.runs.flags import text_file
    for least, val_fraction in ((646, 0.1), (None, 0.37)):
        path = tmp_path / "t.txt"
        path.write_bytes(b"")
        with pytest.raises(ValueError) as e:
            text_file(str(path), 64, val_fraction)
        least = int(str(e.value).split("at least ")[1].split(" bytes")[0].replace(",", ""))
        path.write_bytes(b"x" * least)
        text_file(str(path), 64, val_fraction)                       # enough: no error
        path.write_bytes(b"x" * (least - 1))
        with pytest.raises(ValueError, match="--text: expected a file of at least"):
            text_file(str(path), 64, val_fraction)


def test_generate_checkpoint_missing(tmp_path, capsys):
    missing = str(tmp_path / "none.npz")
    _usage_error(["generate", "--checkpoint", missing], capsys, "generate",
                 "--checkpoint: expected a checkpoint saved by", repr(missing), "no checkpoint")


def test_generate_checkpoint_that_is_not_one(tmp_path, capsys):
    path = tmp_path / "notes.npz"
    path.write_text("not a checkpoint")
    _usage_error(["generate", "--checkpoint", str(path)], capsys, "generate",
                 "--checkpoint: expected a checkpoint saved by", "not a zip (.npz) archive")


def test_generate_empty_prompt(capsys):
    _usage_error(["generate", "--prompt", ""], capsys, "generate",
                 "--prompt: expected at least one character, got ''")


def test_a_run_that_cannot_fit_in_memory_is_refused_before_it_starts(capsys):
    _usage_error(["run", "tinygpt", "--max-len", "100000", "--d-model", "8", "--n-heads",
                        "1", "--n-layers", "1"], capsys, "run tinygpt",
                       "--max-len, --batch-size: expected a run whose predicted peak", "TiB",
                       "--attention flash")


def _args(**change):
    p = argparse.ArgumentParser()
    from tformer.runs import tinygpt
    tinygpt.add_arguments(p)
    args = p.parse_args([])
    vars(args).update(change)
    return args


def test_fits_names_each_flag_that_would_make_it_fit():
    GiB = 2 ** 30
    fits.check_fits(_args(), available=GiB)                     # the default run: well inside
    assert fits.run_bytes(_args()) < 0.5 * GiB
    big = _args(max_len=8192, d_model=64, n_layers=4)
    need = fits.run_bytes(big)
    flash = fits.run_bytes(big, attention="flash")
    with pytest.raises(ValueError) as e:
        fits.check_fits(big, available=(need + flash) // 2)
    msg = str(e.value)
    assert "--attention flash" in msg and "--batch-size" in msg
    B = int(msg.split("--batch-size ")[1].split()[0])
    assert 1 <= B < 64 and fits.run_bytes(big, batch_size=B) <= (need + flash) // 2
    assert fits.run_bytes(big, batch_size=B + 1) > (need + flash) // 2
    with pytest.raises(ValueError, match="not even --batch-size 1"):
        fits.check_fits(big, available=1)


def test_resume_with_other_steps_says_what_happens_to_the_schedule(corpus, tmp_path, capsys):
    ck = str(tmp_path / "ck.npz")
    base = ["run", "tinygpt", "--text", str(corpus), *TINY, "--checkpoint", ck]
    assert cli(base + ["--steps", "3"]) == 0
    capsys.readouterr()
    assert cli(base + ["--steps", "5", "--resume"]) == 0
    out = capsys.readouterr().out
    assert ("--resume: the run was started with --steps 3: steps 4..5 follow the learning-rate "
            "schedule of a 5-step run") in out
    assert cli(base + ["--steps", "5", "--resume"]) == 0                 # the same --steps: silent
    assert "--resume: the run was started" not in capsys.readouterr().out
    _usage_error(base + ["--steps", "2", "--resume"], capsys, "run tinygpt",
                 "--steps: expected at least the step of the checkpoint", "5, got 2", started=True)


def test_resume_transformer_with_other_steps(tmp_path, capsys):
    ck = str(tmp_path / "t.npz")
    base = ["run", "transformer", "--d-model", "16", "--n-heads", "2", "--n-layers", "1",
            "--d-ff", "16", "--max-len", "3", "--batch-size", "4", "--eval-every", "0",
            "--eval-size", "4", "--beam-width", "1", "--target", "0", "--no-progress",
            "--warmup", "1", "--checkpoint", ck]
    assert cli(base + ["--steps", "2"]) == 0
    capsys.readouterr()
    assert cli(base + ["--steps", "4", "--resume"]) == 0
    assert "--resume: the run was started with --steps 2: steps 3..4" in capsys.readouterr().out


ENCODER = ["run", "encoder", "--n-train", "32", "--n-test", "8", "--batch-size", "16",
           "--d-model", "16", "--d-ff", "32", "--seq-len", "6", "--no-progress"]


def test_run_encoder_takes_the_flags_of_the_other_runs_and_its_old_spellings_for_a_release(capsys):
    assert cli(ENCODER + ["--n-layers", "1", "--n-heads", "2", "--steps", "4"]) == 0
    new = capsys.readouterr()
    assert "1 layers, d_model 16, 2 heads" in new.out and "4 steps (2 epochs)" in new.out
    assert new.err == ""
    assert cli(ENCODER + ["--layers", "1", "--heads", "2", "--epochs", "2"]) == 0
    old = capsys.readouterr()
    assert old.out.split("final MSE")[1].split("wall time")[0] == \
        new.out.split("final MSE")[1].split("wall time")[0]             # the same run, to the digit
    for before, after in (("--layers", "--n-layers"), ("--heads", "--n-heads"),
                          ("--epochs", "--steps")):
        assert (f"python -m tformer run encoder: {before} is the old spelling of {after} and goes "
                f"in the next release; use {after}") in old.err
    assert "N epochs are N·⌈n_train / batch_size⌉ steps" in old.err
    _usage_error(ENCODER + ["--epochs", "2", "--steps", "4"], capsys, "run encoder",
                 "--epochs: the old spelling of --steps, expected one of the two")
