"""``python -m tformer quantize CHECKPOINT --out FILE [--scheme {w8,w8a8}]``: int8 post-training quantization.

Reads a float checkpoint written by ``python -m tformer run tinygpt`` (or ``run transformer``),
quantizes every Linear layer, the LM head and the embedding tables to int8 (``tformer.decoding.quantize``),
and writes an inference-only checkpoint that ``load_checkpoint`` and ``python -m tformer generate
--checkpoint FILE`` accept. It prints the file's size against the float32 files and, for TinyGPT,
the validation bits/byte and the generation speed of the float32 and the quantized model.

The validation bytes are those of the corpus the checkpoint records it was trained on (``run
tinygpt`` records its ``data``: ``--text``, or ``--corpus python`` / ``shakespeare``, with its split
and seed). A checkpoint that records none (a ``finetune`` output, tuned on preference pairs, or a
file of an older run) gets no bits/byte: the command says so rather than score the model on a
corpus it may never have seen.
"""
import io
import os
import time

import numpy as np

from tformer.training.checkpoint import load_checkpoint, read_checkpoint
from tformer.data.shakespeare import shakespeare_data
from tformer.data.text import TextData, bits_per_byte, encode, evaluate_loss
from tformer.decoding.generate import sample
from tformer.models.tinygpt import TinyGPT
from tformer.models.transformer import Transformer
from tformer.decoding.quantize import SCHEMES, quantize_model, save_quantized
from tformer.runs.files import MALFORMED, read_checkpoint_file
from tformer.runs.flag_groups import (REQUIRED, Flag, add_output_flags, add_sampling_flags,
                                      add_training_flags)
from tformer.runs.flags import UsageError
from tformer.runs.declare import reads, writes

EXPECTED = "a float checkpoint saved by `python -m tformer run tinygpt` or `run transformer`"


def add_arguments(p):
    """The quantize command's flags."""
    p.add_argument("checkpoint", help="a float32 checkpoint (python -m tformer run tinygpt / transformer)")
    add_output_flags(p, out=Flag(REQUIRED, "where to write the quantized checkpoint"))
    p.add_argument("--scheme", choices=SCHEMES, default="w8",
                   help="w8: int8 weights; w8a8: int8 weights and per-token int8 activations")
    add_training_flags(p, eval_windows=Flag(None, "TinyGPT: validation windows to score (default: "
                                                  "as many as the run used)"))
    add_sampling_flags(p, gen_tokens=Flag(64, "TinyGPT: bytes generated to time generation"))


def files(args):
    """What the command reads and writes (``tformer.runs.declare``)."""
    return [reads("CHECKPOINT", args.checkpoint), writes("--out", args.out)]


def check_args(args):
    """The checkpoint is a float one."""
    try:
        read_checkpoint_file("CHECKPOINT", args.checkpoint, EXPECTED)
    except UsageError as e:
        raise ValueError(str(e)) from None


def model_from_config(config):
    """Rebuild an untrained model from a checkpoint's config: Transformer (it has ``pad_idx``) or TinyGPT."""
    if "pad_idx" in config:
        return Transformer(**config)
    return TinyGPT(**config)


def load_float(path):
    """``(model, meta)``: the float model stored in ``path`` (ValueError if it is already quantized)."""
    meta = read_checkpoint(path)[0]
    if "quantized" in meta:
        raise ValueError(f"checkpoint: {path!r} is already quantized ({meta['quantized']['scheme']})")
    model = model_from_config(meta["config"])
    return model, load_checkpoint(path, model)



def float32_weights_bytes(model):
    """Size of the model's float32 parameters alone in the checkpoint format (no optimizer state)."""
    buf = io.BytesIO()
    np.savez(buf, **{f"model/{k}": v.astype(np.float32) for k, v in model.state_dict().items()})
    return buf.getbuffer().nbytes


def training_data(meta):
    """The ``data`` record of the run that trained the checkpoint (``run tinygpt`` saves it), or
    None when the checkpoint records none (a ``finetune`` output, an older file)."""
    record = (meta.get("extra") or {}).get("data")
    return record if isinstance(record, dict) else None


def unscored_reason(meta):
    """Why the validation bits/byte of a checkpoint with no ``data`` record is not measured."""
    tuned = (meta.get("extra") or {}).get("finetune")
    if isinstance(tuned, dict):
        return (f"is a `finetune` output, tuned on the preference pairs "
                f"{tuned.get('pairs', '?')!r} from {tuned.get('base', '?')!r}, and records no text "
                f"corpus it was trained on")
    return ("records no corpus it was trained on (no `data` of `run tinygpt`), and bits/byte on "
            "another would not be its validation loss")


