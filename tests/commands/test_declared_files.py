"""Every command declares the files it reads and writes (``tformer.runs.declare``), and one runner
checks them before the command's work: a command without its declaration, or a flag naming a file
that the declaration forgets, fails here."""
import os

import numpy as np
import pytest

from tformer.__main__ import _leaves, build_parser
from tformer.runs import declare

# The least command line of each command that needs more than its name.
BASE = {"quantize": ["quantize", "x.npz", "--out", "y.npz"],
        "finetune": ["finetune", "--dpo", "p.jsonl", "--out", "o.npz"]}
# Flags that take text other than a path (a new one is listed here, on purpose).
NOT_PATHS = {"--lora-targets", "--lengths", "--sizes", "--gen-batches", "--worker"}
# Flags that name a file only in a mode: the mode's flags.
MODE = {("run tinygpt", "--adapter"): ["--base", "b.npz", "--lora", "2"],
        ("run tinygpt", "--base"): [],
        ("long-run", "--sweep"): ["--predict"],
        ("decoding", "--tokenizer"): ["--target", "t.npz"],
        ("finetune", "--dpo"): []}
PROBE = "zz-probe-53"


def commands():
    """``{command: parser}`` of every command ``python -m tformer --help`` lists."""
    return {p.prog.removeprefix("python -m tformer "): p for p in _leaves(build_parser())}


def _module(parser):
    import sys
    return sys.modules[parser.get_default("func").__module__]


def path_flags(parser):
    """The flags (and positional arguments) of ``parser`` whose value is one path."""
    out = []
    for a in parser._actions:
        name = a.option_strings[0] if a.option_strings else a.dest
        if a.type is None and a.nargs in (None, "?") and not a.choices and a.const is None \
                and a.dest != "help" and name not in NOT_PATHS:
            out.append(name)
    return out


def test_every_command_has_a_declaration_of_its_files():
    found = commands()
    assert len(found) >= 20
    top = build_parser()
    for name, parser in found.items():
        files = getattr(_module(parser), "files", None)
        assert callable(files), f"python -m tformer {name}: no files(args) (tformer.runs.declare)"
        args = top.parse_args(BASE.get(name, name.split()))
        declared = files(args)
        assert all(isinstance(d, declare.Declared) for d in declared), name


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_flag_that_names_a_file_is_declared(name):
    parser = commands()[name]
    top = build_parser()
    for flag in path_flags(parser):
        argv = list(BASE.get(name, name.split()))
        if flag.startswith("-"):
            argv += [*MODE.get((name, flag), []), flag, PROBE]
            if name == "finetune" and flag == "--sft":
                argv = ["finetune", "--sft", PROBE, "--out", "o.npz"]
        else:                                                    # quantize's CHECKPOINT
            argv[1] = PROBE
        args = top.parse_args(argv)
        declared = _module(parser).files(args)
        assert any(PROBE in (d.path or "") for d in declared), \
            f"python -m tformer {' '.join(argv)}: {flag} is not in files(args) = {declared}"


