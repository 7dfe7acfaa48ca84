"""Does a ``run tinygpt`` fit in memory? Fitting in memory's prediction of a step's peak
(``tformer.training.step_memory``), checked before anything is allocated, and the flags that would make a
run that does not fit, fit: ``--attention flash``, ``--gradient-checkpointing``, a smaller
``--batch-size``.
The vocabulary counts too (``--bpe V``: the embedding, the LM head and the (B, T, V) logits).
"""
from tformer.training.step_memory import available_bytes, gib, step_peak_bytes, training_bytes

VOCAB = 256                                                      # bytes are TinyGPT's tokens


def run_bytes(args, **change):
    """Predicted peak of a ``run tinygpt`` with ``args`` (some changed; ``vocab_size`` default
    256): one step's peak plus the parameters, gradients and AdamW moments, in float32."""
    a = {**vars(args), **change}
    V = a.get("vocab_size") or VOCAB
    C, L, T, H = a["d_model"], a["n_layers"], a["max_len"], a["n_heads"]
    d_ff = a["d_ff"] or 4 * C
    k = a["blocks_per_segment"] if a["gradient_checkpointing"] else 0
    params = L * (4 * C * C + 2 * C * d_ff + 9 * C + d_ff) + (V + T) * C + C * V
    return (step_peak_bytes(a["batch_size"], T, C, H, d_ff, L, V, k, a["attention"])
            + training_bytes(params))


def largest_batch(args, available, **change):
    """The largest ``--batch-size`` that fits (with ``change``), or None if not even 1 does."""
    lo, hi = 0, args.batch_size
    while lo < hi:                                               # the prediction grows with B
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if run_bytes(args, batch_size=mid, **change) <= available else \
            (lo, mid - 1)
    return lo or None


def check_fits(args, available=None, vocab_size=VOCAB):
    """ValueError naming the flags if the predicted peak exceeds the memory available now (a
    vocabulary of ``vocab_size`` tokens)."""
    from argparse import Namespace
    args = Namespace(**{**vars(args), "vocab_size": vocab_size})
    available = available_bytes() if available is None else available
    need = run_bytes(args)
    if available is None or need <= available:
        return
    ways = []
    flash = {"attention": "flash"} if args.attention == "plain" else {}
    ckpt = {"gradient_checkpointing": True} if not args.gradient_checkpointing else {}
    for change, flags in ((flash, "--attention flash"), (ckpt, "--gradient-checkpointing")):
        if change and run_bytes(args, **change) <= available:
            ways.append(f"{flags} ({gib(run_bytes(args, **change))})")
    both = " --attention flash --gradient-checkpointing"
    if not ways and flash and ckpt and run_bytes(args, **flash, **ckpt) <= available:
        ways.append(f"{both[1:]} ({gib(run_bytes(args, **flash, **ckpt))})")
    for change, flags in (({}, ""), ({**flash, **ckpt}, both)):
        B = largest_batch(args, available, **change)
        if B is not None:
            if not ways or not flags:
                ways.append(f"--batch-size {B}{flags} "
                            f"({gib(run_bytes(args, batch_size=B, **change))})")
            break
    fix = ("it would fit with " + ", or ".join(ways) if ways else
           "not even --batch-size 1 --attention flash --gradient-checkpointing fits: a smaller "
           "--max-len, --d-model or --n-layers")
    raise ValueError(f"--max-len, --batch-size: expected a run whose predicted peak (the count of "
                     f"a training step of the chapter Fitting in memory, "
                     f"tformer.training.step_memory) fits in the "
                     f"{gib(available)} available, got {gib(need)} for B={args.batch_size}, "
                     f"T={args.max_len}, C={args.d_model}, L={args.n_layers}, "
                     f"V={vocab_size}, {args.attention} attention; {fix}")