def tinygpt_val_data(meta, eval_windows=None):
    """The validation windows the TinyGPT run scored: its ``data`` settings, saved in the
    checkpoint (``--text``, or the ``--corpus`` of the standard library or Shakespeare)."""
    d = dict(text=None, corpus="python", block_size=meta["config"]["max_len"], batch_size=64,
             val_fraction=0.1, seed=0, eval_windows=128)
    d.update(training_data(meta) or {})
    args = (d["block_size"], d["batch_size"], d["val_fraction"], d["seed"])
    if d["text"]:
        data = TextData.from_file(d["text"], *args)
    elif d["corpus"] == "shakespeare":
        data = shakespeare_data(*args)
    else:
        data = TextData.from_stdlib(*args)
    return data.windows("val", eval_windows or d["eval_windows"])


def val_bpb(model, windows):
    """Validation bits/byte of ``model`` on ``windows = (x, y)``."""
    return bits_per_byte(evaluate_loss(model, *windows))


def tokens_per_second(model, n_tokens, prompt="def ", seed=0):
    """Bytes per second of ``sample`` (KV cache on), one sequence, ``n_tokens`` new bytes."""
    t = time.perf_counter()
    sample(model, encode(prompt)[None, :], n_tokens, temperature=0.8, seed=seed)
    return n_tokens / (time.perf_counter() - t)


def _inputs(args):
    """``(model, meta, windows, quantized model)``: everything read and built before ``--out``
    is written; a UsageError naming what is wrong."""
    try:
        model, meta = load_float(args.checkpoint)
        qmodel = quantize_model(load_float(args.checkpoint)[0], args.scheme)
    except MALFORMED as e:
        raise UsageError(f"CHECKPOINT: expected {EXPECTED}, got {args.checkpoint!r}: "
                         f"{str(e).removeprefix('path: ')}") from None
    windows = None
    if _scored(model) and training_data(meta) is not None:
        try:
            windows = tinygpt_val_data(meta, args.eval_windows)
        except MALFORMED as e:
            raise UsageError(f"CHECKPOINT: expected the text {args.checkpoint!r} was trained on "
                             f"to be readable, as it was: {e}") from None
    return model, meta, windows, qmodel


def _corpus_name(record):
    """The corpus of a ``data`` record, as the validation line names it."""
    if record.get("text"):
        return f"the text {record['text']!r}"
    return f"the {record.get('corpus') or 'python'} corpus"


def _scored(model):
    """Whether the validation bytes and generation are measured: a TinyGPT of the 256 bytes (a
    model of BPE tokens gets its size measured only)."""
    return isinstance(model, TinyGPT) and model.config.get("vocab_size") == 256


def main(args):
    model, meta, windows, qmodel = _inputs(args)
    f32_bytes = float32_weights_bytes(model)
    ckpt_bytes = os.path.getsize(args.checkpoint)
    is_gpt = _scored(model)
    if windows is not None:
        bpb_f = val_bpb(model, windows)
    if is_gpt:
        tps_f = tokens_per_second(model, args.gen_tokens)
    extra = {"source": os.path.basename(args.checkpoint), "float32_weights_bytes": f32_bytes}
    if "tokenizer" in (meta.get("extra") or {}):
        extra["tokenizer"] = meta["extra"]["tokenizer"]
    save_quantized(args.out, qmodel, meta.get("step", 0), extra=extra)
    q_bytes = os.path.getsize(args.out)
    print(f"{args.scheme}: {args.out} is {q_bytes:,} bytes: {100 * q_bytes / f32_bytes:.1f}% of the "
          f"float32 weights ({f32_bytes:,} bytes), {100 * q_bytes / ckpt_bytes:.1f}% of the training "
          f"checkpoint {args.checkpoint} ({ckpt_bytes:,} bytes, optimizer state included)")
    if windows is not None:
        bpb_q = val_bpb(qmodel, windows)
        print(f"validation: float32 {bpb_f:.4f} bits/byte, {args.scheme} {bpb_q:.4f} bits/byte "
              f"({100 * (bpb_q / bpb_f - 1):+.2f}%) on {windows[0].shape[0]} windows of "
              f"{_corpus_name(training_data(meta))}")
    elif is_gpt:
        print(f"validation: not measured: {args.checkpoint} {unscored_reason(meta)}")
    if is_gpt:
        tps_q = tokens_per_second(qmodel, args.gen_tokens)
        print(f"generation: float32 {tps_f:.0f} bytes/s, {args.scheme} {tps_q:.0f} bytes/s "
              f"({args.gen_tokens} bytes, KV cache)")
    return 0