def test_the_runner_refuses_each_kind_of_bad_file(tmp_path):
    d = str(tmp_path)
    text, fifo, link = (os.path.join(d, n) for n in ("t.txt", "fifo", "link.json"))
    open(text, "w").close()
    os.mkfifo(fifo)
    os.symlink(text, link)

    def refused(files, *parts):
        with pytest.raises(ValueError) as e:
            declare.check(files)
        for part in parts:
            assert part in str(e.value), (part, str(e.value))

    refused([declare.reads("--text", fifo)], "--text: expected a regular file", "FIFO")
    refused([declare.reads("--text", d)], "--text: expected a regular file", "a folder")
    refused([declare.reads("--text", "/dev/null")], "--text:", "a device")
    refused([declare.reads("--text", os.path.join(d, "none"))], "--text:", "no such file")
    refused([declare.updates("--out", fifo)], "--out: expected a regular file", "FIFO")
    refused([declare.writes("--out", fifo)], "--out: expected a file that can be written", "FIFO")
    refused([declare.reads("--text", text), declare.writes("--out", link)],
            "--out: expected another file than --text")                 # a symlink to the input
    refused([declare.writes("--a", os.path.join(d, "x")), declare.writes("--b", f"{d}/q/../x")],
            "--b: expected a path whose folders exist before '..'")
    refused([declare.writes("--a", os.path.join(d, "x")), declare.writes("--b", f"{d}/./x")],
            "--b: expected another file than --a", "both are written")
    refused([declare.writes("--out", os.path.join(text, "x"))], "--out:", "is a file")
    declare.check([declare.may_read("--t", os.path.join(d, "none")),      # absent: fine
                   declare.updates("--c", os.path.join(d, "new", "c.npz")),
                   declare.reads("--text", text), declare.writes("--out", f"{d}/../{os.path.basename(d)}/y")])
    assert not os.path.exists(os.path.join(d, "sub"))                   # nothing created


def test_a_write_through_a_symlink_keeps_the_link(tmp_path):
    from tformer.core.atomic import write_json
    target, link = tmp_path / "t.json", tmp_path / "link.json"
    target.write_text("{}")
    os.symlink(target.name, link)
    write_json(str(link), {"a": 1})
    assert os.path.islink(link) and target.read_text().startswith("{") and "1" in target.read_text()


def test_long_run_declares_the_tokenizer_beside_ship_and_keeps_a_ship_too_large(tmp_path,
                                                                               monkeypatch):
    """Findings 2 and 3 of issue 53: the tokenizer written beside --ship is declared; a model
    over the ship limit leaves the existing --ship file as it was."""
    from tformer.experiments import long_run as LR
    from tformer.models.tinygpt import TinyGPT
    args = build_parser().parse_args(["long-run", "--ship", str(tmp_path / "m.npz")])
    named = {d.flag: d.path for d in LR.files(args)}
    assert named["--ship's tokenizer"] == str(tmp_path / "long_run_tokenizer.json")
    old = tmp_path / "m.npz"
    old.write_bytes(b"the model shipped before")
    monkeypatch.setattr(LR, "SHIP_BYTES", 10)
    model = TinyGPT(d_model=8, n_heads=2, n_layers=1, max_len=8, seed=0)
    out = LR.ship(model, None, str(old), np.zeros((1, 8), np.int64), np.zeros((1, 8), np.int64))
    assert out["path"] is None and "larger than" in out["reason"]
    assert old.read_bytes() == b"the model shipped before"
    assert sorted(os.listdir(tmp_path)) == ["m.npz"]                    # no tokenizer, no temporary


def test_long_run_declares_its_plan_once_as_a_file_it_updates(tmp_path):
    """Issue 53: ``long-run``'s ``--out`` is its plan, read and then completed with the result:
    one ``updates`` that must exist (not a read and a write of one flag); ``--predict`` writes it."""
    from tformer.experiments import long_run as LR
    top = build_parser()
    plan = str(tmp_path / "plan.json")
    outs = [d for d in LR.files(top.parse_args(["long-run", "--out", plan])) if d.flag == "--out"]
    assert len(outs) == 1 and outs[0].role == declare.UPDATES and outs[0].must_exist
    assert outs[0].read and outs[0].written
    with pytest.raises(ValueError, match=r"--out: expected a long-run prediction \(long-run "
                                         r"--predict writes it\), got .* \(no such file\)"):
        declare.check(outs)
    open(plan, "w").close()
    declare.check(outs)                                                 # there: fine
    outs = [d for d in LR.files(top.parse_args(["long-run", "--predict", "--out", plan]))
            if d.flag == "--out"]
    assert [d.role for d in outs] == [declare.WRITES]
    assert not declare.updates("--c", str(tmp_path / "none")).must_exist    # resumable: optional
    declare.check([declare.updates("--c", str(tmp_path / "none"))])
