"""The hostile user of the command line: invocations drawn from the commands' own flag tables with
hostile values and hostile files, each run in a forked child process under a memory cap
(``MEMORY_CAP`` of address space more than the parent maps, ``RLIMIT_AS``) and a time cap
(``TIMEOUT``, then SIGKILL), and what must hold after it.

``fixtures(folder)`` writes the files a user may hand a command: tiny checkpoints of each kind
(float, BPE, LoRA training checkpoint and its adapter, int8, another command's), tokenizers, and
hostile files (empty, truncated, random bytes, a folder, malformed JSON and adapters, NaN weights).
``invocation(pick)`` draws one command line; ``pick(seq)`` chooses one element (hypothesis' draw in
the test, ``random.choice`` in the survey). ``problems(argv, outputs, workdir)`` runs it and returns
what went wrong, one short signature each (empty: all is well):

- the exit status is 0 or 2, never a traceback (an exception escaping ``main``) or a hang;
- a usage error ends stderr with one line ``python -m tformer ...: error: ...``;
- every file that existed before is byte-identical, with its mode, unless it is a declared
  output of a successful run; a failed run leaves no new file; no temporary is left;
- what must be refused is refused (a tokenizer of another run, limits the model sets).

Every command of ``python -m tformer --help`` is drawn (issue 53): the first five with their own
scenarios, the four small systems for real at tiny sizes, the experiments with their ``main``
replaced by a stub (``DRY``: their work takes minutes to hours), so that what is drawn is all that
runs before it; ``long-run``, ``decoding``, ``preference`` and ``scaling-sweep`` run their real
``main`` up to its first long step (``DEEPER``: the plan, checkpoint, target or shipped model they
read). Each working folder (``work``) also holds a FIFO, symlinks and the repository's
``book/data`` files, small; the outputs of the other commands are what they declare
(``declared_writes``, ``tformer.runs.declare``): a write outside it is a problem.

``python tests/cli_hostile.py N [SEED]`` surveys N random invocations and prints the distinct
problems (on fc00056, before issue 40: 46 distinct in 1500 invocations of seed 0; on d2521ce,
before issue 53, with this drawer: 9 distinct, 118 reports in 3000 of seed 0; after: none; on
1cc13f8, with the caps, ``DEEPER`` and the bounded flags (``BOUNDED``): 11 distinct, 42 reports
in 3000 of seed 0; after: none).
"""
import contextlib
import io
import json
import os
import random
import shutil
import signal
import stat
import sys
import traceback

import numpy as np

WORDS = ["def", "return", "self", "value", "for", "in", "range", "if", "else", "print", "x", "y"]
SIZES = ["--d-model", "8", "--n-heads", "2", "--n-layers", "1", "--max-len", "8"]
RUN = ["run", "tinygpt", *SIZES, "--batch-size", "2", "--eval-windows", "2", "--eval-every", "0",
       "--sample-tokens", "2", "--temperatures", "1", "--no-progress", "--warmup", "0",
       "--steps", "1", "--threads", "1"]
BPE_COMPARE = ["bpe-compare", *SIZES, "--vocab-sizes", "256", "260", "--seeds", "0",
               "--batch-size", "2", "--steps", "2", "--warmup", "1", "--eval-every", "1",
               "--eval-windows", "2", "--no-progress", "--threads", "1"]
# Files a user may name, relative to the working folder (see ``fixtures``), and paths that do not
# exist yet (a new output), lie under a file, or lie where nothing may be written.
FILES = ["corpus.txt", "other.txt", "base.npz", "bpe.npz", "bpe.tokenizer.json",
         "other.tokenizer.json", "lora.npz", "lora.adapter.npz", "int8.npz", "transformer.npz",
         "result.json", "empty.bin", "truncated.npz", "random.bin", "folder", "nan.npz",
         "nan.adapter.npz", "huge.adapter.npz", "nolayers.adapter.npz", "nofp.adapter.npz",
         "tok-nomerges.json", "tok-badpattern.json", "tok-ints.json", "tok-deep.json",
         "pairs.jsonl", "bad.pairs.jsonl"]
