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


# Issue 53: the commands beside the first five, each file declared (``tformer.runs.declare``).
LONG = ["long-run", "--no-progress", "--threads", "1"]
SHIP_TOK = "long_run_tokenizer.json"
CASES.update({
    # 1: the shipped model the default --target reads, overwritten by --out
    "decoding --out over the shipped model": (
        ["decoding", "--out", "book/data/long_run_w8.npz"],
        ["--out: expected another file than --target (default: the long run's model)"]),
    # 3-6: the tokenizer written beside --ship is a declared output of its own
    "long-run --ship over its tokenizer": (
        [*LONG, "--out", "result.json", "--ship", f"book/data/{SHIP_TOK}"],
        ["--ship's tokenizer: expected another file than --ship"]),
    "long-run --checkpoint over the shipped tokenizer": (
        [*LONG, "--out", "result.json", "--checkpoint", f"out/{SHIP_TOK}", "--ship", "out/m.npz"],
        ["--ship's tokenizer: expected another file than --checkpoint"]),
    "long-run --out over the shipped tokenizer": (
        [*LONG, "--out", f"book/data/{SHIP_TOK}", "--ship", "book/data/m.npz"],
        ["--ship's tokenizer: expected another file than --out"]),
    # 8: collisions are usage errors, not tracebacks from main
    "long-run --checkpoint = --out": ([*LONG, "--out", "result.json", "--checkpoint", "result.json"],
                                      ["--checkpoint: expected another file than --out"]),
    "long-run --ship = --out": ([*LONG, "--out", "result.json", "--ship", "result.json"],
                                ["--ship: expected another file than --out"]),
    "long-run --ship = --checkpoint": ([*LONG, "--out", "result.json", "--checkpoint", "new.npz",
                                        "--ship", "new.npz"],
                                       ["--ship: expected another file than --checkpoint"]),
    "long-run --predict --out = --sweep": ([*LONG, "--predict", "--out", "result.json", "--sweep",
                                            "result.json"],
                                           ["--out: expected another file than --sweep"]),
    # 10: decoding's files
    "decoding --target missing": (["decoding", "--target", "missing.npz", "--out", "new.json"],
                                  ["--target: expected a readable file", "no such file"]),
    "decoding --target of another shape": (
        ["decoding", "--target", "base.npz", "--out", "new.json"],
        ["--target: expected a TinyGPT checkpoint (float or int8) of the long run's shape"]),
    "decoding --target not an npz": (["decoding", "--target", "random.bin", "--out", "new.json"],
                                     ["--target: expected a TinyGPT checkpoint"]),
    "decoding --out a folder": (["decoding", "--out", "folder"], ["--out:", "a folder"]),
    "decoding --tokenizer without --target": (
        ["decoding", "--tokenizer", "bpe.tokenizer.json", "--out", "new.json"],
        ["--tokenizer: the tokenizer of --target", "expected --target with it"]),
    # 15: a FIFO is refused before anything opens it
    "generate --checkpoint a FIFO": ([*GEN, "--checkpoint", "fifo"],
                                     ["--checkpoint: expected a checkpoint", "FIFO"]),
    "run --tokenizer a FIFO": ([*RUN, *T, "--checkpoint", "new.npz", "--tokenizer", "fifo"],
                               ["--tokenizer: expected a regular file", "FIFO"]),
    "finetune --out a FIFO": (["finetune", "--dpo", "pairs.jsonl", "--checkpoint", "base.npz",
                               "--out", "fifo"], ["--out: expected a file that can be written",
                                                  "FIFO"]),
    "quantize --out a FIFO": (["quantize", "base.npz", "--out", "fifo", *Q], ["--out:", "FIFO"]),
    # 19: every experiment checks --out before its long run starts
    **{f"{cmd} --out under a file": ([cmd, "--out", "corpus.txt/x.json"],
                                     ["--out: expected a file that can be written", "is a file"])
       for cmd in ("lora", "ablate", "memory", "shakespeare", "fewer-bits", "online-softmax",
                   "bench", "many-processes", "scaling-sweep", "preference", "bpe-compare")},
    "ablate --out over its --text": (["ablate", "--text", "corpus.txt", "--out", "corpus.txt"],
                                     ["--out: expected another file than --text"]),
    # 21: '..' resolved as the write resolves it
    "--out nope/../x": (["quantize", "base.npz", "--out", "nope/../x.npz", *Q],
                        ["--out: expected a path whose folders exist before '..'", "'nope'"]),
    "--checkpoint nope/../x": ([*RUN, *T, "--checkpoint", "nope/../x.npz"],
                               ["--checkpoint: expected a path whose folders exist before '..'"]),
    "finetune --lr 0": (["finetune", "--dpo", "pairs.jsonl", "--checkpoint", "base.npz", "--out",
                         "new.npz", "--lr", "0"], ["argument --lr: expected a finite number > 0"]),
    # 20: flags that do nothing in the chosen mode
    "long-run --budget without --predict": ([*LONG, "--out", "result.json", "--budget", "1e15"],
                                            ["--budget: applies to the prediction"]),
    "long-run --predict --resume": ([*LONG, "--predict", "--resume", "--out", "new.json"],
                                    ["--resume: continues a run; --predict makes a plan"]),
    "long-run --predict --budget 1e308": ([*LONG, "--predict", "--out", "new.json", "--budget",
                                           "1e308"], ["--budget: expected at most 1e+19 FLOPs"]),
    # a sweep nested too deeply for the JSON parser (found by the survey of issue 53)
    "long-run --predict --sweep nested deep": ([*LONG, "--predict", "--sweep", "tok-deep.json",
                                               "--out", "new.json"],
                                              ["--sweep: expected", "does not read as JSON",
                                               "maximum recursion depth"]),
    # a result file that a command completes is read before the work, not after it
    **{f"{cmd} --out nested deep": ([*cmd.split(), "--out", "tok-deep.json"],
                                    ["--out: expected", "does not read as JSON"])
       for cmd in ("memory", "online-softmax", "ablate --resume", "scaling-sweep")},
    **{f"{cmd} --out a list": ([*cmd.split(), "--out", "tok-list.json"],
                               ["--out: expected", "a JSON object", "holding a list"])
       for cmd in ("memory", "online-softmax", "ablate --resume", "scaling-sweep")},
    # 10: outside the repository
    "preference outside the repository": (["preference", "--out", "new.json"],
                                          ["the long run's model: expected a readable file",
                                           "run the command from its top folder"]),
})


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return cli_hostile.fixtures(str(tmp_path_factory.mktemp("cases") / "files"))


