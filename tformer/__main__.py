"""``python -m tformer run <system> [flags]``, ``generate``, ``many-processes``, ``quantize``, ``fewer-bits``, ``online-softmax``, ``ablate``, ``memory``, ``shakespeare``, ``bpe-compare``, ``lora``, ``rl``, ``speedrun``.

Every command is one entry of ``RUNS`` (``run SYSTEM``) or ``COMMANDS`` below, registered the same
way: its module's ``add_arguments(parser)``, ``files(args)`` (every file it reads and writes,
``tformer.runs.declare``), ``main(args)``, and optional ``check_flags(args)`` (flags that must
agree) and ``check_args(args)`` (what the files it reads hold), and optional ``unused_flags(args)``
(the flags that do nothing in the mode the command line chose: each one given is a usage error).
``main`` below runs them in the order unused_flags, check_flags, the declared files, check_args,
main: nothing is read or written before the flags agree and the files are what they must be.
"""
import os

# tformer.core.parallel splits its kernels over every core by default (--threads N or TFORMER_NUM_THREADS
# say otherwise) and holds BLAS at one thread per call meanwhile; with one tformer thread, BLAS keeps
# one thread too, so that --threads 1 means one core. Set before NumPy is imported; an explicit
# OPENBLAS_NUM_THREADS / OMP_NUM_THREADS in the environment still wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import sys  # noqa: E402

# Every command: name -> (its module, one-line description). The module has
# ``add_arguments(parser)`` and ``main(args)``, and may have ``check_args(args)`` (flags that must
# agree). ``run SYSTEM`` trains one of the five systems; the other commands stand alone.
RUNS = {
    "attention": ("tformer.runs.attention",
                  "the single attention layer: one self-attention layer on the copy-the-max-row task"),
    "transformer2": ("tformer.runs.two_layer",
                     "the two-layer transformer (swish MLP, no LayerNorm)"),
    "encoder": ("tformer.runs.encoder", "the post-LN encoder reconstructing its input"),
    "transformer": ("tformer.runs.transformer",
                    "the complete Transformer on a padded sequence task"),
    "tinygpt": ("tformer.runs.tinygpt", "TinyGPT, a byte-level GPT trained on text"),
}
COMMANDS = {
    "generate": ("tformer.runs.generate_cmd", "write text from a saved TinyGPT checkpoint"),
    "quantize": ("tformer.runs.quantize_cmd", "int8 post-training quantization of a saved checkpoint"),
    "many-processes": ("tformer.experiments.many_processes",
                       "measure data-parallel training over MPI (writes a JSON file)"),
    "fewer-bits": ("tformer.experiments.fewer_bits", "the precision and quantization measurements of the "
                   "chapter Fewer bits (writes a JSON file)"),
    "online-softmax": ("tformer.experiments.online_softmax", "plain against online-softmax attention: tile "
                       "sizes, peak memory and time (writes a JSON file)"),
    "ablate": ("tformer.experiments.ablate", "the ablation of the modern block: TinyGPT with each piece "
               "changed alone, seeds, pre/post-norm (writes a JSON file)"),
    "memory": ("tformer.experiments.memory", "gradient checkpointing, dynamic batching and gradient norms: "
               "the measurements of the chapter Fitting in memory (writes a JSON file)"),
    "shakespeare": ("tformer.experiments.shakespeare", "TinyGPT learns Shakespeare with nanoGPT's CPU "
                    "recipe: seeds, samples, the PyTorch twin (writes a JSON file)"),
    "bpe-compare": ("tformer.experiments.bpe_compare", "TinyGPT on bytes against TinyGPT on BPE tokens "
                    "of several vocabulary sizes, in bits per byte (writes a JSON file)"),
    "lora": ("tformer.experiments.lora_experiment", "fine-tuning a Python-trained TinyGPT on Shakespeare: "
             "full, LoRA at several ranks and targets, from scratch (writes a JSON file)"),
    "scaling-sweep": ("tformer.experiments.scaling_sweep", "IsoFLOP profiles of TinyGPT on all 38 plays: "
                      "budgets x model sizes, nats/char of the eight plays' validation text (writes a JSON file)"),
    "long-run": ("tformer.experiments.long_run", "the scaling law chooses a model and predicts its loss "
                 "(--predict), then the run trains it, samples it and ships it (writes a JSON file)"),
    "decoding": ("tformer.experiments.decoding", "samplers and speculative decoding on the long run's model: "
                 "acceptance, speed-up against plain KV decoding, what each sampler writes (writes a JSON file)"),
    "finetune": ("tformer.runs.finetune_cmd", "tune a TinyGPT on preference pairs (JSON lines: prompt, "
                 "chosen, rejected) by DPO or by fine-tuning on the chosen responses, all weights "
                 "or LoRA adapters"),
    "preference": ("tformer.experiments.preference", "DPO teaches the long run's model to write lines that "
                   "scan as iambic pentameter, against best-of-n and fine-tuning on the chosen lines "
                   "(writes a JSON file)"),
    "rl": ("tformer.experiments.rl", "GRPO learns from the judge directly: the long run's model against "
           "DPO and best-of-n at matched KL, under the judge and a stricter one (writes a JSON file)"),
    "speedrun": ("tformer.experiments.speedrun", "how fast TinyGPT reaches the Shakespeare recipe's "
                 "loss on two cores: the recipe, then one change at a time, Muon first (writes a JSON file)"),
    "bench": ("tformer.bench.run", "training and generation against PyTorch (writes a JSON file)"),
}


