"""``python -m tformer finetune``: DPO and SFT from a pairs file, full or LoRA, end to end on tiny
TinyGPTs (bytes, BPE, int8, and the book's long-run model); every malformed pairs file and every
conflicting flag a usage error that writes nothing; no input ever overwritten."""
import contextlib
import io
import json
import os
import shutil

import numpy as np
import pytest

import cli_hostile

TINY = dict(d_model=16, n_heads=2, n_layers=1, max_len=16, seed=0)
ROWS = [("The cat ", "sat down.", "ran off!"), ("A dog ", "sat here.", "barked."),
        ("My friend ", "sat still.", "left me."), ("Then we ", "sat and ate.", "fought."),
        ("x" * 30, "sat.", "no."), ("Now ", "sat.", "went.")]
RUN = ["finetune", "--threads", "1", "--steps", "20"]


def _pairs_text(rows):
    return "".join(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n" for p, c, r in rows)


def _fixtures(folder):
    from tformer.data.bpe import BPETokenizer
    from tformer.training.checkpoint import save_checkpoint
    from tformer.models.tinygpt import TinyGPT
    from tformer.runs.files import tokenizer_record
    from tformer.decoding.quantize import quantize_model, save_quantized
    os.makedirs(folder)
    os.chdir(folder)
    save_checkpoint("base.npz", TinyGPT(vocab_size=256, **TINY), extra={"tokenizer": None})
    save_quantized("int8.npz", quantize_model(TinyGPT(vocab_size=256, **TINY), "w8"))
    tok = BPETokenizer.train(" ".join(r[i] for r in ROWS for i in range(3)) * 3, 270)
    tok.save("bpe.tokenizer.json")
    save_checkpoint("bpe.npz", TinyGPT(vocab_size=tok.vocab_size, **TINY),
                    extra={"tokenizer": tokenizer_record(tok)})
    with open("pairs.jsonl", "w", encoding="utf-8") as f:
        f.write(_pairs_text(ROWS))
    with open("notes.txt", "w") as f:
        f.write("my notes\n")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("finetune") / "files")
    here = os.getcwd()
    try:
        _fixtures(folder)
    finally:
        os.chdir(here)
    return folder


@pytest.fixture
def work(pristine, tmp_path):
    path = str(tmp_path / "w")
    shutil.copytree(pristine, path)
    return path


def ok(argv, work):
    code, out, err = cli_hostile.run(argv, work)
    assert code in (0, None), (code, err)
    assert "Warning" not in err, err
    return out


def refused(argv, work, *parts):
    """Exit status 2, one line naming ``parts``, every file as it was and no file added."""
    before = cli_hostile.snapshot(work)
    code, out, err = cli_hostile.run(argv, work)
    assert code == 2, (code, out, err)
    last = err.rstrip("\n").splitlines()[-1]
    assert "Traceback" not in err and "Warning" not in err, err
    assert last.startswith("python -m tformer finetune: error: "), last
    for part in parts:
        assert part in last, (part, last)
    assert cli_hostile.snapshot(work) == before
    return last


def _meta(path):
    from tformer.training.checkpoint import read_checkpoint
    return read_checkpoint(path)[0]


def test_dpo_raises_the_implicit_reward_accuracy_lowers_the_loss_and_generate_reads_it(work):
    out = ok([*RUN, "--dpo", "pairs.jsonl", "--checkpoint", "base.npz", "--out", "dpo.npz",
              "--lr", "1e-2"], work)
    assert "at the start Δ = 0 for every pair" in out and "step 20/20: dpo loss" in out
    assert "(3 prompts cut on the left to fit T = 16)" in out
    run = _meta(os.path.join(work, "dpo.npz"))["extra"]["finetune"]
    assert run["objective_before"] == pytest.approx(np.log(2), abs=1e-6)     # Δ = 0: −log σ(0)
    assert run["objective_after"] < 0.5 * run["objective_before"]
    assert run["reward_accuracy_after"] >= 5 / 6
    assert len(run["losses"]) == 20 and run["n_pairs"] == len(ROWS)
    text = ok(["generate", "--checkpoint", "dpo.npz", "--prompt", "The cat ", "--threads", "1",
               "--max-new-tokens", "4", "--temperature", "0"], work)
    assert text.startswith("The cat ")


