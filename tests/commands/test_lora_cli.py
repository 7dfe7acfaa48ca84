"""``run tinygpt --base/--lora`` (fine-tuning, --resume with adapters) and ``generate --adapter``."""
import numpy as np
import pytest

from tformer.__main__ import main as cli
from tformer.training.checkpoint import read_checkpoint
from tformer.training.lora_file import read_adapter
from tformer.runs import tinygpt

TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--max-len", "16",
        "--batch-size", "4", "--eval-windows", "4", "--eval-every", "0", "--sample-tokens", "4",
        "--temperatures", "1.0", "--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "base.npz"
    assert cli(["run", "tinygpt", *TINY, "--steps", "2", "--checkpoint", str(path)]) == 0
    return path


def lora_run(base, ckpt, steps, *extra):
    return cli(["run", "tinygpt", "--corpus", "shakespeare", *TINY, "--base", str(base),
                "--lora", "2", "--lora-targets", "attn,fc2", "--steps", str(steps),
                "--checkpoint", str(ckpt), *extra])


class Interrupted(Exception):
    pass


def test_lora_run_writes_adapters_only_and_resumes_bit_for_bit(base, tmp_path, monkeypatch):
    assert lora_run(base, tmp_path / "a.npz", 4) == 0
    meta, state, optim = read_checkpoint(tmp_path / "a.npz")
    assert meta["config"]["lora"]["r"] == 2 and meta["step"] == 4
    assert state and all(k.endswith((".A", ".B")) for k in state)   # no base weight in it
    _, adapters = read_adapter(tmp_path / "a.adapter.npz")
    assert adapters.keys() == state.keys()
    # Stopped after two of four steps, then --resume: the same adapters as four steps straight.
    real_train = tinygpt.train

    def stop_after_two(model, opt, batch, *args, **kwargs):
        def first_two(i):
            if i >= 2:
                raise Interrupted
            return batch(i)
        return real_train(model, opt, first_two, *args, **kwargs)
    monkeypatch.setattr(tinygpt, "train", stop_after_two)
    with pytest.raises(Interrupted):
        lora_run(base, tmp_path / "b.npz", 4, "--checkpoint-every", "1")
    monkeypatch.setattr(tinygpt, "train", real_train)
    assert read_checkpoint(tmp_path / "b.npz")[0]["step"] == 2
    assert lora_run(base, tmp_path / "b.npz", 4, "--resume") == 0
    _, resumed = read_adapter(tmp_path / "b.adapter.npz")
    assert all(np.array_equal(resumed[k], adapters[k]) for k in adapters)


def test_generate_with_the_adapter(base, tmp_path, capsys):
    assert lora_run(base, tmp_path / "a.npz", 2) == 0
    capsys.readouterr()
    assert cli(["generate", "--checkpoint", str(base), "--adapter", str(tmp_path / "a.adapter.npz"),
                "--prompt", "ROMEO:", "--max-new-tokens", "5", "--threads", "1"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")


def test_an_adapter_on_another_base_is_a_usage_error(base, tmp_path, capsys):
    assert lora_run(base, tmp_path / "a.npz", 2) == 0
    other = tmp_path / "other.npz"
    assert cli(["run", "tinygpt", *TINY, "--steps", "2", "--seed", "1", "--checkpoint", str(other)]) == 0
    with pytest.raises(SystemExit) as e:
        cli(["generate", "--checkpoint", str(other), "--adapter", str(tmp_path / "a.adapter.npz")])
    assert e.value.code == 2
    assert "--adapter: expected a LoRA adapter file trained on --checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--lora", "2"], "--lora: fine-tunes a trained model; expected --base CHECKPOINT"),
    (["--lora", "0"], "argument --lora: expected an integer ≥ 1, got '0'"),
    (["--lora-alpha", "4"], "--lora-alpha: applies to LoRA fine-tuning; expected --lora R too"),
    (["--base", "no/such.npz"], "--base: expected a checkpoint saved by"),
])
def test_bad_flags_are_usage_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["run", "tinygpt", *TINY, *flags])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_target_and_base_as_checkpoint(base, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["run", "tinygpt", *TINY, "--base", str(base), "--lora", "2", "--lora-targets", "wq",
             "--checkpoint", str(tmp_path / "a.npz")])
    assert e.value.code == 2
    assert "--lora-targets: expected names among" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["run", "tinygpt", *TINY, "--base", str(base), "--checkpoint", str(base)])
    assert "--checkpoint: expected another file than --base" in capsys.readouterr().err
