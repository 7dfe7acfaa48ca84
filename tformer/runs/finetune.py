"""Fine-tuning flags of ``python -m tformer run tinygpt``, and ``generate --adapter``.

``--base CHECKPOINT`` starts from a trained TinyGPT instead of a random one (its shape comes from
the checkpoint; a model flag that says otherwise is a usage error); alone, every parameter is
trained (full fine-tuning). ``--lora R`` trains rank-R adapters on the layers named by ``--lora-targets``
(``tformer.nn.lora``) and nothing else: the optimizer, the gradient clipping and ``--checkpoint``
(which ``--resume`` continues) hold the adapters only, and at the end ``--adapter`` receives the
adapter file (``tformer.training.lora_file``: A, B, r, α, the targets and the base's fingerprint).
``python -m tformer generate --checkpoint BASE --adapter FILE`` puts the adapters on their base,
merges them (W ← W + s A B) and samples at the base model's speed.
"""
import os

from tformer.training.checkpoint import load_checkpoint
from tformer.nn.lora import Adapters, apply_lora, fingerprint, resolve_targets
from tformer.training.lora_file import save_adapter
from tformer.runs.files import MALFORMED, load_adapter_file, read_checkpoint_file
from tformer.runs.flag_groups import Flag, add_lora_flags
from tformer.runs.flags import UsageError

# What --base sets from the base checkpoint's config: the model's shape and block.
SHAPE_FLAGS = {"d_model": "d_model", "n_heads": "n_heads", "n_layers": "n_layers",
               "max_len": "max_len", "d_ff": "d_ff", "norm": "norm", "positions": "positions",
               "mlp": "mlp", "n_kv_heads": "n_kv_heads", "tie_embeddings": "tie_embeddings",
               "norm_position": "norm_position"}
LORA_CHECKPOINT = "checkpoints/tinygpt-lora.npz"


def add_arguments(p):
    g = p.add_argument_group("fine-tuning (LoRA)")
    g.add_argument("--base", metavar="CHECKPOINT", default=None,
                   help="start from this TinyGPT checkpoint (its shape is the model's: a model flag "
                        "that says otherwise is refused); "
                        "without --lora every parameter is trained")
    add_lora_flags(g, lora=Flag(None, "train only rank-R LoRA adapters on --lora-targets of the "
                                      "--base model"),
                   lora_alpha=Flag(None, "α of the adapters' scale s = α / R (default R: s = 1)"),
                   lora_targets=Flag(None, "comma-separated layer names: qkv, o, fc1, fc2, "
                                           "lm_head, or the groups attn (qkv, o), mlp (fc1, fc2), "
                                           "all (every linear layer); default attn"),
                   adapter=Flag(None, "with --lora: where to write the adapter file (default: "
                                      "--checkpoint with .adapter.npz)"))


def check_args(args, defaults):
    """``--lora`` needs ``--base``, fp32 and no ``--zero``; ``--base`` must be a whole TinyGPT
    checkpoint of the 256 bytes, and its shape becomes the run's (a shape flag given with
    another value than its default in ``defaults``, ``{dest: default}`` of ``run tinygpt``, is a
    usage error); the run's ``--checkpoint`` is never the base."""
    if args.lora is None:
        for flag, value in (("--lora-alpha", args.lora_alpha), ("--adapter", args.adapter),
                            ("--lora-targets", args.lora_targets)):
            if value is not None:
                raise ValueError(f"{flag}: applies to LoRA fine-tuning; expected --lora R too")
    elif args.lora_targets is None:
        args.lora_targets = "attn"
    if args.base is None:
        if args.lora is not None:
            raise ValueError(f"--lora: fine-tunes a trained model; expected --base CHECKPOINT, "
                             f"got --lora {args.lora} alone")
        return
    try:
        meta = read_checkpoint_file("--base", args.base)[0]
    except UsageError as e:
        raise ValueError(str(e)) from None
    config = meta["config"]
    missing = [k for k in SHAPE_FLAGS if k not in config]
    if missing:
        raise ValueError(f"--base: expected a TinyGPT checkpoint, got {args.base!r} (its config "
                         f"lacks {missing})")
    if config.get("lora"):
        raise ValueError(f"--base: expected a whole TinyGPT checkpoint, got {args.base!r}: a LoRA "
                         f"fine-tuning checkpoint (its adapters only)")
    if config.get("vocab_size", 256) != 256:
        raise ValueError(f"--base: expected a TinyGPT of the 256 bytes (fine-tuning keeps the "
                         f"base's vocabulary, and the run reads bytes), got {args.base!r} of "
                         f"{config.get('vocab_size')} tokens")
    for key, dest in SHAPE_FLAGS.items():
        given = getattr(args, dest)
        if given != defaults[dest] and given != config[key]:      # a flag --base overrides
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag}: does nothing with --base (the model's shape is the base's, "
                             f"{key} = {config[key]}); expected no {flag} with it, got {flag} "
                             f"{given}")
        setattr(args, dest, config[key])
    if args.lora is not None:
        if args.precision != "fp32":
            raise ValueError(f"--precision: LoRA fine-tuning runs in fp32, got {args.precision}")
        if args.zero:
            raise ValueError("--zero: shards a full optimizer state; LoRA's is a few kilobytes, "
                             "expected no --zero with --lora")
        settle_outputs(args)
    if os.path.abspath(args.checkpoint) == os.path.abspath(args.base):
        raise ValueError(f"--checkpoint: expected another file than --base (the run would "
                         f"overwrite its base model), got {args.checkpoint!r}")