@pytest.mark.parametrize("loss", ["dpo", "sft"])
@pytest.mark.parametrize("lora", [[], ["--lora", "2", "--lora-alpha", "4", "--lora-targets", "attn"]])
def test_dpo_and_sft_full_and_lora_write_a_float_tinygpt_that_generate_reads(work, loss, lora):
    from tformer.runs.files import load_tinygpt
    out = ok([*RUN, f"--{loss}", "pairs.jsonl", "--checkpoint", "base.npz", "--out", "t.npz",
              "--lr", "1e-2", *lora], work)
    assert ("merged into the weights" in out) == bool(lora)
    meta = _meta(os.path.join(work, "t.npz"))
    assert "lora" not in meta["config"] and "quantized" not in meta
    run = meta["extra"]["finetune"]
    assert run["loss"] == loss and run["objective_after"] < run["objective_before"]
    model, _ = load_tinygpt(os.path.join(work, "t.npz"))
    base, _ = load_tinygpt(os.path.join(work, "base.npz"))
    changed = {n for (n, p, _), (_, q, _) in zip(model.named_parameters(), base.named_parameters())
               if not np.array_equal(p, q)}
    if lora:                                            # only the attention's weights moved
        assert changed and all(".attn." in n and n.endswith(".W") for n in changed)
    else:
        assert len(changed) > 10
    ok(["generate", "--checkpoint", "t.npz", "--max-new-tokens", "3", "--threads", "1"], work)


def test_a_bpe_model_needs_its_tokenizer_and_the_output_records_it(work):
    refused([*RUN, "--dpo", "pairs.jsonl", "--checkpoint", "bpe.npz", "--out", "t.npz"], work,
            "--tokenizer: the model reads", "expected the tokenizer it was trained with")
    ok([*RUN, "--dpo", "pairs.jsonl", "--checkpoint", "bpe.npz", "--tokenizer",
        "bpe.tokenizer.json", "--out", "t.npz", "--lora", "2"], work)
    meta = _meta(os.path.join(work, "t.npz"))
    assert meta["extra"]["tokenizer"] == _meta(os.path.join(work, "bpe.npz"))["extra"]["tokenizer"]
    text = ok(["generate", "--checkpoint", "t.npz", "--tokenizer", "bpe.tokenizer.json",
               "--prompt", "A dog ", "--max-new-tokens", "3", "--threads", "1"], work)
    assert text.startswith("A dog ")


def test_an_int8_checkpoint_is_tuned_from_its_dequantized_weights(work):
    out = ok([*RUN, "--dpo", "pairs.jsonl", "--checkpoint", "int8.npz", "--out", "t.npz",
              "--steps", "2"], work)
    assert "objective on the 6 pairs: 0.6931 before" in out
    assert "quantized" not in _meta(os.path.join(work, "t.npz"))


def test_the_default_model_is_the_long_run_one_with_its_tokenizer(work):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pairs = os.path.join(work, "pairs.jsonl")
    out = os.path.join(work, "t.npz")
    here = os.getcwd()
    os.chdir(repo)
    try:
        from tformer.__main__ import main
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["finetune", "--dpo", pairs, "--out", out, "--steps", "2", "--lora", "2",
                         "--batch-pairs", "2", "--threads", "1"]) == 0
    finally:
        os.chdir(here)
    assert "book/data/long_run_w8.npz" in buf.getvalue()
    assert "tokenizer book/data/long_run_tokenizer.json" in buf.getvalue()
    assert _meta(out)["config"]["vocab_size"] == 8192


