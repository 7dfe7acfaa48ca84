"""``python -m tformer generate --checkpoint PATH --prompt TEXT``: write text from a saved TinyGPT.

The checkpoint holds the model's configuration, so the model is rebuilt from it before the weights
are loaded; the prompt is UTF-8 encoded into bytes, the model's tokens. A model trained on BPE tokens
(``run tinygpt --bpe V``) needs its tokenizer: ``--tokenizer FILE`` encodes the prompt and decodes
the output with it.

``--draft CHECKPOINT --lookahead k``: speculative decoding (``tformer.decoding.speculative``), the draft
proposing k tokens a round and the checkpoint's model checking them in one pass; the text is
distributed as without it (with ``--temperature 0``, the same text). The draft must read the same
tokens: the same vocabulary, and for a BPE model the same tokenizer.
"""
import sys

from tformer.data.text import decode, encode
from tformer.decoding.generate import sample
from tformer.decoding.speculative import speculative_sample
from tformer.runs import finetune
from tformer.runs.tinygpt import DEFAULT_CHECKPOINT
from tformer.runs.files import load_tinygpt  # noqa: F401  (rebuilds a TinyGPT from its checkpoint)
from tformer.runs.files import check_tokenizer, load_tinygpt_file, load_tokenizer_file
from tformer.runs.flag_groups import (Flag, add_checkpoint_flags, add_data_flags,
                                      add_sampling_flags, add_training_flags)
from tformer.runs.flags import (MAX_NEW_TOKENS, UsageError, idle, min_p, new_tokens, positive_int,
                                temperature, top_p)


def add_arguments(p):
    """The generate command's flags."""
    add_checkpoint_flags(p, checkpoint=Flag(DEFAULT_CHECKPOINT, "a checkpoint saved by `python -m "
                                                                "tformer run tinygpt`"))
    add_sampling_flags(p, prompt="def ")
    p.add_argument("--max-new-tokens", type=new_tokens, default=200,
                   help=f"tokens to generate (at most {MAX_NEW_TOKENS:,}: what the command holds "
                        f"and prints at once)")
    p.add_argument("--temperature", type=temperature, default=0.8, help="0 = greedy; > 1 flatter, < 1 sharper")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample only from the k most likely bytes")
    p.add_argument("--top-p", type=top_p, default=None, help="sample only from the nucleus of mass p, in (0, 1]")
    p.add_argument("--min-p", type=min_p, default=None,
                   help="sample only tokens of probability ≥ this fraction of the largest, "
                        "in [0, 1]")
    p.add_argument("--draft", metavar="CHECKPOINT", default=None,
                   help="speculative decoding: a smaller TinyGPT of the same tokens proposes, the "
                        "checkpoint's model checks (the same distribution of text)")
    p.add_argument("--lookahead", type=positive_int, default=None,
                   help=f"tokens the --draft proposes per round (default {LOOKAHEAD})")
    add_training_flags(p, seed=Flag(0, "seed of the draws: the same seed, the same text"))
    p.add_argument("--no-cache", action="store_true", help="recompute everything at every step")
    add_data_flags(p, tokenizer=Flag(None, "the BPE tokenizer a model trained on tokens was "
                                           "trained with (run tinygpt --bpe V saves it beside "
                                           "the checkpoint)"))
    finetune.add_generate_arguments(p)


LOOKAHEAD = 4


def files(args):
    """What the command reads (``tformer.runs.declare``); it writes nothing but stdout."""
    from tformer.runs.declare import reads
    from tformer.runs.files import CHECKPOINT
    return [reads("--checkpoint", args.checkpoint, CHECKPOINT, "no checkpoint at that path"),
            reads("--tokenizer", args.tokenizer),
            reads("--adapter", getattr(args, "adapter", None)), reads("--draft", args.draft)]


def unused_flags(args):
    """Greedy decoding (``--temperature 0``) takes the most likely token: no filter, no draw."""
    return idle(["--top-k", "--top-p", "--min-p", "--seed"],
                "with greedy decoding (--temperature 0: the most likely token, no draw)",
                args.temperature == 0)


def check_flags(args):
    """The prompt holds at least one byte (the model continues something); ``--lookahead`` goes
    with ``--draft``, which decodes through the KV cache (not with ``--no-cache``)."""
    if not args.prompt:
        raise ValueError("--prompt: expected at least one character, got ''")
    if args.lookahead is not None and args.draft is None:
        raise ValueError("--lookahead: applies to speculative decoding; expected --draft "
                         "CHECKPOINT with it, got none")
    if args.draft is not None and args.no_cache:
        raise ValueError("--no-cache: speculative decoding (--draft) runs through the KV cache; "
                         "expected one of the two, got both")


def main(args):
    model, meta = load_tinygpt_file("--checkpoint", args.checkpoint)
    model = finetune.load_generate_adapter(args, model)     # --adapter: LoRA, merged
    to_ids, to_text = _codec(args.tokenizer, model.config["vocab_size"], meta, args.checkpoint)
    prompt = to_ids(args.prompt)
    if prompt.size == 0:
        raise UsageError(f"--prompt: expected text that makes at least one token, got {args.prompt!r}")
    filters = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   min_p=args.min_p)
    if args.draft is None:
        out = sample(model, prompt[None, :], args.max_new_tokens, seed=args.seed,
                     use_cache=not args.no_cache, **filters)
    else:
        draft = _draft(args, model)
        out, _ = speculative_sample(model, draft, prompt[None, :], args.max_new_tokens,
                                    args.lookahead or LOOKAHEAD, seed=args.seed, **filters)
    sys.stdout.write(to_text(out[0]) + "\n")
    return 0


def _codec(path, vocab_size, meta=None, checkpoint=None):
    """``(encode, decode)``: bytes for a byte model, else the BPE tokenizer at ``path``, whose
    vocabulary must be the model's, and which must be the one the checkpoint records."""
    if path is None:
        if vocab_size != 256:
            raise UsageError(f"--tokenizer: the model reads {vocab_size} tokens, not the 256 "
                             f"bytes; expected the tokenizer it was trained with, got none")
        return encode, decode
    tokenizer = load_tokenizer_file("--tokenizer", path)
    if tokenizer.vocab_size != vocab_size:
        raise UsageError(f"--tokenizer: expected a tokenizer of the model's {vocab_size} tokens, "
                         f"got {tokenizer.vocab_size} in {path!r}")
    if meta is not None:
        check_tokenizer(meta, tokenizer, "--tokenizer", path, "--checkpoint", checkpoint)
    return tokenizer.encode, tokenizer.decode


def _draft(args, model):
    """The ``--draft`` model: a TinyGPT checkpoint of the target's vocabulary, trained with the
    tokenizer the target reads (the 256 bytes, or ``--tokenizer``); a UsageError otherwise."""
    draft, draft_meta = load_tinygpt_file("--draft", args.draft)
    V, V_draft = model.config["vocab_size"], draft.config["vocab_size"]
    if V_draft != V:
        raise UsageError(f"--draft: expected a model of the {V} tokens --checkpoint reads, got "
                         f"{V_draft} in {args.draft!r}")
    tokenizer = None if args.tokenizer is None else \
        load_tokenizer_file("--tokenizer", args.tokenizer)
    try:
        check_tokenizer(draft_meta, tokenizer, "--tokenizer", args.tokenizer, "--draft", args.draft)
    except UsageError as e:
        raise UsageError(f"--draft: expected a model of the tokens --checkpoint reads; {e}") \
            from None
    return draft
