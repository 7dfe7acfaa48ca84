"""``python -m tformer run transformer2``: the two-layer transformer, trained.

Default task: the single attention layer's copy-max task (inputs U(0, 1)), the same as ``run attention``. With
``--task copy_max_centered`` the inputs are N(0, 1), where the swish MLP is what makes the task
learnable (``--no-mlp`` drops it, for comparison). Prints the final training loss and the held-out
loss and accuracy.
"""
from tformer.data import copy_max, copy_max_centered
from tformer.models.two_layer import TwoLayerTransformer
from tformer.runs.attention import add_common_arguments, fit
from tformer.runs.attention import check_flags  # noqa: F401  (the same flags, the same bound)
from tformer.runs.attention import files as attention_files
from tformer.runs.flag_groups import Flag, add_model_flags
from tformer.runs.flags import idle

DEFAULTS = dict(d_model=16, seq_len=8, batch_size=32, steps=3000, lr=3e-3)
TASKS = {"copy_max": (copy_max.copy_max_batch, copy_max.held_out),
         "copy_max_centered": (copy_max_centered.centered_copy_max_batch, copy_max_centered.held_out)}


def add_arguments(parser):
    add_common_arguments(parser, DEFAULTS)
    g = parser.add_argument_group("model and task")
    add_model_flags(g, d_ff=Flag(None, "width of W_1 (its source leaves it unstated; default "
                                       "4 · d_model)"))
    g.add_argument("--no-mlp", action="store_true",
                   help="leave out both swish MLPs (an ablation; the source has them)")
    g.add_argument("--task", choices=sorted(TASKS), default="copy_max",
                   help="copy_max: inputs U(0, 1); copy_max_centered: inputs N(0, 1)")


def unused_flags(args):
    """``--d-ff`` is the width of the MLP that ``--no-mlp`` drops."""
    return idle("--d-ff", "with --no-mlp (the width of the MLP it drops)", args.no_mlp)


def files(args):
    """What the run writes (``tformer.runs.declare``): ``--checkpoint``, ``--log``."""
    return attention_files(args)


def main(args):
    model = TwoLayerTransformer(d_model=args.d_model, d_ff=args.d_ff, use_mlp=not args.no_mlp,
                                seed=args.seed)
    make_batch, make_held = TASKS[args.task]
    held = make_held(args.eval_batches, batch_size=64, seq_len=args.seq_len, d_model=args.d_model,
                     seed=args.seed)
    fit(model, args, make_batch, held, f"transformer2 on {args.task}")
    return 0