@pytest.fixture
def work(pristine, tmp_path):
    path = str(tmp_path / "w")
    shutil.copytree(pristine, path)
    os.mkfifo(os.path.join(path, "fifo"))                       # a writer would block: never opened
    with open(os.path.join(path, "tok-list.json"), "w") as f:
        f.write("[1, 2]")
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


def repository(work):
    """``book/data`` of the repository in ``work``, small: the long run's plan (a shape that no
    fixture checkpoint has), its shipped model and tokenizer."""
    import json
    data = os.path.join(work, "book", "data")
    os.makedirs(data)
    shutil.copy(os.path.join(work, "int8.npz"), os.path.join(data, "long_run_w8.npz"))
    shutil.copy(os.path.join(work, "bpe.tokenizer.json"), os.path.join(data, SHIP_TOK))
    plan = dict(shape=[2, 8], vocab_size=256, block_size=8, batch_size=2, seed=0, lr=1e-3,
                steps=2, flops=1.0)
    with open(os.path.join(data, "long_run.json"), "w") as f:
        json.dump(dict(plan=plan, predicted_nats_per_char=3.0, predicted_interval=[2.5, 3.5]), f)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_of_the_audit_is_a_usage_error(name, work):
    argv, parts = CASES[name]
    if argv[0] in ("decoding", "long-run", "preference") and "outside" not in name:
        repository(work)
    refused(argv, work, parts)