NEW = ["new.npz", "new2.npz", "out/new.json", "new.csv", "missing.npz", "corpus.txt/under.npz",
       "/proc/tformer-hostile.npz", "nope/../new.json"]
# Made in each working folder by ``work`` (a FIFO cannot be copied): a FIFO, a symlink to a file,
# a symlink to nothing.
SPECIAL = ["fifo", "link.npz", "dangling.json"]
PATHS = FILES + NEW + SPECIAL + ["book/data/long_run_w8.npz", "book/data/long_run.json",
                                 "book/data/long_run_tokenizer.json", "book/data/preference.json",
                                 "book/data/shakespeare.json"]
NUMBERS = ["0", "-1", "1", "2", "3", "abc", "", "nan", "inf", "1.5", "-0.5", "1e-3"]
HUGE = "1000000000000"
# Flags whose huge values a command must refuse (a limit from the model, the corpus or the
# output); a huge value of any other (--steps) is a long run, not a hostile one.
LIMITED = {"--bpe", "--lora", "--max-new-tokens", "--sample-tokens", "--d-model", "--max-len",
           "--batch-size", "--n-layers", "--d-ff", "--top-k", "--gen-tokens", "--vocab-sizes",
           "--eval-windows", "--n-heads", "--lora-alpha"}
# Flags with a bound at parse time (issue 53): a huge value is refused by every command.
BOUNDED = {"--lr", "--high-lr", "--weight-decay", "--length-penalty", "--budgets", "--lengths",
           "--tile-T", "--tile-sizes", "--texts", "--prompts", "--gen-new", "--gen-prompt",
           "--min-time", "--speed-batch", "--max-new-tokens", "--sample-tokens", "--gen-tokens",
           "--bpe", "--lora"}
LIMITED |= BOUNDED
TEXT_VALUES = {"--temperatures": ["1", "abc", "nan", "-1", "", "0.5,1", ",", "inf"],
               "--lora-targets": ["attn", "all", "wq", "", ",", "mlp,o"],
               "--prompt": ["def ", "", "\udcff", "x" * 40]}
# The tokens each model checkpoint of ``fixtures`` reads (a --draft must read the target's).
TOKENS = {"base.npz": "bytes", "int8.npz": "bytes", "lora.npz": "bytes", "bpe.npz": "bpe"}
SKIP = {"-h", "--help", "--threads", "--no-progress", "--corpus"}
TIMEOUT = 20
# The other commands of ``python -m tformer --help``. The systems run for real at tiny sizes; the
# experiments' work takes minutes to hours, so their ``main`` is replaced by a stub that writes
# nothing (``DRY``): what is drawn is everything before it (the flags, the declared files, the
# files' content that ``check_args`` reads).
SYSTEMS = {
    "run attention": ["--d-model", "4", "--seq-len", "4", "--batch-size", "2", "--steps", "2",
                      "--eval-batches", "1"],
    "run transformer2": ["--d-model", "4", "--seq-len", "4", "--batch-size", "2", "--steps", "2",
                         "--eval-batches", "1"],
    "run encoder": ["--n-train", "8", "--n-test", "4", "--batch-size", "4", "--d-model", "8",
                    "--d-ff", "8", "--seq-len", "4", "--n-layers", "1", "--n-heads", "2",
                    "--steps", "2", "--no-progress"],
    "run transformer": ["--d-model", "8", "--n-heads", "2", "--n-layers", "1", "--d-ff", "8",
                        "--max-len", "3", "--batch-size", "4", "--eval-every", "0", "--eval-size",
                        "4", "--beam-width", "1", "--target", "0", "--no-progress", "--warmup",
                        "1", "--steps", "2"],
}
DRY = ["many-processes", "fewer-bits", "online-softmax", "ablate", "memory", "shakespeare", "lora",
       "scaling-sweep", "long-run", "decoding", "preference", "bench", "rl", "speedrun"]
# Flags of those commands whose value is text, not a path.
NOT_PATHS = {"--lora-targets", "--lengths", "--sizes", "--gen-batches", "--worker"}