def test_an_existing_checkpoint_out_is_replaced_another_file_is_kept(work):
    ok([*RUN, "--sft", "pairs.jsonl", "--checkpoint", "base.npz", "--out", "t.npz"], work)
    ok([*RUN, "--sft", "pairs.jsonl", "--checkpoint", "base.npz", "--out", "t.npz"], work)
    for name, why in (("notes.txt", "not a zip"), ("int8.npz", "(it is an int8 checkpoint"),
                      ("bpe.tokenizer.json", "not a zip")):
        refused([*RUN, "--sft", "pairs.jsonl", "--checkpoint", "base.npz", "--out", name], work,
                "--out: expected a new file or a TinyGPT checkpoint to replace", why, "is kept")


@pytest.mark.parametrize("flag, value", [("--checkpoint", "bpe.npz"), ("--dpo", "pairs.jsonl"),
                                         ("--tokenizer", "bpe.tokenizer.json")])
def test_out_is_never_an_input(work, flag, value):
    argv = {"--checkpoint": "bpe.npz", "--dpo": "pairs.jsonl", "--tokenizer": "bpe.tokenizer.json"}
    argv = [*RUN, *(a for k, v in argv.items() for a in (k, v)), "--out", value]
    refused(argv, work, f"--out: expected another file than {flag} '{value}', which the command "
                        f"reads")


BAD_PAIRS = {
    "empty file": (b"", ["got an empty file"]),
    "white space only": (b"\n\n", ["a file of white space only"]),
    "not UTF-8": (_pairs_text(ROWS[:2]).encode() + b'{"prompt": "\xff"}\n',
                  ["line 3", "expected UTF-8 text, got the byte 0xff"]),
    "BOM": (("\ufeff" + _pairs_text(ROWS[:1])).encode(), ["line 1", "byte-order mark"]),
    "BOM on line 2": ((_pairs_text(ROWS[:1]) + "\ufeff" + _pairs_text(ROWS[:1])).encode(),
                      ["line 2", "byte-order mark"]),
    "invalid JSON": (b'{"prompt": "a", "chosen": "b", \n', ["line 1", "not JSON"]),
    "deep JSON": (b"[" * 100_000 + b"]" * 100_000 + b"\n", ["line 1"]),
    "a list": (b'["a", "b", "c"]\n', ["line 1", "expected a JSON object", "got a list"]),
    "a number": (b"3\n", ["line 1", "got a number"]),
    "empty line": ((_pairs_text(ROWS[:1]) + "\n" + _pairs_text(ROWS[:1])).encode(),
                   ["line 2", "got an empty line"]),
    "missing key": (b'{"prompt": "a", "chosen": "b"}\n', ["line 1", "no 'rejected'"]),
    "extra key": (b'{"prompt": "a", "chosen": "b", "rejected": "c", "score": 1}\n',
                  ["line 1", "the key 'score'"]),
    "key twice": (b'{"prompt": "a", "chosen": "b", "rejected": "c", "chosen": "d"}\n',
                  ["line 1", "the key 'chosen' twice"]),
    "not a string": (b'{"prompt": "a", "chosen": 1, "rejected": "c"}\n',
                     ["line 1", "expected 'chosen' to be a string, got a number"]),
    "null": (b'{"prompt": null, "chosen": "b", "rejected": "c"}\n', ["'prompt'", "got null"]),
    "empty prompt": (b'{"prompt": "", "chosen": "b", "rejected": "c"}\n',
                     ["line 1", "expected a non-empty 'prompt'"]),
    "empty chosen": (b'{"prompt": "a", "chosen": "", "rejected": "c"}\n', ["non-empty 'chosen'"]),
    "empty rejected": (b'{"prompt": "a", "chosen": "b", "rejected": ""}\n',
                       ["non-empty 'rejected'"]),
    "chosen is rejected": (b'{"prompt": "a", "chosen": "b", "rejected": "b"}\n',
                           ["line 1", "expected a chosen response other than the rejected one"]),
    "lone surrogate": (b'{"prompt": "a\\ud800", "chosen": "b", "rejected": "c"}\n',
                       ["line 1", "lone surrogate U+D800"]),
    "response too long": (_pairs_text(ROWS[:2] + [("a", "y" * 17, "n")]).encode(),
                          ["line 3", "expected a chosen response of at most 16 tokens", "got 17"]),
}