def test_a_draft_of_another_tokenizer_is_refused(work):
    """bpe.npz's weights under a record of another tokenizer of the same size: same vocabulary,
    other tokens."""
    import json

    from tformer.data.bpe import BPETokenizer
    from tformer.training.checkpoint import read_npz, write_npz
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
    import tformer.core.atomic

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(tformer.core.atomic.os, "fsync", full)
    last = refused([*RUN, *T, "--checkpoint", "base.npz"], work,
                   ["--checkpoint: 'base.npz' could not be written (No space left on device); "
                    "the old file is kept"])
    assert last.startswith("python -m tformer run tinygpt: error:")


# Issue 53: numeric ranges at parse time, checkpoints and plans checked before any work.
FT = ["finetune", "--dpo", "pairs.jsonl", "--checkpoint", "base.npz", "--out", "new.npz"]
TRANSFORMER = ["run", "transformer", "--d-model", "8", "--n-heads", "2", "--n-layers", "1",
               "--d-ff", "8", "--max-len", "3", "--batch-size", "4", "--eval-every", "0",
               "--eval-size", "4", "--no-progress", "--steps", "1", "--checkpoint", "new.npz"]
RANGES = {
    "run tinygpt --lr 1e308": ([*RUN, *T, "--lr", "1e308"],
                               ["argument --lr: expected a finite number ≥ 0 and at most 10"]),
    "run transformer --lr 1e308": ([*TRANSFORMER, "--lr", "1e308"], ["argument --lr:"]),
    "run transformer --beam-width 1e9": ([*TRANSFORMER, "--beam-width", "1000000000"],
                                         ["--beam-width: expected at most the vocabulary, 14"]),
    "--threads 1e20": ([*GEN, "--checkpoint", "base.npz", "--threads", "99999999999999999999"],
                       ["argument --threads: expected an integer ≥ 1 and at most"]),
    "--threads 100000": ([*GEN, "--checkpoint", "base.npz", "--threads", "100000"],
                         ["argument --threads:"]),
    "finetune --beta 1e300": ([*FT, "--beta", "1e300"], ["argument --beta: expected a number > 0 "
                                                         "and at most 100"]),
    "finetune --lora-alpha 1e30": ([*FT, "--lora", "2", "--lora-alpha", "1e30"],
                                   ["argument --lora-alpha:"]),
    "generate --temperature 1e-310": ([*GEN, "--checkpoint", "base.npz", "--temperature",
                                       "1e-310"], ["argument --temperature: expected a finite number "
                                                   "≥ 0: 0 (greedy) or a temperature ≥ 1e-30"]),
    "generate --temperature 1e-310 --draft": ([*GEN, "--checkpoint", "base.npz", "--draft",
                                               "int8.npz", "--temperature", "1e-310"],
                                              ["argument --temperature:"]),
    "run --temperatures 1e-310": ([*RUN, *T, "--temperatures", "1,1e-310"],
                                  ["argument --temperatures:", "1e-30"]),
    "scaling-sweep --seeds -1": (["scaling-sweep", "--plan-only", "--seeds", "-1"],
                                 ["argument --seeds: expected an integer ≥ 0"]),
}


@pytest.mark.parametrize("name", sorted(RANGES))
def test_a_range_the_work_cannot_hold_is_a_usage_error(name, work):
    argv, parts = RANGES[name]
    refused(argv, work, parts)


def test_tformer_num_threads_beyond_the_bound_is_a_usage_error(work, monkeypatch):
    monkeypatch.setenv("TFORMER_NUM_THREADS", "99999999999")
    refused([*GEN, "--checkpoint", "base.npz"], work,
            ["TFORMER_NUM_THREADS: expected an integer ≥ 1 and at most"])


def test_a_config_that_claims_more_than_its_arrays_is_refused_before_a_model_is_built(work):
    """Finding 16: n_layers 200,000 beside one block, refused in well under a second."""
    import json
    import time

    from tformer.training.checkpoint import read_npz, write_npz
    meta, arrays = read_npz(os.path.join(work, "base.npz"))
    for name, change in (("layers.npz", {"n_layers": 200_000}), ("wide.npz", {"d_ff": 10 ** 9})):
        bad = dict(meta, config=dict(meta["config"], **change))
        write_npz(os.path.join(work, name), {**arrays, "meta": np.array(json.dumps(bad))})
        for argv in ([*GEN, "--checkpoint", name], ["quantize", name, "--out", "new.npz", *Q]):
            t0 = time.perf_counter()
            last = refused(argv, work, ["its config claims"])
            assert time.perf_counter() - t0 < 5 and len(last) < 400


