"""The files a command reads, one loader per kind, each turning any malformed content into a
``UsageError`` that names the flag, the file and what was expected.

- ``read_checkpoint_file``: a float training checkpoint (``run tinygpt``, ``run transformer``), its
  meta and arrays, every weight finite; an int8 checkpoint, an adapter file, another kind of file
  refused by what it is;
- ``load_tinygpt_file``: a TinyGPT rebuilt from a float or an int8 checkpoint (``generate``);
- ``load_adapter_file``: a LoRA adapter put on its base and merged (``generate --adapter``), its
  meta complete, its weights and the merged weights finite;
- ``load_tokenizer_file``: a BPE tokenizer file (``tformer.data.bpe``).

A file's content is data from outside: a KeyError, TypeError or RecursionError while reading it
means the file is malformed, never a bug to show as a traceback.
"""
import numpy as np

from tformer.data.bpe import BPETokenizer
from tformer.training.checkpoint import read_checkpoint, read_npz
from tformer.models.tinygpt import TinyGPT
from tformer.decoding.quantize import load_model
from tformer.runs.flags import UsageError

MALFORMED = (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError,
             MemoryError, OverflowError)
CHECKPOINT = "a checkpoint saved by `python -m tformer run tinygpt`"


def _usage(flag, expected, path, e):
    why = str(e).removeprefix("path: ").replace("\n", " ") or type(e).__name__
    return UsageError(f"{flag}: expected {expected}, got {path!r}: {why}")


def non_finite(arrays):
    """The name of the first floating array of ``{name: array}`` holding NaN or ±inf, or None."""
    for name, a in arrays.items():
        if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all():
            return name
    return None


def check_computes(model):
    """ValueError if ``model``'s logits for one token are not finite: weights that are finite
    but too large to compute with (1e30)."""
    why = "its weights are finite but make NaN or infinite logits (too large)"
    try:
        logits = model.eval().forward(np.zeros((1, 1), dtype=np.int64))
    except (ValueError, FloatingPointError):                # a kernel refusing inf/NaN input
        raise ValueError(why) from None
    if not np.isfinite(logits).all():
        raise ValueError(why)


def _what_it_is(meta):
    """Why ``meta`` is not that of a float training checkpoint, or None if it is one."""
    if meta.get("format") == "tformer-lora-adapter":
        return "it is a LoRA adapter file, not a checkpoint (pass it as --adapter)"
    if "quantized" in meta:
        return ("it is an int8 checkpoint, already quantized (inference only: no float weights "
                "or optimizer state)")
    if not isinstance(meta.get("config"), dict) or not isinstance(meta.get("step", 0), int):
        return "its meta holds no model configuration"
    return None


def _size(config, key):
    value = config.get(key, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"its config's {key} is {value!r}, not an integer ≥ 1")
    return value


def check_sizes(meta, arrays):
    """ValueError if the model that ``meta``'s config describes is far larger than the weights
    ``arrays`` hold (``{name: array}``, any prefix): a config that claims 200,000 blocks beside
    one is refused before a model is built. The weights of a block stack, ``L·(4C² + 3C·F)``,
    the embeddings ``V·C`` and positions ``T·C`` may not exceed four times the numbers stored."""
    config = meta.get("config")
    if not isinstance(config, dict):
        return
    L, C, V, T = (_size(config, k) for k in ("n_layers", "d_model", "vocab_size", "max_len"))
    F = config.get("d_ff") or 4 * C
    F = _size({"d_ff": F}, "d_ff")
    if config.get("lora"):
        return                                   # a LoRA run's checkpoint: its adapters alone
    blocks = {n.split("/")[-1].split(".")[1] for n in arrays
              if n.split("/")[-1].startswith("blocks.")}
    if blocks and len(blocks) != L:
        raise ValueError(f"its config claims n_layers {L:,}, its arrays hold {len(blocks)} blocks")
    claimed = L * (4 * C * C + 3 * C * F) + V * C + T * C
    stored = sum(int(np.asarray(a).size) for a in arrays.values())
    if claimed > 4 * stored + 1_000_000:
        raise ValueError(f"its config claims a model of about {claimed:,} weights, its arrays hold "
                         f"{stored:,} numbers")


def read_checkpoint_file(flag, path, expected=CHECKPOINT, int8=False):
    """``(meta, model_state, optim_state)`` of the checkpoint ``path`` given as ``flag``, or a
    UsageError; ``int8``: an int8 checkpoint is accepted too. Its config is checked against its
    arrays (``check_sizes``) before anything is built from it."""
    try:
        meta, arrays = read_npz(path)
        model_state = {k[6:]: v for k, v in arrays.items() if k.startswith("model/")}
        optim_state = dict(meta.get("optim_scalars", {}))
        optim_state.update({k[6:]: v for k, v in arrays.items() if k.startswith("optim/")})
        why = _what_it_is(meta)
        if why and not (int8 and "quantized" in meta and isinstance(meta.get("config"), dict)):
            raise ValueError(why)
        bad = non_finite({**model_state, **{k: v for k, v in optim_state.items()
                                           if isinstance(v, np.ndarray)}})
        if bad:
            raise ValueError(f"its array {bad!r} holds NaN or infinite values")
        check_sizes(meta, {k: v for k, v in arrays.items() if not k.startswith("optim/")})
    except MALFORMED as e:
        raise _usage(flag, expected, path, e) from None
    return meta, model_state, optim_state