@pytest.mark.parametrize("name", sorted(BAD_PAIRS))
@pytest.mark.parametrize("flag", ["--dpo", "--sft"])
def test_each_malformed_pairs_file_is_a_usage_error_that_writes_nothing(work, name, flag):
    content, parts = BAD_PAIRS[name]
    with open(os.path.join(work, "bad.jsonl"), "wb") as f:
        f.write(content)
    refused([*RUN, flag, "bad.jsonl", "--checkpoint", "base.npz", "--out", "t.npz"], work,
            f"{flag}: ", *parts)


@pytest.mark.parametrize("path, why", [("missing.jsonl", "no such file"), (".", "a folder")])
def test_a_pairs_file_that_is_not_there_is_a_usage_error(work, path, why):
    refused([*RUN, "--dpo", path, "--checkpoint", "base.npz", "--out", "t.npz"], work,
            "--dpo: expected a file of JSON lines", why)


def test_a_response_of_exactly_the_context_fits_and_a_long_prompt_is_cut(tmp_path):
    from tformer.data.text import encode
    from tformer.runs.pairs_file import read_pairs
    path = tmp_path / "p.jsonl"
    path.write_text(_pairs_text([("p" * 40, "y" * 16, "n"), ("abc", "yy", "nnnn")]))
    pairs, cut = read_pairs("--dpo", str(path), encode, 16)
    assert cut == 1 and pairs.prompt_len.tolist() == [1, 3]
    assert pairs.chosen_len.tolist() == [16, 2] and pairs.rejected_len.tolist() == [1, 4]
    x, t, m = pairs.batch(np.arange(2))
    assert x.shape[1] <= 16                                     # the model's context
    assert bytes(pairs.prompt[1, :3].astype(np.uint8)) == b"abc"
    assert m.sum() == 16 + 2 + 1 + 4                            # every response token a target


CONFLICTS = {
    "both --dpo and --sft": (["--dpo", "pairs.jsonl", "--sft", "pairs.jsonl"],
                             ["argument --sft: not allowed with argument --dpo"]),
    "neither": ([], ["one of the arguments --dpo --sft is required"]),
    "--lora-alpha alone": (["--dpo", "pairs.jsonl", "--lora-alpha", "4"],
                           ["--lora-alpha: applies to LoRA fine-tuning; expected --lora R too"]),
    "--lora-targets alone": (["--dpo", "pairs.jsonl", "--lora-targets", "attn"],
                             ["--lora-targets: applies to LoRA fine-tuning"]),
    "--lora too large": (["--dpo", "pairs.jsonl", "--lora", "100"],
                         ["--lora: expected a rank of at most 16"]),
    "--lora-targets unknown": (["--dpo", "pairs.jsonl", "--lora", "2", "--lora-targets", "wq"],
                               ["--lora-targets: expected names among"]),
    "--lora-targets empty": (["--dpo", "pairs.jsonl", "--lora", "2", "--lora-targets", ","],
                             ["--lora-targets: expected names among"]),
    "--steps 1": (["--dpo", "pairs.jsonl", "--steps", "1"], ["argument --steps: expected"]),
    "--steps huge": (["--dpo", "pairs.jsonl", "--steps", cli_hostile.HUGE],
                     ["argument --steps: expected an integer ≥ 2", "at most 1,000,000"]),
    "--beta 0": (["--dpo", "pairs.jsonl", "--beta", "0"], ["argument --beta: expected"]),
    "--lr nan": (["--dpo", "pairs.jsonl", "--lr", "nan"], ["argument --lr: expected"]),
    "--lr 1e30": (["--dpo", "pairs.jsonl", "--lr", "1e30"],       # issue 53: at parse time
                  ["argument --lr: expected a finite number > 0 and at most 10"]),
    "checkpoint an adapter-less transformer": (["--dpo", "pairs.jsonl", "--checkpoint", "notes.txt"],
                                               ["--checkpoint: expected a checkpoint"]),
    "a tokenizer of the wrong size": (["--dpo", "pairs.jsonl", "--tokenizer", "bpe.tokenizer.json"],
                                      ["--tokenizer: expected a tokenizer of the model's 256 tokens"]),
    "out under a file": (["--dpo", "pairs.jsonl", "--out", "notes.txt/t.npz"],
                         ["--out: expected a file that can be written"]),
}