def work(pristine, folder):
    """A working copy of the fixtures in ``folder``, with ``SPECIAL``'s files made there."""
    shutil.copytree(pristine, folder)
    os.mkfifo(os.path.join(folder, "fifo"))
    os.symlink("base.npz", os.path.join(folder, "link.npz"))
    os.symlink("nothing-here.json", os.path.join(folder, "dangling.json"))
    data = os.path.join(folder, "book", "data")            # the repository's files, small
    os.makedirs(data)
    shutil.copy(os.path.join(folder, "int8.npz"), os.path.join(data, "long_run_w8.npz"))
    shutil.copy(os.path.join(folder, "bpe.tokenizer.json"), os.path.join(data,
                                                                      "long_run_tokenizer.json"))
    with open(os.path.join(data, "long_run.json"), "w") as f:
        json.dump({"plan": {"shape": [2, 8], "vocab_size": 256, "block_size": 8, "batch_size": 2,
                            "seed": 0, "lr": 1e-3, "steps": 2, "flops": 1.0},
                   "predicted_nats_per_char": 3.0, "predicted_interval": [2.5, 3.5]}, f)
    # what ``rl`` and ``speedrun`` read before their work: DPO's chosen rates and KL, the recipe's
    # loss (without them every drawn call of theirs stops at the same usage error)
    dpo = {"lr": 1e-3, "kl_per_line": [1.0, 0.5, 1.5]}
    with open(os.path.join(data, "preference.json"), "w") as f:
        json.dump({"methods": {"dpo-lora": dpo, "dpo-full": dpo}}, f)
    with open(os.path.join(data, "shakespeare.json"), "w") as f:
        json.dump({"summary": {"val_nats_mean": 1.76}}, f)
    return folder


def _path_flags(command):
    return sorted(f for f, a in table(command).items() if a.type is None and a.nargs in (None, "?")
                  and not a.choices and a.const is None and f not in NOT_PATHS)


def declared_writes(argv):
    """The files ``argv`` declares it writes (``files(args)`` of its command), relative paths
    as given and as resolved; empty if ``argv`` does not parse."""
    from tformer.__main__ import build_parser
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = build_parser().parse_args(argv)
        module = sys.modules[args.func.__module__]
        declared = module.files(args)
    except (SystemExit, ValueError, AttributeError):        # AttributeError: no files(args)
        return set()
    return {os.path.normpath(d.path) for d in declared if d.path and d.written}


def _run(argv):
    from tformer.__main__ import main
    return main(argv)


def fixtures(folder):
    """Write every file of ``FILES`` into ``folder`` (mode 0644); returns ``folder``."""
    os.makedirs(folder, exist_ok=True)
    here = os.getcwd()
    os.chdir(folder)
    try:
        _fixtures()
    finally:
        os.chdir(here)
    for name in FILES:
        os.chmod(os.path.join(folder, name), 0o755 if name == "folder" else 0o644)
    return folder


def _quiet(argv):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = _run(argv)
    assert code == 0, argv