PLANS = {"plan {}": {"plan": {}}, "a list": [1, 2], "negative steps": {"steps": -5},
         "vocab 100": {"vocab_size": 100}, "heads do not divide": {"shape": [1, 100]},
         "interval of text": "interval"}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_a_malformed_plan_is_a_usage_error_before_training(name, work):
    """Finding 7: ``long-run --out`` a malformed plan."""
    import json
    plan = dict(shape=[2, 8], vocab_size=256, block_size=8, batch_size=2, seed=0, lr=1e-3,
                steps=2, flops=1.0)
    pred = dict(plan=plan, predicted_nats_per_char=3.0, predicted_interval=[2.5, 3.5])
    change = PLANS[name]
    if change == "interval":
        pred["predicted_interval"] = "2.5 to 3.5"
    elif isinstance(change, list):
        pred = change
    elif "plan" in change:
        pred.update(change)
    else:
        plan.update(change)
    with open(os.path.join(work, "plan.json"), "w") as f:
        json.dump(pred, f)
    refused([*LONG, "--out", "plan.json", "--ship", ""], work, ["--out: expected a long-run "
                                                                "prediction"])


def test_scaling_sweep_resumes_no_run_without_its_key(tmp_path):
    """Finding 11: a result file whose run lacks ``key``."""
    import json

    from tformer.experiments.scaling_sweep import load_previous
    from tformer.runs.flags import UsageError
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"runs": [{"budget": 1}]}))
    with pytest.raises(UsageError, match="--out: expected a scaling-sweep result .* without its key"):
        load_previous(str(path), {})


def test_an_output_symlink_stays_a_symlink(work):
    """Finding 21: the file a symlink ``--out`` points to is replaced, the link kept."""
    os.symlink("new.npz", os.path.join(work, "link.npz"))
    code, _, err = cli_hostile.run(["quantize", "base.npz", "--out", "link.npz", *Q], work)
    assert code == 0, err
    assert os.path.islink(os.path.join(work, "link.npz"))
    assert os.path.isfile(os.path.join(work, "new.npz"))
    assert not [n for n in os.listdir(work) if n.startswith(".tmp-")]


@pytest.mark.parametrize("checkpoint", ["int8.npz", "random.bin", "lora.adapter.npz", "base.npz"])
def test_long_run_resumes_no_checkpoint_of_another_kind_or_model(checkpoint, work):
    """Finding 9: ``long-run --resume`` from an int8, a non-npz, another model's checkpoint."""
    import json
    plan = dict(shape=[2, 8], vocab_size=256, block_size=8, batch_size=2, seed=0, lr=1e-3,
                steps=2, flops=1.0)
    with open(os.path.join(work, "plan.json"), "w") as f:
        json.dump(dict(plan=plan, predicted_nats_per_char=3.0, predicted_interval=[2.5, 3.5]), f)
    refused([*LONG, "--out", "plan.json", "--checkpoint", checkpoint, "--resume", "--ship", ""],
            work, ["--checkpoint: expected a checkpoint of this plan's run to --resume"])


