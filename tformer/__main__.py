"""``python -m tformer run <system> [flags]``, ``generate``, ``many-processes``, ``quantize``, ``fewer-bits``, ``online-softmax``, ``ablate``, ``memory``, ``bpe-compare``.

Each run lives in ``tformer/runs/<module>.py`` with ``add_arguments(parser)`` and ``main(args)``.
"""
import os

# tformer.parallel splits its kernels over every core by default (--threads N or TFORMER_NUM_THREADS
# say otherwise) and holds BLAS at one thread per call meanwhile; with one tformer thread, BLAS keeps
# one thread too, so that --threads 1 means one core. Set before NumPy is imported; an explicit
# OPENBLAS_NUM_THREADS / OMP_NUM_THREADS in the environment still wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import sys  # noqa: E402

# system name -> (module in tformer.runs, one-line description)
RUNS = {
    "attention": ("attention", "seed 001: one self-attention layer on the copy-the-max-row task"),
    "transformer2": ("transformer2", "seed 000: the two-layer transformer (swish MLP, no LayerNorm)"),
    "encoder": ("encoder", "seed 003: the post-LN encoder reconstructing its input"),
    "transformer": ("transformer", "seed 002: the complete Transformer on a padded sequence task"),
    "tinygpt": ("tinygpt", "seed 004: TinyGPT, a byte-level GPT trained on text"),
}


def _load(module):
    try:
        return importlib.import_module(f"tformer.runs.{module}")
    except ModuleNotFoundError as e:
        if e.name == f"tformer.runs.{module}":
            return None
        raise


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m tformer",
                                     description="Train and sample the book's source systems.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train one source system")
    systems = run.add_subparsers(dest="system", required=True, metavar="SYSTEM")
    for name, (module, help_text) in RUNS.items():
        mod = _load(module)
        if mod is None:
            continue
        p = systems.add_parser(name, help=help_text, description=help_text,
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        mod.add_arguments(p)
        if not any(a.dest == "log" for a in p._actions):
            p.add_argument("--log", metavar="FILE", default=None,
                           help="write the training history (step, loss, lr, grad norm, clip ratio, "
                                "time) to FILE: CSV if it ends in .csv, else JSON lines")
        p.set_defaults(func=mod.main)
    gen = _load("generate_cmd")
    if gen is not None:
        p = sub.add_parser("generate", help="write text from a saved TinyGPT checkpoint",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        gen.add_arguments(p)
        p.set_defaults(func=gen.main)
    mp = _load("many_processes")
    if mp is not None:
        p = sub.add_parser("many-processes", help="measure data-parallel training over MPI (JSON)",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        mp.add_arguments(p)
        p.set_defaults(func=mp.main)
    for name, module, help_text in (
            ("quantize", "quantize_cmd", "int8 post-training quantization of a saved checkpoint"),
            ("fewer-bits", "fewer_bits", "the precision and quantization measurements of the "
                                         "chapter Fewer bits (writes a JSON file)"),
            ("online-softmax", "online_softmax", "plain against online-softmax attention: tile "
                                                 "sizes, peak memory and time (writes a JSON file)"),
            ("ablate", "ablate", "the ablation of the modern block: TinyGPT with each piece "
                                 "changed alone, seeds, pre/post-norm (writes a JSON file)"),
            ("memory", "memory", "gradient checkpointing, dynamic batching and gradient norms: the "
                                 "measurements of the chapter Fitting in memory (writes a JSON file)"),
            ("bpe-compare", "bpe_compare", "TinyGPT on bytes against TinyGPT on BPE tokens of "
                                           "several vocabulary sizes, in bits per byte (writes a JSON file)")):
        mod = _load(module)
        if mod is not None:
            p = sub.add_parser(name, help=help_text, description=help_text,
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
            mod.add_arguments(p)
            p.set_defaults(func=mod.main)
    from .bench import run as bench
    p = sub.add_parser("bench", help="training and generation against PyTorch (writes a JSON file)",
                       description="Training and generation, tformer against PyTorch (make bench). "
                       "--threads N sets every library's threads on both sides; without it, "
                       "each runs on its defaults.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    bench.add_arguments(p)
    p.set_defaults(func=bench.main)
    for p in _leaves(parser):
        p.add_argument("--threads", type=_threads, default=argparse.SUPPRESS, metavar="N",
                       help="threads of tformer's kernels (default: TFORMER_NUM_THREADS, else every "
                            "core this process may use, shared among the MPI ranks on this host)")
    return parser


def _leaves(parser):
    """Every parser that runs a command (those with no subcommands of their own)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for a in subs for p in dict.fromkeys(a.choices.values()) for leaf in _leaves(p)]


def _threads(text):
    """``--threads``: an integer ≥ 1, else argparse's usage error naming the flag."""
    from .parallel import parse_num_threads
    try:
        return parse_num_threads(text, "--threads")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--threads: ")) from None


def _check_flags(parser, args):
    """A command's ``check_args(args)`` (flags that must agree with each other, in the module of
    its ``main``; ``tformer.runs.flags``): its ValueError becomes that command's usage error, exit
    status 2, before anything runs."""
    check = getattr(sys.modules[args.func.__module__], "check_args", None)
    if check is None:
        return
    try:
        check(args)
    except ValueError as e:
        _leaf(parser, args).error(str(e))


def _leaf(parser, args):
    """The parser of the command ``args`` runs."""
    return next(p for p in _leaves(parser) if p.get_default("func") is args.func)


def main(argv=None):
    try:
        from . import parallel                    # reads TFORMER_NUM_THREADS at import
    except ValueError as e:                       # a bad value: one line, not a traceback
        print(f"python -m tformer: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_flags(parser, args)
    if getattr(args, "threads", None) is not None:
        parallel.set_num_threads(args.threads)
    # Under mpiexec, one rank of the job: rank 0 prints; an error on one rank aborts them all.
    from .distributed import RankError, run_command
    from .train import NonFiniteLossError
    from .runs.flags import UsageError
    try:
        return run_command(args.func, args, consistent=(RankError, NonFiniteLossError))
    except UsageError as e:                       # bad input found as the command ran
        _leaf(parser, args).error(str(e))


if __name__ == "__main__":
    sys.exit(main())