def _fixtures():
    from tformer.training.checkpoint import read_npz, write_npz
    rng = random.Random(0)
    for name, seed in (("corpus.txt", 0), ("other.txt", 1)):
        r = random.Random(seed)
        words = WORDS if seed == 0 else [w[::-1] + "q" for w in WORDS]
        with open(name, "w") as f:
            f.write("\n".join(" ".join(r.choice(words) for _ in range(6)) for _ in range(120)))
    corpus = os.path.abspath("corpus.txt")
    _quiet([*RUN, "--text", corpus, "--checkpoint", "base.npz"])
    _quiet([*RUN, "--text", corpus, "--checkpoint", "bpe.npz", "--bpe", "300"])
    from tformer.data.bpe import BPETokenizer                   # another tokenizer of bpe.npz's size
    size = BPETokenizer.load("bpe.tokenizer.json").vocab_size
    with open("other.txt", "rb") as f:
        other = f.read()
    tok = next(t for t in (BPETokenizer.train(other, v) for v in range(size, size + 64))
               if t.vocab_size == size)
    tok.save("other.tokenizer.json")
    _quiet([*RUN, "--text", corpus, "--checkpoint", "lora.npz", "--base", "base.npz",
            "--lora", "2"])
    _quiet(["quantize", "base.npz", "--out", "int8.npz", "--eval-windows", "2",
            "--gen-tokens", "2"])
    _quiet(["run", "transformer", "--d-model", "8", "--n-heads", "2", "--n-layers", "1",
            "--d-ff", "8", "--max-len", "3", "--batch-size", "4", "--eval-every", "0",
            "--eval-size", "4", "--beam-width", "1", "--target", "0", "--no-progress",
            "--warmup", "1", "--steps", "2", "--checkpoint", "transformer.npz"])
    _quiet([*BPE_COMPARE, "--text", corpus, "--out", "result.json"])
    open("empty.bin", "wb").close()
    with open("base.npz", "rb") as f:
        whole = f.read()
    with open("truncated.npz", "wb") as f:
        f.write(whole[: len(whole) // 2])
    with open("random.bin", "wb") as f:
        f.write(bytes(rng.randrange(256) for _ in range(4096)))
    os.makedirs("folder", exist_ok=True)
    meta, arrays = read_npz("base.npz")
    first = next(k for k in arrays if k.startswith("model/"))
    write_npz("nan.npz", {**arrays, first: np.full_like(arrays[first], np.nan),
                          "meta": np.array(json.dumps(meta))})
    meta, arrays = read_npz("lora.adapter.npz")
    first = next(iter(arrays))
    for name, value in (("nan", np.nan), ("huge", 1e30)):
        write_npz(f"{name}.adapter.npz", {**arrays, first: np.full_like(arrays[first], value),
                                          "meta": np.array(json.dumps(meta))})
    for name, key in (("nolayers", "layers"), ("nofp", "base_fingerprint")):
        write_npz(f"{name}.adapter.npz", {**arrays, "meta": np.array(json.dumps(
            {k: v for k, v in meta.items() if k != key}))})
    with open("bpe.tokenizer.json") as f:
        tok = json.load(f)
    bad = {"tok-nomerges.json": {k: v for k, v in tok.items() if k != "merges"},
           "tok-badpattern.json": {**tok, "pattern": "("},
           "tok-ints.json": {**tok, "merges": 5}}
    for name, data in bad.items():
        with open(name, "w") as f:
            json.dump(data, f)
    pairs = [{"prompt": "def ", "chosen": "x", "rejected": "y"},
             {"prompt": "if ", "chosen": "in", "rejected": "for"}]
    with open("pairs.jsonl", "w") as f:
        f.write("".join(json.dumps(p) + "\n" for p in pairs))
    with open("bad.pairs.jsonl", "w") as f:
        f.write(json.dumps(pairs[0]) + "\n" + '{"prompt": "x", "chosen": 3}\n')
    with open("tok-deep.json", "w") as f:
        f.write('{"format": "tformer-bpe", "version": 1, "merges": ' + "[" * 100_000
                + "]" * 100_000 + "}")


def _value(flag, action, pick, argv):
    """A hostile or ordinary value for ``flag`` of parser action ``action``."""
    if flag in TEXT_VALUES:
        return pick(TEXT_VALUES[flag])
    if action.choices:
        return pick([*map(str, action.choices), "bogus"])
    if action.type is None and (action.metavar in ("FILE", "CHECKPOINT") or flag in
                                ("--checkpoint", "--out", "--text", "--log")):
        return path(pick, argv)
    return pick(NUMBERS + ([HUGE] * 2 if flag in LIMITED else []))


def _table(command):
    """``{flag: action}`` of the command's parser (``command`` as in ``python -m tformer ...``)."""
    from tformer.__main__ import _leaves, build_parser
    prog = "python -m tformer " + command
    parser = next(p for p in _leaves(build_parser()) if p.prog == prog)
    return {s: a for a in parser._actions for s in a.option_strings if s not in SKIP}


_TABLES = {}


def table(command):
    if command not in _TABLES:
        _TABLES[command] = _table(command)
    return _TABLES[command]


def _flag(argv, flag, default=None):
    """The value the last ``flag`` of ``argv`` gives (argparse's rule), else ``default``."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    return values[-1] if values else default


def _drawn_flags(command, pick, argv, n):
    """``n`` flags of the command's table with drawn values, appended to ``argv``."""
    flags = table(command)
    names = sorted(flags)
    for _ in range(n):
        flag = pick(names)
        action = flags[flag]
        argv.append(flag)
        if action.nargs == 0:
            continue
        argv.append(_value(flag, action, pick, argv))
        if action.nargs == "+" and pick([False, True]):
            argv.append(_value(flag, action, pick, argv))


def path(pick, argv, *likely):
    """A path for a flag: one of ``likely`` (weighted), one given to another flag of ``argv``,
    or any of ``PATHS``."""
    used = [a for a in argv if a in PATHS]
    return pick([*likely * 3, *used * 2, *PATHS])


# The commands drawn first (``others``: the four small systems and the experiments), weighted;
# and two parts of them of about equal cost (the CI test draws each part in its own process).
DRAWN = ["run tinygpt"] * 5 + ["generate"] * 2 + ["quantize", "bpe-compare", "finetune"] \
    + ["others"] * 3
PARTS = ({"run tinygpt", "quantize", "finetune"}, {"generate", "bpe-compare", "others"})


def invocation(pick, part=None):
    """``(argv, outputs)``: one command line, and the files it may write if it succeeds;
    ``part``: drawn from ``PARTS[part]`` only."""
    command = pick([c for c in DRAWN if part is None or c in PARTS[part]])
    if command == "others":
        command = pick(sorted(SYSTEMS) + DRY)
        argv = [*command.split(), *SYSTEMS.get(command, [])]
        for flag in _path_flags(command):
            if pick([True, False]):
                argv += [flag, path(pick, argv, "new.json")]
        _drawn_flags(command, pick, argv, pick([0, 1, 2]))
        argv += ["--threads", "1"]
        return argv, declared_writes(argv)
    if command == "run tinygpt":
        argv = [*RUN, "--text", pick(["corpus.txt"] * 6 + PATHS)]
        argv += ["--checkpoint", path(pick, argv, "new.npz")]
        scenario = pick(["bpe", "lora", "resume", "none"])
        if scenario == "bpe":
            argv += ["--bpe", pick(["300", "260", "256", "0", HUGE])]
            if pick([True, False]):
                argv += ["--tokenizer", path(pick, argv, "new.json")]
        elif scenario == "lora":
            argv += ["--base", path(pick, argv, "base.npz"), "--lora", pick(["2", "1", "0", HUGE])]
            if pick([True, False]):
                argv += ["--adapter", path(pick, argv, "new2.npz")]
        elif scenario == "resume":
            argv += ["--resume", "--checkpoint", path(pick, argv, "base.npz", "bpe.npz", "lora.npz")]
            if pick([True, False]):
                argv += pick([["--bpe", "300"], ["--bpe", "280"], ["--tokenizer", "bpe.tokenizer.json"],
                              ["--base", "base.npz", "--lora", "2"], ["--d-model", "16"]])
    elif command == "generate":
        argv = ["generate", "--checkpoint", pick(["base.npz", "bpe.npz", "int8.npz"] + PATHS),
                "--max-new-tokens", "3", "--threads", "1"]
        if pick([True, False]):
            argv += ["--tokenizer", pick(["bpe.tokenizer.json", "other.tokenizer.json"] + PATHS)]
        if pick([True, False, False]):
            argv += ["--checkpoint", "base.npz", "--adapter",
                     pick(["lora.adapter.npz"] * 2 + PATHS)]
        if pick([True, False, False]):
            argv += ["--draft", pick(["base.npz", "int8.npz", "bpe.npz"] + PATHS)]
    elif command == "quantize":
        argv = ["quantize", pick(["base.npz"] * 3 + PATHS), "--eval-windows", "2", "--gen-tokens",
                "2", "--threads", "1"]
        argv += ["--out", path(pick, argv, "new.npz")]
    elif command == "finetune":
        argv = ["finetune", pick(["--dpo", "--sft"]), pick(["pairs.jsonl"] * 3 + PATHS),
                "--checkpoint", pick(["base.npz", "int8.npz", "bpe.npz"] + PATHS),
                "--steps", "2", "--batch-pairs", "2", "--threads", "1"]
        if pick([True, False]):
            argv += ["--tokenizer", pick(["bpe.tokenizer.json", "other.tokenizer.json"] + PATHS)]
        argv += ["--out", path(pick, argv, "new.npz")]
    else:
        argv = [*BPE_COMPARE, "--text", pick(["corpus.txt"] * 3 + PATHS)]
        argv += ["--out", path(pick, argv, "new.json")]
    _drawn_flags(command, pick, argv, pick([0, 1, 1, 2, 3]))
    return argv, declared_outputs(command, argv) - declared_inputs(argv)


def declared_outputs(command, argv):
    """The files ``argv`` says it writes (checkpoint, adapter, tokenizer, log, --out)."""
    if command == "generate":
        return set()
    if command in ("quantize", "finetune"):
        return {_flag(argv, "--out")}
    if command == "bpe-compare":
        return {_flag(argv, "--out", "book/data/bpe.json")}
    ckpt = _flag(argv, "--checkpoint", "checkpoints/tinygpt.npz")
    lora = "--lora" in argv and "--base" in argv
    if lora and ckpt == "checkpoints/tinygpt.npz":
        ckpt = "checkpoints/tinygpt-lora.npz"
    out = {ckpt, _flag(argv, "--log")}
    if lora:
        out.add(_flag(argv, "--adapter", os.path.splitext(ckpt)[0] + ".adapter.npz"))
    if "--bpe" in argv:
        out.add(_flag(argv, "--tokenizer", os.path.splitext(ckpt)[0] + ".tokenizer.json"))
    return {os.path.normpath(p) for p in out if p}


def declared_inputs(argv):
    """The files ``argv`` reads and must leave as they are (``--resume``'s checkpoint is read
    and then replaced: not one of them)."""
    flags = ["--text", "--base", "--adapter", "--checkpoint", "--tokenizer", "--dpo", "--sft"]
    if argv[0] == "run":
        flags = ["--text", "--base"] + ([] if "--bpe" in argv else ["--tokenizer"])
    paths = {_flag(argv, f) for f in flags}
    if argv[0] == "quantize":
        paths.add(argv[1])
    return {os.path.normpath(p) for p in paths if p}


def must_refuse(argv):
    """Why ``argv`` must be refused although every file in it is well formed, or None."""
    command = " ".join(argv[:2]) if argv[0] == "run" else argv[0]
    if command in ("generate", "finetune") and _flag(argv, "--tokenizer") == \
            "other.tokenizer.json" and _flag(argv, "--checkpoint") == "bpe.npz":
        return "a tokenizer of another run with the same vocabulary"
    if command == "generate":
        target, draft = (TOKENS.get(_flag(argv, f)) for f in ("--checkpoint", "--draft"))
        if target and draft and target != draft:
            return "a draft of another vocabulary"
    if command == "run tinygpt" and "--lora-targets" in argv and "--lora" not in argv:
        return "--lora-targets without --lora"
    for flag in sorted(BOUNDED):
        if _flag(argv, flag) == HUGE:
            return f"{flag} {HUGE}"
    if "--vocab-sizes" in argv:
        rest = argv[len(argv) - argv[::-1].index("--vocab-sizes"):]
        values = rest[:next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))]
        if HUGE in values:
            return f"--vocab-sizes {HUGE}"
    return None