def settle_outputs(args):
    """With ``--lora`` and ``--base``: the run's default ``--checkpoint`` is ``LORA_CHECKPOINT``
    (not the base's), ``--adapter`` lies beside it by default. No I/O: ``files`` calls it."""
    if args.lora is None or args.base is None:
        return
    if args.checkpoint == "checkpoints/tinygpt.npz":             # the run's default: not the base's
        args.checkpoint = LORA_CHECKPOINT
    if args.adapter is None:
        args.adapter = os.path.splitext(args.checkpoint)[0] + ".adapter.npz"


def targets(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def checked_targets(args, model):
    """The layer names of ``--lora-targets``, each found in ``model`` and ``--lora`` at most
    min(C_in, C_out) of every layer they name; a UsageError naming the flag otherwise."""
    names = targets(args.lora_targets)
    try:
        paths = resolve_targets(model, names)
    except ValueError as e:
        raise UsageError(f"--lora-targets: {str(e).removeprefix('targets: ')}") from None
    shapes = {n: p.shape for n, p, _ in model.named_parameters()}
    most = min((min(shapes[f"{p}.W"]) for p in paths if f"{p}.W" in shapes), default=args.lora)
    if args.lora > most:
        raise UsageError(f"--lora: expected a rank of at most {most} (min(C_in, C_out) of the "
                         f"layers of --lora-targets {args.lora_targets}), got {args.lora}")
    return names


def prepare(args, model):
    """The model with the ``--base`` weights (and adapters with ``--lora``); returns what the
    optimizer trains: ``model`` itself, or its ``Adapters``."""
    if args.base is None:
        return model
    try:
        load_checkpoint(args.base, model)
    except MALFORMED as e:
        raise UsageError(f"--base: expected a TinyGPT checkpoint, got {args.base!r}: "
                         f"{str(e).removeprefix('path: ')}") from None
    print(f"base model: {args.base} (fingerprint {fingerprint(model)[:12]})")
    if args.lora is None:
        return model
    from tformer.training.mpi import get_world
    if get_world().size > 1:
        raise UsageError("--lora: runs in one process (the adapters' gradients are a few "
                         "kilobytes); expected no mpiexec")
    layers = apply_lora(model, args.lora, args.lora_alpha, checked_targets(args, model),
                        seed=args.seed)
    view = Adapters(model)
    print(f"LoRA: r={args.lora}, α={model.lora['alpha']:g} on {len(layers)} layers "
          f"({args.lora_targets}): {view.num_trainable():,} trained parameters of "
          f"{model.num_parameters():,}")
    return view


def finish(args, model):
    """With ``--lora``: write the adapter file ``--adapter``."""
    if args.lora is not None:
        path = save_adapter(args.adapter, model)
        print(f"adapter: {path} ({os.path.getsize(path):,} bytes)")


def add_generate_arguments(p):
    add_lora_flags(p, adapter=Flag(None, "a LoRA adapter file (run tinygpt --lora) trained on "
                                         "--checkpoint: loaded onto it and merged"))


def load_generate_adapter(args, model):
    """``generate --adapter``: the adapters on ``model`` (the base), merged. UsageError naming
    ``--adapter`` if the file is not one, is malformed, or was trained on another base model."""
    if getattr(args, "adapter", None) is None:
        return model
    return load_adapter_file("--adapter", args.adapter, model, "--checkpoint", args.checkpoint)
