"""``python -m tformer generate --checkpoint PATH --prompt TEXT``: write text from a saved TinyGPT.

The checkpoint holds the model's configuration, so the model is rebuilt from it before the weights
are loaded; the prompt is UTF-8 encoded into bytes, the model's tokens. A model trained on BPE tokens
(``run tinygpt --bpe V``) needs its tokenizer: ``--tokenizer FILE`` encodes the prompt and decodes
the output with it.
"""
import sys

from ..bpe import BPETokenizer
from ..checkpoint import read_checkpoint
from ..data.text import decode, encode
from ..generate import sample
from ..models.tinygpt import TinyGPT
from ..scaling.quantize import load_model
from . import finetune
from .tinygpt import DEFAULT_CHECKPOINT
from .flags import UsageError, nonnegative_float, nonnegative_int

_MODEL_KEYS = ("d_model", "n_heads", "n_layers", "max_len", "vocab_size", "d_ff", "dropout", "dtype")
# The modern block's keywords. A checkpoint saved before they existed lacks them: it is
# TinyGPT's own block, their defaults.
_MODERN_DEFAULTS = {"norm": "layernorm", "positions": "learned", "mlp": "gelu", "tie_embeddings": False,
                    "norm_position": "pre"}


def add_arguments(p):
    """The generate command's flags."""
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT,
                   help="a checkpoint saved by `python -m tformer run tinygpt`")
    p.add_argument("--prompt", default="def ", help="text to continue")
    p.add_argument("--max-new-tokens", type=nonnegative_int, default=200, help="bytes to generate")
    p.add_argument("--temperature", type=nonnegative_float, default=0.8, help="0 = greedy; > 1 flatter, < 1 sharper")
    p.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely bytes")
    p.add_argument("--top-p", type=float, default=None, help="sample only from the nucleus of mass p")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws: the same seed, the same text")
    p.add_argument("--no-cache", action="store_true", help="recompute everything at every step")
    p.add_argument("--tokenizer", metavar="FILE", default=None,
                   help="the BPE tokenizer a model trained on tokens was trained with "
                        "(run tinygpt --bpe V saves it beside the checkpoint)")
    finetune.add_generate_arguments(p)


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


def check_args(args):
    """The prompt holds at least one byte (the model continues something)."""
    if not args.prompt:
        raise ValueError("--prompt: expected at least one character, got ''")


def main(args):
    try:
        model, meta = load_tinygpt(args.checkpoint)
    except (OSError, ValueError) as e:                   # missing, not a checkpoint, not TinyGPT's
        raise UsageError(f"--checkpoint: expected a checkpoint saved by `python -m tformer run "
                         f"tinygpt`, got {args.checkpoint!r}: {str(e).removeprefix('path: ')}") from None
    model = finetune.load_generate_adapter(args, model)     # --adapter: LoRA, merged
    to_ids, to_text = _codec(args.tokenizer, model.config["vocab_size"])
    prompt = to_ids(args.prompt)
    out = sample(model, prompt[None, :], args.max_new_tokens, temperature=args.temperature,
                 top_k=args.top_k, top_p=args.top_p, seed=args.seed, use_cache=not args.no_cache)
    sys.stdout.write(to_text(out[0]) + "\n")
    return 0


def _codec(path, vocab_size):
    """``(encode, decode)``: bytes for a byte model, else the BPE tokenizer at ``path``, whose
    vocabulary must be the model's."""
    if path is None:
        if vocab_size != 256:
            raise UsageError(f"--tokenizer: the model reads {vocab_size} tokens, not the 256 "
                             f"bytes; expected the tokenizer it was trained with, got none")
        return encode, decode
    try:
        tokenizer = BPETokenizer.load(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"--tokenizer: expected a tokenizer file saved by run tinygpt --bpe, "
                         f"got {path!r}: {str(e).removeprefix('path: ')}") from None
    if tokenizer.vocab_size != vocab_size:
        raise UsageError(f"--tokenizer: expected a tokenizer of the model's {vocab_size} tokens, "
                         f"got {tokenizer.vocab_size} in {path!r}")
    return tokenizer.encode, tokenizer.decode