def snapshot(folder):
    """``{relative path: (bytes, mode)}`` of every file under ``folder``."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):                  # a symlink: where it points
                out[os.path.relpath(path, folder)] = (f"-> {os.readlink(path)}".encode(), 0)
            elif not stat.S_ISREG(st.st_mode):             # a FIFO: never opened (it would block)
                out[os.path.relpath(path, folder)] = (b"", st.st_mode)
            else:
                with open(path, "rb") as f:
                    out[os.path.relpath(path, folder)] = (f.read(), st.st_mode & 0o7777)
    return out


class Hang(Exception):
    pass


class ChildError(Exception):
    """An exception that escaped ``main`` in the child process: its type, where it was raised
    (``_where``) and its message; or the signal that ended the child."""

    def __init__(self, kind, where, message):
        super().__init__(f"{kind} in {where}: {message}")
        self.kind, self.where, self.message = kind, where, message


class _Stop(BaseException):
    """Raised by a stubbed step of an experiment's ``main`` (``DEEPER``): the dry run ends
    there, exit status 0."""


def _alarm(signum, frame):
    raise Hang


# The experiments whose ``main`` runs for real up to its first long step, which raises ``_Stop``
# (a dry run one step further than ``DRY``'s stub: the plan and checkpoint ``long-run`` reads, the
# target ``decoding`` loads, the shipped model ``preference`` loads, the setup ``scaling-sweep``
# checks). The others' ``main`` is the stub.
DEEPER = {"long-run": ["prepare", "predict_plan"], "decoding": ["ensure_drafts"],
          "preference": ["texts"], "scaling-sweep": ["prepare"]}


@contextlib.contextmanager
def _dry(argv):
    """With a command of ``DRY``: its module's ``main`` replaced by a stub that writes nothing,
    or (``DEEPER``) its first long step replaced by one that stops the run."""
    from tformer.__main__ import COMMANDS
    if not argv or argv[0] not in DRY:
        yield
        return
    import importlib
    module = importlib.import_module(COMMANDS[argv[0]][0])
    names = ["main"] if argv[0] not in DEEPER else DEEPER[argv[0]]
    real = {name: getattr(module, name) for name in names}

    def stub(args):
        return 0

    def stop(*a, **k):
        raise _Stop
    stub.__module__ = module.__name__              # its files and checks are the module's
    for name in names:
        setattr(module, name, stub if name == "main" else stop)
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(module, name, fn)


# Each invocation runs in a child process (forked: the modules are imported once), under a memory
# cap (address space: MEMORY_CAP more than the parent maps) and the time cap TIMEOUT.
MEMORY_CAP = 4 << 30


def _mapped_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _child(argv, workdir, dry, w):
    """In the forked child: run ``argv`` under the caps, write the outcome to pipe ``w``."""
    import resource
    limit = _mapped_bytes() + MEMORY_CAP
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out, err = io.StringIO(), io.StringIO()
    os.chdir(workdir)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _dry(argv if dry else []):
            code = _run(argv)
        code = {"code": code}
    except SystemExit as e:
        code = {"code": e.code if isinstance(e.code, (int, type(None))) else str(e.code)}
    except _Stop:
        code = {"code": 0}
    except Hang:
        code = {"hang": True}
    except BaseException as e:                   # noqa: BLE001  (what the user would see)
        code = {"error": [type(e).__name__, _where(e), str(e)[:300]]}
    signal.alarm(0)
    data = json.dumps(dict(code, out=out.getvalue(), err=err.getvalue())).encode()
    while data:
        data = data[os.write(w, data):]


def run(argv, workdir, dry=False):
    """``(exit status, a ``Hang`` or a ``ChildError``; stdout, stderr)`` of ``argv`` run in
    ``workdir`` in a child process under the caps; ``dry``: a command of ``DRY`` runs everything
    but its ``main`` (or, ``DEEPER``, but its first long step)."""
    import select
    import time
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                          # the child: never returns
        status = 0
        try:
            os.close(r)
            _child(argv, workdir, dry, w)
        except BaseException:                            # noqa: BLE001
            status = 70
        finally:
            os._exit(status)
    os.close(w)
    chunks, deadline = [], time.monotonic() + TIMEOUT + 10
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)               # past the cap: the child is stuck
                os.waitpid(pid, 0)
                return Hang(), "", ""
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        why = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit status {os.waitstatus_to_exitcode(status)}")
        return ChildError("died", "the child process", why), "", ""
    res = json.loads(b"".join(chunks))
    if res.get("hang"):
        code = Hang()
    elif "error" in res:
        code = ChildError(*res["error"])
    else:
        code = res["code"]
    return code, res["out"], res["err"]


def _where(exc):
    """The innermost frame of tformer's code that the exception passed through."""
    if isinstance(exc, ChildError):
        return exc.where
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/tformer/" in f.filename]
    f = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    return f"{os.path.basename(f.filename)}:{f.name}"