# Issue 53, finding 20's rest: a flag that does nothing in the mode the command line chose is a
# usage error naming the flag and the mode (``unused_flags(args)`` of each command).
GREEDY = [*GEN, "--checkpoint", "base.npz", "--temperature", "0"]
TRANSFORMER_FIXED = TRANSFORMER                                   # --batching fixed, fp32
SOFTMAX = ["online-softmax", "--out", "new.json"]
MEMORY = ["memory", "--out", "new.json"]
BENCH = ["bench", "--out", "new.json"]
UNUSED = {
    **{f"generate --temperature 0 {flag}": ([*GREEDY, flag, value],
                                            [f"{flag}: does nothing with greedy decoding "
                                             f"(--temperature 0"])
       for flag, value in (("--top-k", "3"), ("--top-p", "0.5"), ("--min-p", "0.1"),
                           ("--seed", "7"))},
    "generate --temperature 0 --draft --seed": ([*GREEDY, "--draft", "int8.npz", "--seed", "3"],
                                                ["--seed: does nothing with greedy decoding"]),
    "run tinygpt --init-scale with fp32": ([*RUN, *T, "--init-scale", "1024"],
                                           ["--init-scale: does nothing with --precision fp32"]),
    "run tinygpt --init-scale with bf16": ([*RUN, *T, "--precision", "bf16", "--init-scale", "8"],
                                           ["--init-scale: does nothing with --precision bf16"]),
    "run tinygpt --blocks-per-segment": ([*RUN, *T, "--blocks-per-segment", "2"],
                                         ["--blocks-per-segment: does nothing without "
                                          "--gradient-checkpointing"]),
    "run tinygpt --prompt without samples": ([*RUN, *T, "--sample-tokens", "0", "--prompt", "x"],
                                             ["--prompt: does nothing without samples"]),
    "run tinygpt --base with another shape": ([*RUN, *T, "--base", "base.npz", "--n-layers", "2",
                                               "--checkpoint", "new.npz"],
                                              ["--n-layers: does nothing with --base (the model's "
                                               "shape is the base's, n_layers = 1)"]),
    "run transformer --max-tokens with fixed": ([*TRANSFORMER_FIXED, "--max-tokens", "64"],
                                                ["--max-tokens: does nothing with --batching fixed"]),
    "run transformer --pool-size with sorted": ([*TRANSFORMER, "--batching", "sorted",
                                                 "--pool-size", "8"],
                                                ["--pool-size: does nothing with --batching sorted"]),
    "run transformer --init-scale": ([*TRANSFORMER, "--init-scale", "8"],
                                     ["--init-scale: does nothing with --precision fp32"]),
    "run transformer --blocks-per-segment": ([*TRANSFORMER, "--blocks-per-segment", "2"],
                                             ["--blocks-per-segment: does nothing without"]),
    "run transformer2 --d-ff with --no-mlp": (["run", "transformer2", "--no-mlp", "--d-ff", "8",
                                               "--steps", "1"],
                                              ["--d-ff: does nothing with --no-mlp"]),
    **{f"long-run --predict {flag}": ([*LONG, "--predict", "--out", "new.json", flag, value],
                                      [f"{flag}: does nothing with --predict"])
       for flag, value in (("--ship", "m.npz"), ("--checkpoint", "c.npz"),
                           ("--eval-every", "7"), ("--checkpoint-every", "7"))},
    "online-softmax --tile-T without tiles": ([*SOFTMAX, "--parts", "sweep", "--tile-T", "64"],
                                              ["--tile-T: does nothing without the tile sweep"]),
    "online-softmax --lengths without sweep": ([*SOFTMAX, "--parts", "tiles", "--lengths", "64"],
                                               ["--lengths: does nothing without the sweep"]),
    "memory --chunk without batching": ([*MEMORY, "--parts", "memory", "--chunk", "3"],
                                        ["--chunk: does nothing without --parts batching"]),
    "memory --batching-steps with --quick": ([*MEMORY, "--quick", "--batching-steps", "9"],
                                             ["--batching-steps: does nothing with --quick"]),
    "memory --reps without memory or overhead": ([*MEMORY, "--parts", "grad_norms", "--reps", "2"],
                                                 ["--reps: does nothing without --parts memory "
                                                  "or overhead"]),
    "memory --grad-norm-steps without grad_norms": ([*MEMORY, "--parts", "batching",
                                                     "--grad-norm-steps", "9"],
                                                    ["--grad-norm-steps: does nothing without"]),
    "ablate --high-lr with --only gqa": (["ablate", "--only", "gqa", "--high-lr", "0.1"],
                                         ["--high-lr: does nothing with --only 'gqa'"]),
    "ablate --n-kv-heads with --only rope": (["ablate", "--only", "rope", "--n-kv-heads", "1"],
                                             ["--n-kv-heads: does nothing with --only 'rope'"]),
    "scaling-sweep --plan-only --out": (["scaling-sweep", "--plan-only", "--out", "new.json"],
                                        ["--out: does nothing with --plan-only"]),
    "bench --gen-new without generation": ([*BENCH, "--gen-batches", "", "--gen-new", "8"],
                                           ["--gen-new: does nothing without generation"]),
    "bench --steps without training": ([*BENCH, "--sizes", "", "--steps", "3"],
                                       ["--steps: does nothing without training"]),
    "many-processes --worker --reps": (["many-processes", "--worker", '{"out": "w.json"}',
                                        "--reps", "3"], ["--reps: does nothing with --worker"]),
}


