"""``python -m tformer``: every command is registered one way, from one table."""
import importlib

from tformer.__main__ import COMMANDS, RUNS, _leaves, build_parser


def test_every_command_comes_from_its_table_entry_and_runs_its_modules_main():
    parser = build_parser()
    by_prog = {p.prog: p for p in _leaves(parser)}
    expected = {f"python -m tformer run {n}": m for n, (m, _) in RUNS.items()}
    expected.update({f"python -m tformer {n}": m for n, (m, _) in COMMANDS.items()})
    present = {prog: m for prog, m in expected.items() if prog in by_prog}
    assert set(by_prog) == set(present)                        # no command registered elsewhere
    assert len(present) >= len(expected) - 2                   # at most an optional module missing
    for prog, module in present.items():
        mod = importlib.import_module(module)
        assert by_prog[prog].get_default("func") is mod.main, prog
        assert any(a.dest == "threads" for a in by_prog[prog]._actions), prog
        if prog.startswith("python -m tformer run "):
            assert any(a.dest == "log" for a in by_prog[prog]._actions), prog