def _given_as(argv, rel):
    """The flags of ``argv`` that name the file ``rel``."""
    flags = [argv[i] for i in range(len(argv) - 1) if argv[i].startswith("--")
             and os.path.normpath(argv[i + 1]) == rel]
    if argv[0] == "quantize" and os.path.normpath(argv[1]) == rel:
        flags.append("CHECKPOINT")
    return "/".join(sorted(set(flags))) or "no flag"


def problems(argv, outputs, workdir):
    """What went wrong when ``argv`` ran in ``workdir`` (a list of short signatures)."""
    outputs = set(outputs) | {os.path.relpath(os.path.realpath(os.path.join(workdir, o)),
                                              os.path.realpath(workdir)) for o in outputs}
    before = snapshot(workdir)
    code, _, err = run(argv, workdir, dry=True)
    after = snapshot(workdir)
    found = []
    if isinstance(code, Hang):
        found.append(f"hang (> {TIMEOUT} s)")
    elif isinstance(code, BaseException):
        kind = code.kind if isinstance(code, ChildError) else type(code).__name__
        found.append(f"traceback: {kind} in {_where(code)}")
    elif code not in (0, 2, None):
        found.append(f"exit status {code}")
    ok = code in (0, None)
    if ok and argv[0] == "run":
        named = [os.path.normpath(p) for p in (_flag(argv, "--checkpoint"), _flag(argv, "--adapter"),
                 _flag(argv, "--tokenizer") if "--bpe" in argv else None, _flag(argv, "--log")) if p]
        if len(set(named)) < len(named):
            found.append("two outputs in one file")
    if code == 2:
        last = err.rstrip("\n").splitlines()[-1] if err.strip() else ""
        if "Traceback" in err or not (last.startswith("python -m tformer") and ": error: " in last):
            found.append("usage error not one line")
        elif "Warning" in err:
            found.append("a warning beside the usage error")
    for rel, (data, mode) in before.items():
        if rel not in after:
            found.append(f"removed file given as {_given_as(argv, rel)}")
        elif ok and rel in outputs:
            if after[rel][1] != mode:
                found.append("mode of a replaced output changed")
        elif after[rel][0] != data:
            found.append(f"changed file given as {_given_as(argv, rel)}"
                         f"{'' if ok else ' (failed run)'}")
        elif after[rel][1] != mode:
            found.append("mode changed")
    new = set(after) - set(before)
    if any(os.path.basename(p).startswith(".tmp-") for p in new):
        found.append("temporary left")
    if not ok and new - {p for p in new if os.path.basename(p).startswith(".tmp-")}:
        found.append("failed run wrote a new file")
    if ok:
        stray = {p for p in new if not os.path.basename(p).startswith(".tmp-")} - outputs
        if stray:
            found.append("wrote an undeclared file")
        why = must_refuse(argv)
        if why:
            found.append(f"accepted: {why}")
    return found


def survey(n, seed=0):
    """Run ``n`` random invocations; ``{problem: (count, first argv)}``."""
    import tempfile
    rng = random.Random(seed)
    seen = {}
    with tempfile.TemporaryDirectory() as tmp:
        pristine = fixtures(os.path.join(tmp, "pristine"))
        for i in range(n):
            argv, outputs = invocation(rng.choice)
            folder = work(pristine, os.path.join(tmp, f"w{i}"))
            for p in problems(argv, outputs, folder):
                count, first = seen.get(p, (0, argv))
                seen[p] = (count + 1, first)
            shutil.rmtree(folder, ignore_errors=True)
    return seen


if __name__ == "__main__":
    os.environ.setdefault("TFORMER_PROGRESS", "0")
    found = survey(int(sys.argv[1]) if len(sys.argv) > 1 else 300,
                   int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    for p, (count, argv) in sorted(found.items(), key=lambda kv: -kv[1][0]):
        print(f"{count:5d}  {p}\n       {' '.join(repr(a) if ' ' in a or not a else a for a in argv)}")
    print(f"{len(found)} distinct problems")