@pytest.mark.parametrize("name", sorted(CONFLICTS))
def test_conflicting_or_bad_flags_are_refused(work, name):
    flags, parts = CONFLICTS[name]
    argv = [*RUN, "--checkpoint", "base.npz", *flags]
    if "--out" not in flags:
        argv += ["--out", "t.npz"]
    refused(argv, work, *parts)


def test_a_huge_batch_is_the_whole_file(work):
    out = ok([*RUN, "--dpo", "pairs.jsonl", "--checkpoint", "base.npz", "--out", "t.npz",
              "--steps", "2", "--batch-pairs", cli_hostile.HUGE], work)
    assert f"2 steps of {len(ROWS)} pairs" in out


def test_a_full_disk_writes_nothing_and_says_so(work, monkeypatch):
    import errno

    import tformer.core.atomic

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(tformer.core.atomic.os, "fsync", full)
    before = cli_hostile.snapshot(work)
    code, _, err = cli_hostile.run([*RUN, "--dpo", "pairs.jsonl", "--checkpoint", "base.npz",
                                    "--out", "t.npz", "--steps", "2"], work)
    assert code == 2 and err.rstrip().splitlines()[-1].endswith(
        "--out: 't.npz' could not be written (No space left on device); no file was written")
    assert cli_hostile.snapshot(work) == before


def test_quantize_scores_a_model_only_on_the_corpus_it_records(work):
    """Issue 53, finding 21: ``quantize`` of a ``finetune`` output (tuned on pairs, no text corpus
    recorded) prints no validation bits/byte on a corpus the model never saw, and says why; a
    ``run tinygpt`` checkpoint is scored on the text it records."""
    with open(os.path.join(work, "corpus.txt"), "w") as f:
        f.write("the cat sat on the mat. " * 200)
    ok([*RUN, "--steps", "2", "--sft", "pairs.jsonl", "--checkpoint", "base.npz", "--out",
        "t.npz"], work)
    q = ["--eval-windows", "2", "--gen-tokens", "2", "--threads", "1"]
    out = ok(["quantize", "t.npz", "--out", "q.npz", *q], work)
    assert "bits/byte" not in out, out
    assert ("validation: not measured: t.npz is a `finetune` output, tuned on the preference "
            "pairs 'pairs.jsonl' from 'base.npz'") in out
    assert os.path.isfile(os.path.join(work, "q.npz"))
    out = ok(["quantize", "base.npz", "--out", "q2.npz", *q], work)      # records no corpus either
    assert "validation: not measured: base.npz records no corpus it was trained on" in out
    ok(["run", "tinygpt", "--text", "corpus.txt", "--d-model", "8", "--n-heads", "2",
        "--n-layers", "1", "--max-len", "8", "--batch-size", "2", "--eval-windows", "2",
        "--eval-every", "0", "--sample-tokens", "2", "--temperatures", "1", "--no-progress",
        "--warmup", "0", "--steps", "1", "--threads", "1", "--checkpoint", "run.npz"], work)
    out = ok(["quantize", "run.npz", "--out", "q3.npz", *q], work)
    assert "bits/byte" in out and "on 2 windows of the text 'corpus.txt'" in out, out