_MODEL_KEYS = ("d_model", "n_heads", "n_layers", "max_len", "vocab_size", "d_ff", "dropout", "dtype")
# The modern block's keywords. A checkpoint saved before they existed lacks them: it is
# TinyGPT's own block, their defaults.
_MODERN_DEFAULTS = {"norm": "layernorm", "positions": "learned", "mlp": "gelu", "tie_embeddings": False,
                    "norm_position": "pre"}


def load_tinygpt(path):
    """Rebuild the TinyGPT stored in ``path`` and load its weights; returns ``(model, meta)``."""
    meta = read_checkpoint(path)[0]
    config = meta["config"]
    missing = [k for k in _MODEL_KEYS if k not in config]
    if missing:
        raise ValueError(f"checkpoint {path!r}: its config lacks {missing}; was it saved from a TinyGPT?")
    modern = {k: config.get(k, default) for k, default in _MODERN_DEFAULTS.items()}
    modern["n_kv_heads"] = config.get("n_kv_heads", config["n_heads"])
    modern["attention"] = config.get("attention", "plain")            # the online softmax's kernel choice
    model = TinyGPT(**{k: config[k] for k in _MODEL_KEYS}, **modern)
    # The model is built from the stored config; an older one is compared on the keys it has.
    older = any(k not in config for k in modern)
    meta = load_model(path, model, config={k: model.config.get(k) for k in config} if older else None)
    return model, meta


def load_tinygpt_file(flag, path):
    """``(model, meta)``: the TinyGPT of the float or int8 checkpoint ``path``, or a UsageError."""
    read_checkpoint_file(flag, path, int8=True)
    try:
        model, meta = load_tinygpt(path)
        with np.errstate(over="ignore", invalid="ignore"):   # too large: said once, below
            check_computes(model)
        return model, meta
    except MALFORMED as e:
        raise _usage(flag, CHECKPOINT, path, e) from None


def load_adapter_file(flag, path, model, base_flag="--checkpoint", base_path=None):
    """The adapters of ``path`` on ``model`` (their base), merged; a UsageError naming ``flag``
    if the file is not an adapter, is incomplete, holds non-finite numbers, was trained on
    another base, or merges into non-finite weights."""
    from tformer.nn.lora import merge_lora
    from tformer.training.lora_file import load_adapter
    expected = f"a LoRA adapter file trained on {base_flag} {base_path!r}"
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # too large: said below, once
            load_adapter(path, model)
            merge_lora(model)
            bad = non_finite({n: p for n, p, _ in model.named_parameters()})
            if bad:
                raise ValueError(f"merged into the base, it makes {bad!r} NaN or infinite")
            check_computes(model)
    except MALFORMED as e:
        raise _usage(flag, expected, path, e) from None
    return model


def load_tokenizer_file(flag, path):
    """The BPE tokenizer at ``path``, or a UsageError naming ``flag``."""
    try:
        return BPETokenizer.load(path)
    except MALFORMED as e:
        raise _usage(flag, "a tokenizer file saved by run tinygpt --bpe", path, e) from None


def tokenizer_record(tokenizer):
    """What a checkpoint records of its tokenizer (None: bytes)."""
    if tokenizer is None:
        return None
    return {"fingerprint": tokenizer.fingerprint(), "vocab_size": tokenizer.vocab_size}


def check_tokenizer(meta, tokenizer, flag, path, ckpt_flag, ckpt_path):
    """UsageError if the checkpoint's ``meta`` records another tokenizer than ``tokenizer``
    (None: bytes); a checkpoint that records none (older) is not checked."""
    extra = meta.get("extra") if isinstance(meta.get("extra"), dict) else {}
    if "tokenizer" not in extra:
        return
    want, have = extra["tokenizer"], tokenizer_record(tokenizer)
    if not want and tokenizer is not None and not tokenizer.merges:
        return                                       # no merge: the bytes themselves
    fp = (want or {}).get("fingerprint") if isinstance(want, dict) or want is None else "?"
    if fp != (have or {}).get("fingerprint"):
        def name(r):
            return "the 256 bytes (no tokenizer)" if not r else \
                f"tokenizer {str(r.get('fingerprint'))[:12]} of {r.get('vocab_size')} tokens"
        raise UsageError(f"{flag}: expected the tokenizer {ckpt_flag} {ckpt_path!r} was trained "
                         f"with, {name(want)}, got {name(have)} from {path!r}")
