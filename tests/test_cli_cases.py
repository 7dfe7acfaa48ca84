"""Every bad invocation the hostile-user audit listed (issue 40) is a usage error: exit status 2,
one line naming the flag or file and what was expected, no traceback, no file changed."""
import errno
import os
import shutil

import numpy as np
import pytest

import cli_hostile

RUN = cli_hostile.RUN
T = ["--text", "corpus.txt"]
LORA = ["--base", "base.npz", "--lora", "2"]
GEN = ["generate", "--max-new-tokens", "3", "--threads", "1"]
Q = ["--eval-windows", "2", "--gen-tokens", "2", "--threads", "1"]
BPE_COMPARE = cli_hostile.BPE_COMPARE

CASES = {
    # data that a typo would lose
    "adapter over the base": ([*RUN, *T, *LORA, "--checkpoint", "new.npz", "--adapter", "base.npz"],
                              ["--adapter: expected another file than --base"]),
    "adapter over the checkpoint": ([*RUN, *T, *LORA, "--checkpoint", "lora.npz", "--adapter",
                                     "lora.npz", "--resume"], ["--adapter: expected another file",
                                                               "--checkpoint"]),
    "tokenizer over the corpus": ([*RUN, *T, "--checkpoint", "new.npz", "--bpe", "300",
                                   "--tokenizer", "corpus.txt"],
                                  ["--tokenizer: expected another file than --text"]),
    "checkpoint over the corpus": ([*RUN, *T, "--checkpoint", "corpus.txt"],
                                   ["--checkpoint: expected another file than --text"]),
    "tokenizer over the checkpoint": ([*RUN, *T, "--checkpoint", "base.npz", "--bpe", "300",
                                       "--tokenizer", "base.npz"],
                                      ["--tokenizer: expected another file than --checkpoint"]),
    "quantize over its input": (["quantize", "base.npz", "--out", "base.npz", *Q],
                                ["--out: expected another file than CHECKPOINT"]),
    "resume with another --bpe": ([*RUN, *T, "--checkpoint", "bpe.npz", "--resume", "--bpe", "280"],
                                  ["--checkpoint: expected a checkpoint of this run to --resume",
                                   "vocab_size"]),
    # tracebacks
    "tokenizer without merges": ([*RUN, *T, "--checkpoint", "new.npz", "--tokenizer",
                                  "tok-nomerges.json"], ["--tokenizer: expected a tokenizer file",
                                                         "'merges'"]),
    "tokenizer pattern (": ([*RUN, *T, "--checkpoint", "new.npz", "--tokenizer",
                             "tok-badpattern.json"], ["--tokenizer:", "regular expression"]),
    "tokenizer of ints": ([*GEN, "--checkpoint", "bpe.npz", "--tokenizer", "tok-ints.json"],
                          ["--tokenizer:", "list of pairs"]),
    "tokenizer nested deep": ([*GEN, "--checkpoint", "bpe.npz", "--tokenizer", "tok-deep.json"],
                              ["--tokenizer:", "nested too deeply"]),
    "tokenizer of random bytes": ([*RUN, *T, "--checkpoint", "new.npz", "--tokenizer",
                                   "random.bin"], ["--tokenizer:", "not UTF-8"]),
    "top-k 0": ([*GEN, "--top-k", "0"], ["argument --top-k: expected an integer ≥ 1"]),
    "top-p 0": ([*GEN, "--top-p", "0"], ["argument --top-p: expected a probability mass in (0, 1]"]),
    "top-p 2": ([*GEN, "--top-p", "2"], ["argument --top-p:"]),
    "top-p nan": ([*GEN, "--top-p", "nan"], ["argument --top-p:"]),
    "seed -1": ([*GEN, "--seed", "-1"], ["argument --seed: expected an integer ≥ 0"]),
    "min-p 2": ([*GEN, "--min-p", "2"],
                ["argument --min-p: expected a fraction of the largest probability in [0, 1]"]),
    "min-p nan": ([*GEN, "--min-p", "nan"], ["argument --min-p:"]),
    "lookahead 0": ([*GEN, "--draft", "base.npz", "--lookahead", "0"],
                    ["argument --lookahead: expected an integer ≥ 1"]),
    "lookahead without a draft": ([*GEN, "--lookahead", "2"],
                                  ["--lookahead: applies to speculative decoding", "--draft"]),
    "draft without the cache": ([*GEN, "--draft", "base.npz", "--no-cache"],
                                ["--no-cache: speculative decoding (--draft) runs through the KV"]),
    "draft of another vocabulary": ([*GEN, "--checkpoint", "base.npz", "--draft", "bpe.npz"],
                                    ["--draft: expected a model of the 256 tokens --checkpoint "
                                     "reads, got"]),
    "draft missing": ([*GEN, "--checkpoint", "base.npz", "--draft", "missing.npz"], ["--draft:"]),
    "draft an adapter": ([*GEN, "--checkpoint", "base.npz", "--draft", "lora.adapter.npz"],
                         ["--draft:", "LoRA adapter file, not a checkpoint"]),
    "prompt not UTF-8": ([*GEN, "--prompt", "a\udcff"], ["argument --prompt: expected UTF-8 text"]),
    "checkpoint that is an adapter": ([*GEN, "--checkpoint", "lora.adapter.npz"],
                                      ["--checkpoint:", "LoRA adapter file, not a checkpoint"]),
    "adapter of NaN": ([*GEN, "--checkpoint", "base.npz", "--adapter", "nan.adapter.npz"],
                       ["--adapter:", "NaN"]),
    "adapter of 1e30": ([*GEN, "--checkpoint", "base.npz", "--adapter", "huge.adapter.npz"],
                        ["--adapter:", "infinite"]),
    "adapter without layers": ([*GEN, "--checkpoint", "base.npz", "--adapter",
                                "nolayers.adapter.npz"], ["--adapter:", "'layers'"]),
    "adapter without fingerprint": ([*GEN, "--checkpoint", "base.npz", "--adapter",
                                     "nofp.adapter.npz"], ["--adapter:", "'base_fingerprint'"]),
    "base int8": ([*RUN, *T, "--base", "int8.npz"], ["--base:", "int8"]),
    "base BPE": ([*RUN, *T, "--base", "bpe.npz"], ["--base: expected a TinyGPT of the 256 bytes"]),
    "base LoRA": ([*RUN, *T, "--base", "lora.npz"], ["--base:", "LoRA fine-tuning checkpoint"]),
    "resume of another size": ([*RUN, *T, "--checkpoint", "base.npz", "--resume", "--d-model",
                                "16"], ["--checkpoint: expected a checkpoint of this run", "d_model"]),
    "resume truncated": ([*RUN, *T, "--checkpoint", "truncated.npz", "--resume"],
                         ["--checkpoint:", "not a zip"]),
    "resume random": ([*RUN, *T, "--checkpoint", "random.bin", "--resume"], ["--checkpoint:"]),
    "resume empty": ([*RUN, *T, "--checkpoint", "empty.bin", "--resume"], ["--checkpoint:"]),
    "resume another command's": ([*RUN, *T, "--checkpoint", "transformer.npz", "--resume"],
                                 ["--checkpoint: expected a checkpoint of this run"]),
    "quantize truncated": (["quantize", "truncated.npz", "--out", "new.npz", *Q], ["CHECKPOINT:"]),
    "quantize missing": (["quantize", "missing.npz", "--out", "new.npz", *Q], ["CHECKPOINT:"]),
    "quantize a folder": (["quantize", "folder", "--out", "new.npz", *Q], ["CHECKPOINT:"]),
    "quantize an adapter": (["quantize", "lora.adapter.npz", "--out", "new.npz", *Q],
                            ["CHECKPOINT:", "adapter"]),
    "quantize a tokenizer": (["quantize", "bpe.tokenizer.json", "--out", "new.npz", *Q],
                             ["CHECKPOINT:"]),
    "quantize under a file": (["quantize", "base.npz", "--out", "corpus.txt/x.npz", *Q],
                              ["--out: expected a file that can be written", "is a file"]),
    "bpe-compare missing text": ([*BPE_COMPARE, "--text", "missing.txt", "--out", "new.json"],
                                 ["--text: expected a readable file"]),
    "bpe-compare empty text": ([*BPE_COMPARE, "--text", "empty.bin", "--out", "new.json"],
                               ["--text: expected a file of at least"]),
    "bpe-compare over its text": ([*BPE_COMPARE, "--text", "corpus.txt", "--out", "corpus.txt"],
                                  ["--out: expected another file than --text"]),
    "bpe-compare steps abc": ([*BPE_COMPARE, "--steps", "abc"], ["argument --steps"]),
    "bpe-compare huge V": ([*BPE_COMPARE, "--text", "corpus.txt", "--out", "new.json",
                            "--vocab-sizes", "256", "1000000000"], ["--vocab-sizes: expected"]),
    "temperatures abc": ([*RUN, *T, "--checkpoint", "new.npz", "--temperatures", "abc"],
                         ["argument --temperatures: expected comma-separated finite numbers ≥ 0"]),
    "temperatures nan": ([*RUN, *T, "--checkpoint", "new.npz", "--temperatures", "nan"],
                         ["argument --temperatures"]),
    "temperatures -1": ([*RUN, *T, "--checkpoint", "new.npz", "--temperatures", "-1"],
                        ["argument --temperatures"]),
    "output under a file": ([*RUN, *T, "--checkpoint", "corpus.txt/x.npz"],
                            ["--checkpoint: expected a file that can be written"]),
    "output in /proc": ([*RUN, *T, "--checkpoint", "/proc/tformer-x.npz"],
                        ["--checkpoint: expected a file that can be written"]),
    "output a folder": ([*RUN, *T, "--checkpoint", "folder"], ["--checkpoint:", "folder"]),
    # accepted silently
    "tokenizer of another run": ([*GEN, "--checkpoint", "bpe.npz", "--tokenizer",
                                  "other.tokenizer.json"],
                                 ["--tokenizer: expected the tokenizer --checkpoint", "got tokenizer"]),
    "resume with a tokenizer of another run": ([*RUN, *T, "--checkpoint", "bpe.npz", "--resume",
                                                "--tokenizer", "other.tokenizer.json"],
                                               ["--tokenizer: expected the tokenizer --checkpoint "
                                                "'bpe.npz' was trained with"]),
    "bpe 1e9": ([*RUN, *T, "--checkpoint", "new.npz", "--bpe", "1000000000"],
                ["--bpe: expected at most", "merges the training split allows"]),
    "lora 100000": ([*RUN, *T, *LORA[:2], "--lora", "100000", "--checkpoint", "new.npz"],
                    ["--lora: expected a rank of at most 8"]),
    "lora-targets alone": ([*RUN, *T, "--lora-targets", "all"],
                           ["--lora-targets: applies to LoRA fine-tuning"]),
    "max-new-tokens 1e12": ([*GEN, "--max-new-tokens", "1000000000000"],
                            ["argument --max-new-tokens: expected an integer ≥ 0 and at most 1,000,000"]),
    "bpe 0": ([*RUN, *T, "--bpe", "0"], ["--bpe: expected a vocabulary of at least 256 tokens",
                                         "V ≥ 257"]),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return cli_hostile.fixtures(str(tmp_path_factory.mktemp("cases") / "files"))


@pytest.fixture
def work(pristine, tmp_path):
    path = str(tmp_path / "w")
    shutil.copytree(pristine, path)
    return path


def refused(argv, work, parts):
    before = cli_hostile.snapshot(work)
    code, _, err = cli_hostile.run(argv, work)
    assert code == 2, (code, err)
    last = err.rstrip("\n").splitlines()[-1]
    assert "Traceback" not in err and last.startswith("python -m tformer") and ": error: " in last
    for part in parts:
        assert part in last, (part, last)
    assert cli_hostile.snapshot(work) == before                   # no file changed or added
    return last


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_of_the_audit_is_a_usage_error(name, work):
    argv, parts = CASES[name]
    refused(argv, work, parts)


def test_a_draft_of_another_tokenizer_is_refused(work):
    """bpe.npz's weights under a record of another tokenizer of the same size: same vocabulary,
    other tokens."""
    import json

    from tformer.bpe import BPETokenizer
    from tformer.checkpoint import read_npz, write_npz
    from tformer.runs.files import tokenizer_record
    meta, arrays = read_npz(os.path.join(work, "bpe.npz"))
    other = BPETokenizer.load(os.path.join(work, "other.tokenizer.json"))
    meta["extra"]["tokenizer"] = tokenizer_record(other)
    write_npz(os.path.join(work, "draft-other.npz"), {**arrays, "meta": np.array(json.dumps(meta))})
    refused([*GEN, "--checkpoint", "bpe.npz", "--tokenizer", "bpe.tokenizer.json", "--draft",
             "draft-other.npz"], work, ["--draft: expected a model of the tokens --checkpoint reads",
                                        "--draft 'draft-other.npz' was trained with"])


@pytest.mark.parametrize("draft, target, tokenizer", [("base.npz", "base.npz", None),
                                                      ("int8.npz", "base.npz", None),
                                                      ("bpe.npz", "bpe.npz", "bpe.tokenizer.json")])
def test_generate_with_a_draft_writes_the_greedy_text_of_the_checkpoint(work, draft, target,
                                                                       tokenizer):
    argv = ["generate", "--max-new-tokens", "12", "--threads", "1", "--temperature", "0",
            "--checkpoint", target] + (["--tokenizer", tokenizer] if tokenizer else [])
    plain = cli_hostile.run(argv, work)
    fast = cli_hostile.run([*argv, "--draft", draft, "--lookahead", "3"], work)
    assert plain[0] == fast[0] == 0 and plain[1] == fast[1] and len(plain[1]) > 5


def test_generate_samples_with_min_p_and_a_draft(work):
    argv = [*GEN, "--max-new-tokens", "8", "--checkpoint", "base.npz", "--min-p", "0.1",
            "--top-k", "20", "--top-p", "0.9", "--temperature", "1.2"]
    for extra in ([], ["--draft", "int8.npz"]):
        code, out, err = cli_hostile.run([*argv, *extra], work)
        assert code == 0 and out.startswith("def ") and not err, (code, err)


def test_a_full_disk_keeps_the_old_checkpoint_and_says_so(work, monkeypatch):
    import tformer.atomic

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(tformer.atomic.os, "fsync", full)
    last = refused([*RUN, *T, "--checkpoint", "base.npz"], work,
                   ["--checkpoint: 'base.npz' could not be written (No space left on device); "
                    "the old file is kept"])
    assert last.startswith("python -m tformer run tinygpt: error:")
