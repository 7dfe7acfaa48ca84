"""The LoRA adapter file: the adapters alone, tied to the base model they were trained on.

A ``.npz`` archive written atomically (``tformer.training.checkpoint.write_npz``): ``lora/<layer>.A`` and
``lora/<layer>.B`` for every adapted layer, and one JSON ``meta`` with the format, r, α, the
targets, the adapted layers, the base model's configuration and its **fingerprint**: the SHA-256
of the base parameters (every parameter but the adapters, in the model's order, as float32 with
its shape). A few kilobytes where the model is megabytes; loading it onto any other base model
(another seed, other training, other shape) is refused, since A and B only mean something as an
update of the W they were trained against.
"""
import json

import numpy as np

from tformer.training.checkpoint import read_npz, write_npz
from tformer.nn.lora import Adapters, apply_lora, fingerprint

FORMAT = "tformer-lora-adapter"
VERSION = 1


def save_adapter(path, model):
    """Write the adapters of ``model`` (after ``apply_lora``) to ``path``; returns ``path``."""
    lora = getattr(model, "lora", None)
    if not lora:
        raise ValueError("model: has no LoRA adapters to save (apply_lora first)")
    arrays = {f"lora/{name}": p for name, p, _ in Adapters(model).named_parameters()}
    meta = {"format": FORMAT, "version": VERSION, "r": lora["r"], "alpha": lora["alpha"],
            "targets": lora["targets"], "layers": lora["layers"],
            "base_fingerprint": fingerprint(model), "base_config": getattr(model, "config", {})}
    arrays["meta"] = np.array(json.dumps(meta))
    return write_npz(path, arrays)


# The entries of an adapter file's meta, and the type each must have.
META = {"r": int, "alpha": (int, float), "targets": list, "layers": list, "base_fingerprint": str}


def read_adapter(path):
    """``(meta, {name: array})`` of the adapter file at ``path``; ValueError naming ``path`` if
    it is not one (a checkpoint, say), lacks an entry of its meta or an array of its layers, or
    holds NaN or infinite numbers."""
    meta, arrays = read_npz(path)
    if meta.get("format") != FORMAT:
        raise ValueError(f"path: {path!r} is not a LoRA adapter file (its meta has format "
                         f"{meta.get('format')!r}, expected {FORMAT!r}); a checkpoint is not one")
    for key, kind in META.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise ValueError(f"path: the adapter {path!r} has no valid {key!r} in its meta "
                             f"(got {meta.get(key)!r:.40})")
    adapters = {k[5:]: v for k, v in arrays.items() if k.startswith("lora/")}
    want = {f"{layer}.{m}" for layer in meta["layers"] if isinstance(layer, str) for m in "AB"}
    if set(adapters) != want:
        raise ValueError(f"path: the adapter {path!r} holds arrays {sorted(adapters)[:4]}, its "
                         f"meta's layers need {sorted(want)[:4]}")
    for name, a in adapters.items():
        if not np.issubdtype(a.dtype, np.floating) or not np.isfinite(a).all():
            raise ValueError(f"path: the adapter {path!r} holds NaN, infinite or non-float "
                             f"values in {name!r}")
    return meta, adapters


def load_adapter(path, model):
    """Put the adapters of ``path`` on ``model`` (a base model without adapters), in place;
    returns the file's meta. ValueError naming ``path`` if the file was made for another base
    model (its fingerprint differs from the model's)."""
    meta, arrays = read_adapter(path)
    have = fingerprint(model)
    if meta["base_fingerprint"] != have:
        raise ValueError(f"path: the adapter {path!r} was trained on another base model: its base "
                         f"fingerprint is {meta['base_fingerprint'][:12]}…, this model's is "
                         f"{have[:12]}… (load the base checkpoint it was trained on)")
    layers = apply_lora(model, meta["r"], meta["alpha"], meta["targets"])
    if layers != meta["layers"]:
        raise ValueError(f"path: the adapter {path!r} adapts layers {meta['layers']}, its targets "
                         f"name {layers} in this model")
    Adapters(model).load_state_dict(arrays)
    return meta