def _load(module):
    """The module, or None if it is not there (a command whose module is missing is left out)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise


def _add(sub, name, module, help_text):
    """Register one command: its parser, its flags (``module.add_arguments``), its ``main``."""
    mod = _load(module)
    if mod is None:
        return None
    p = sub.add_parser(name, help=help_text, description=help_text,
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    mod.add_arguments(p)
    p.set_defaults(func=mod.main, command_module=mod.__name__)
    return p


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m tformer",
                                     description="Train and sample the five systems the book rebuilds.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train one of the five systems")
    systems = run.add_subparsers(dest="system", required=True, metavar="SYSTEM")
    for name, (module, help_text) in RUNS.items():
        p = _add(systems, name, module, help_text)
        if p is not None and not any(a.dest == "log" for a in p._actions):
            p.add_argument("--log", metavar="FILE", default=None,
                           help="write the training history (step, loss, lr, grad norm, clip ratio, "
                                "time) to FILE: CSV if it ends in .csv, else JSON lines")
    for name, (module, help_text) in COMMANDS.items():
        _add(sub, name, module, help_text)
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


# The most threads a command starts: a few per core this machine has (more only wait for a core,
# and each holds a stack and buffers; a billion never start).
MAX_THREADS = max(64, 4 * (os.cpu_count() or 1))


def _bounded_threads(text, name):
    """``text`` as a thread count from 1 to ``MAX_THREADS``, else ValueError naming ``name``."""
    from tformer.core.parallel import parse_num_threads
    n = parse_num_threads(text, name)
    if n > MAX_THREADS:
        raise ValueError(f"{name}: expected an integer ≥ 1 and at most {MAX_THREADS} (4 threads "
                         f"per core of this machine, at least 64), got {text!r}")
    return n


def _threads(text):
    """``--threads``: an integer from 1 to ``MAX_THREADS``, else argparse's usage error naming
    the flag."""
    try:
        return _bounded_threads(text, "--threads")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--threads: ")) from None


def _check_files(parser, args):
    """The files the command declares (its module's ``files(args)``, ``tformer.runs.declare``):
    checked before anything else reads or writes one; a ValueError is the usage error."""
    from tformer.runs import declare
    files = getattr(sys.modules[args.command_module], "files", None)
    if files is None:                             # tests/commands/test_declared_files.py fails on it too
        _leaf(parser, args).error("the command declares no files (files(args), "
                                  "tformer.runs.declare); it cannot run")
    try:
        declare.check(files(args))
    except ValueError as e:
        _leaf(parser, args).error(_one_line(e))


def _check_flags(parser, args, name="check_args"):
    """A command's ``check_flags(args)`` (flags that must agree with each other, no file read) or
    ``check_args(args)`` (the same, and the content of the files it reads), in the module of its
    ``main`` (``tformer.runs.flags``): its ValueError becomes that command's usage error, exit
    status 2, before anything runs."""
    check = getattr(sys.modules[args.command_module], name, None)
    if check is None:
        return
    try:
        check(args)
    except ValueError as e:
        _leaf(parser, args).error(_one_line(e))


def _check_unused(parser, args):
    """A command's ``unused_flags(args)``: ``[(flag, mode, when)]`` (``tformer.runs.flags.idle``),
    the flags that do nothing in a mode, and whether the command line chose it. Each one given in
    its idle mode (a value other than its default) is that command's usage error, naming the flag
    and the mode."""
    unused = getattr(sys.modules[args.command_module], "unused_flags", None)
    if unused is None:
        return
    from tformer.runs.flags import unused_error
    leaf = _leaf(parser, args)
    for flag, mode, when in unused(args):
        action = leaf._option_string_actions[flag]             # a flag of this command
        if not when:
            continue
        default = action.default
        if isinstance(default, str) and action.type is not None:
            default = action.type(default)               # argparse converts a text default too
        value = getattr(args, action.dest, default)
        if value != default:
            leaf.error(_one_line(unused_error(flag, mode, value)))


def _one_line(e):
    """An error's message on one line (a usage error is one line of stderr)."""
    return " ".join(str(e).split("\n"))


def _written_as(args, path):
    """The flags of ``args`` whose value is ``path`` (the output a failed write names)."""
    flags = [f"--{k.replace('_', '-')}" for k, v in vars(args).items()
             if isinstance(v, str) and v == path]
    return ", ".join(flags) or "output"


def _leaf(parser, args):
    """The parser of the command ``args`` runs."""
    return next(p for p in _leaves(parser) if p.get_default("func") is args.func)


def main(argv=None):
    try:
        if os.environ.get("TFORMER_NUM_THREADS", "").strip():
            _bounded_threads(os.environ["TFORMER_NUM_THREADS"][:40], "TFORMER_NUM_THREADS")
        from tformer.core import parallel                    # reads TFORMER_NUM_THREADS at import
    except ValueError as e:                       # a bad value: one line, not a traceback
        print(f"python -m tformer: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_unused(parser, args)                   # flags that do nothing in the chosen mode
    _check_flags(parser, args, "check_flags")     # flags that must agree: no file read yet
    _check_files(parser, args)                    # what it reads and writes: before any work
    _check_flags(parser, args)                    # and what the files it reads hold
    if getattr(args, "threads", None) is not None:
        parallel.set_num_threads(args.threads)
    # Under mpiexec, one rank of the job: rank 0 prints; an error on one rank aborts them all.
    from tformer.training.mpi import RankError, run_command
    from tformer.training.train import NonFiniteLossError
    from tformer.runs.flags import UsageError
    from tformer.core.atomic import WriteError
    try:
        return run_command(args.func, args, consistent=(RankError, NonFiniteLossError))
    except UsageError as e:                       # bad input found as the command ran
        _leaf(parser, args).error(_one_line(e))
    except WriteError as e:                       # a full disk: the old file is kept
        _leaf(parser, args).error(f"{_written_as(args, e.filename)}: {_one_line(e)}")


if __name__ == "__main__":
    sys.exit(main())