@pytest.mark.parametrize("name", sorted(UNUSED))
def test_a_flag_that_does_nothing_in_the_chosen_mode_is_a_usage_error(name, work):
    argv, parts = UNUSED[name]
    refused(argv, work, parts)


def test_a_flag_given_at_its_default_or_in_its_mode_is_taken(work):
    """The mode's own flags pass the check (only a flag that would change nothing is refused)."""
    from tformer.__main__ import _check_unused, build_parser
    parser = build_parser()
    for argv in (["generate", "--temperature", "0", "--seed", "0"],             # the default
                 ["generate", "--temperature", "0.5", "--top-k", "3", "--seed", "7"],
                 ["run", "tinygpt", "--precision", "fp16", "--init-scale", "8"],
                 ["run", "tinygpt", "--gradient-checkpointing", "--blocks-per-segment", "2"],
                 ["run", "tinygpt", "--temperatures", "0.7,0.8,1.0"],           # default, as text
                 ["run", "transformer", "--batching", "bucketed", "--pool-size", "8",
                  "--max-tokens", "64"],
                 ["online-softmax", "--parts", "tiles", "--tile-T", "64", "--tile-sizes", "32"],
                 ["memory", "--parts", "batching", "--chunk", "3", "--batching-steps", "9"],
                 ["ablate", "--only", "gqa", "modern", "--n-kv-heads", "1"],
                 ["long-run", "--predict", "--no-progress"],
                 ["bench", "--sizes", "small", "--gen-batches", "", "--steps", "3"]):
        _check_unused(parser, parser.parse_args(argv))                    # no SystemExit


RANGES_53 = {
    "ablate --d-model 0": (["ablate", "--d-model", "0"], ["argument --d-model: expected an "
                                                          "integer ≥ 1"]),
    "ablate --lr 1e308": (["ablate", "--lr", "1e308"], ["argument --lr: expected a finite number"]),
    "ablate --min-lr-ratio 2": (["ablate", "--min-lr-ratio", "2"],
                                ["argument --min-lr-ratio: expected a ratio in [0, 1]"]),
    "ablate --eval-every 0": (["ablate", "--eval-every", "0"], ["argument --eval-every:"]),
    "ablate --d-model 1e5": (["ablate", "--d-model", "100000", "--n-heads", "4"],
                             ["expected a run whose predicted peak", "fits in the"]),
    "ablate --lr 0": (["ablate", "--lr", "0"], ["--lr: expected a positive number"]),
    "online-softmax --lengths 1e6": ([*SOFTMAX, "--lengths", "1000000"],
                                     ["argument --lengths: expected an integer ≥ 1 and at most "
                                      "65,536"]),
    "online-softmax --reps 0": ([*SOFTMAX, "--reps", "0"], ["argument --reps:"]),
    "online-softmax --tile-sizes beyond --tile-T": ([*SOFTMAX, "--tile-sizes", "4096"],
                                                    ["--tile-sizes: expected tiles of at most "
                                                     "--tile-T = 2048"]),
    "many-processes --lengths 5": (["many-processes", "--lengths", "5"],
                                   ["argument --lengths: expected comma-separated integers",
                                    "at least two distinct"]),
    "many-processes --lengths 1e12": (["many-processes", "--lengths", f"1,{cli_hostile.HUGE}"],
                                      ["argument --lengths:"]),
    "many-processes --speed-batch odd": (["many-processes", "--speed-batch", "3"],
                                         ["--speed-batch: expected an even global batch"]),
    "many-processes --speed-batch 1e8": (["many-processes", "--speed-batch", "100000000"],
                                         ["--speed-batch: expected a run whose predicted peak"]),
    "many-processes --reps -1": (["many-processes", "--reps", "-1"], ["argument --reps:"]),
    "many-processes --curve-steps 10": (["many-processes", "--curve-steps", "10"],
                                        ["--curve-steps: expected more than the 15 warm-up"]),
    "bench --gen-new 1e5": ([*BENCH, "--gen-new", "100000"],
                            ["argument --gen-new: expected an integer from 1 to 4,096"]),
    "bench --min-time 1e9": ([*BENCH, "--min-time", "1e9"], ["argument --min-time:"]),
    "bench --rounds 0": ([*BENCH, "--rounds", "0"], ["argument --rounds:"]),
    "bench --gen-batches 1e5": ([*BENCH, "--gen-batches", "1,100000"],
                                ["argument --gen-batches:"]),
    "bench --sizes huge": ([*BENCH, "--sizes", "huge"], ["argument --sizes:"]),
    "bench nothing to measure": ([*BENCH, "--sizes", "", "--gen-batches", ""],
                                 ["--sizes, --gen-batches: expected training sizes or"]),
    "scaling-sweep --budgets 1e300": (["scaling-sweep", "--budgets", "1e300"],
                                      ["argument --budgets: expected FLOPs > 0 and at most 1e+19"]),
    "scaling-sweep --shapes 2x1e5": (["scaling-sweep", "--shapes", "2x100000"],
                                     ["argument --shapes: expected 1 to 32 layers"]),
    "scaling-sweep --lr 1e308": (["scaling-sweep", "--lr", "1e308"], ["argument --lr:"]),
    "memory --batching-lengths 5 1000": ([*MEMORY, "--batching-lengths", "5", "1000"],
                                         ["--batching-lengths: expected MIN ≤ MAX ≤ 256"]),
    "decoding --texts 1e12": (["decoding", "--texts", cli_hostile.HUGE],
                              ["argument --texts: expected an integer from 1 to 4,096"]),
    "decoding --prompts 0": (["decoding", "--prompts", "0"], ["argument --prompts:"]),
    "run attention --lr 1e308": (["run", "attention", "--lr", "1e308"], ["argument --lr:"]),
    "run encoder --lr 1e308": (["run", "encoder", "--lr", "1e308"], ["argument --lr:"]),
    "run tinygpt --weight-decay 1e308": ([*RUN, *T, "--weight-decay", "1e308"],
                                         ["argument --weight-decay: expected a finite number ≥ 0 "
                                          "and at most 10"]),
    "run transformer --length-penalty 1e308": ([*TRANSFORMER, "--length-penalty", "1e308"],
                                               ["argument --length-penalty:"]),
    "run transformer --target 2": ([*TRANSFORMER, "--target", "2"],
                                   ["argument --target: expected a share in [0, 1]"]),
}


@pytest.mark.parametrize("name", sorted(RANGES_53))
def test_every_numeric_flag_has_a_range_the_work_can_hold(name, work):
    argv, parts = RANGES_53[name]
    refused(argv, work, parts)


def test_every_flag_a_command_lists_as_unused_is_one_of_its_own():
    """``unused_flags(args)`` of every command names flags that command has (a typo would be a
    KeyError at the first invocation), whatever mode its default command line chooses."""
    import sys

    from tformer.__main__ import _leaves, build_parser
    top = build_parser()
    least = {"quantize": ["x.npz", "--out", "y.npz"], "finetune": ["--dpo", "p", "--out", "o"]}
    seen = 0
    for leaf in _leaves(top):
        name = leaf.prog.removeprefix("python -m tformer ")
        unused = getattr(sys.modules[leaf.get_default("func").__module__], "unused_flags", None)
        if unused is None:
            continue
        for flag, mode, when in unused(top.parse_args([*name.split(), *least.get(name, [])])):
            assert flag in leaf._option_string_actions, (name, flag)
            assert mode.startswith(("with", "without")), (name, flag, mode)
            seen += 1
    assert seen >= 40
