"""Save and load model + optimizer + config + step in one file, written atomically.

The file is a NumPy ``.npz`` archive: ``model/<name>`` for every parameter, ``optim/<key>`` for the
optimizer state, and one JSON string ``meta`` with the config, the step, the optimizer's scalars,
the mixed-precision state (the loss scaler's S and counters) and any extra JSON-able state (e.g.
an RNG state). It is written to a temporary file in the same folder and renamed over the target,
so a crash mid-write never leaves a half-written checkpoint. The int8 checkpoints of
``tformer.decoding.quantize`` are read with ``read_npz`` too (their ``meta`` holds a ``quantized`` entry),
but loaded by that module (``load_model`` loads either kind): this one knows nothing above it.
"""
import json
import os
import zipfile
import zlib

import numpy as np

from tformer.core.atomic import atomic_open


# Config keys that choose how the same function is computed, not which function: the attention
# kernel (plain or online softmax) and activation recomputation. A checkpoint loads into a model
# that differs from it only in these, and a checkpoint saved before a key existed loads too.
RUNTIME_KEYS = frozenset({"attention", "gradient_checkpointing", "blocks_per_segment"})


def config_differences(want, have):
    """The keys whose values differ between two configs (compared as JSON), ``RUNTIME_KEYS`` aside."""
    want, have = json.loads(json.dumps(dict(want))), json.loads(json.dumps(dict(have)))
    return sorted(k for k in (set(want) | set(have)) - RUNTIME_KEYS if want.get(k) != have.get(k))


def check_config(path, want, have):
    """ValueError listing the keys if checkpoint ``path``'s config ``have`` is not ``want`` (an
    empty ``want`` checks nothing)."""
    keys = config_differences(want, have) if want else []
    if keys:
        diff = ", ".join(f"{k}: checkpoint {have.get(k)!r} vs model {want.get(k)!r}" for k in keys)
        raise ValueError(f"checkpoint {path!r} was made for another configuration ({diff})")


def _rng_state(model):
    rng = getattr(model, "rng", None)
    return rng.bit_generator.state if isinstance(rng, np.random.Generator) else None


def save_checkpoint(path, model, optimizer=None, config=None, step=0, extra=None, precision=None):
    """Write ``path`` atomically (temporary file, then ``os.replace``). Returns ``path``.

    ``precision``: a ``tformer.training.precision.MixedPrecision`` whose state (precision, loss scaler) is
    saved too; the parameters saved are the model's float32 masters either way."""
    config = dict(config if config is not None else getattr(model, "config", {}))
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    opt_scalars = {}
    if optimizer is not None:
        for k, v in optimizer.state_dict().items():          # a flat dict: arrays and scalars
            if isinstance(v, np.ndarray):
                arrays[f"optim/{k}"] = v
            else:
                opt_scalars[k] = v
    meta = {"config": config, "step": int(step), "optim_scalars": opt_scalars,
            "rng_state": _rng_state(model), "extra": extra or {}}
    if precision is not None:
        meta["precision"] = precision.state_dict()
    arrays["meta"] = np.array(json.dumps(meta))
    return write_npz(path, arrays)


def write_npz(path, arrays):
    """``np.savez(path, **arrays)`` written atomically: a temporary file in the same folder, then
    renamed over ``path``. Returns ``path``."""
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def read_npz(path):
    """``(meta, arrays)``: the JSON ``meta`` and every other array of the ``.npz`` at ``path``, all
    read (so every member's CRC-32 is checked).

    A missing file raises FileNotFoundError. Anything else that is not a checkpoint raises a
    ValueError that names the file and says what is wrong with it: not a zip archive (truncated,
    or another format), a member that is corrupt or cut short, a member holding pickled Python
    objects (refused before it is read: unpickling can run arbitrary code, and a checkpoint holds
    only numeric arrays and one JSON string), or no JSON ``meta`` entry."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"path: no checkpoint at {path!r}")
    if os.path.isdir(path):
        raise ValueError(f"path: {path!r} is a folder, not a checkpoint file")
    where = f"path: {path!r} is not a readable checkpoint"
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{where}: it is not a zip (.npz) archive; the file is truncated (its "
                         f"size is {os.path.getsize(path)} bytes) or in another format")
    try:
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                _refuse_objects(zf, name, where)
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as e:
        raise ValueError(f"{where}: a member is corrupt or cut short ({type(e).__name__}: {e})") from e
    except ValueError as e:
        if str(e).startswith("path: "):
            raise
        raise ValueError(f"{where}: a member is not a NumPy array ({e})") from e
    if "meta" not in arrays:
        raise ValueError(f"{where}: it has no 'meta' entry (members: {sorted(arrays)[:8]})")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: its 'meta' entry is not JSON ({e})") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: its 'meta' entry is JSON but not an object "
                         f"(got {type(meta).__name__})")
    return meta, arrays


def _refuse_objects(zf, name, where):
    """Read the ``.npy`` header of member ``name`` (not its data) and refuse an object dtype."""
    with zf.open(name) as f:
        try:
            version = np.lib.format.read_magic(f)
            header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                      else np.lib.format.read_array_header_2_0)(f)
        except ValueError as e:
            raise ValueError(f"{where}: member {name!r} is not a NumPy array ({e})") from e
    if header[2].hasobject:
        raise ValueError(f"{where}: member {name!r} holds pickled Python objects (dtype "
                         f"{header[2]}); they are never loaded, since unpickling can run "
                         f"arbitrary code, and a checkpoint holds only numeric arrays and JSON")


def read_checkpoint(path):
    """Return ``(meta, model_state, optim_state)`` from ``path`` without building anything."""
    meta, arrays = read_npz(path)
    model_state = {k[6:]: v for k, v in arrays.items() if k.startswith("model/")}
    optim_state = dict(meta.get("optim_scalars", {}))
    optim_state.update({k[6:]: v for k, v in arrays.items() if k.startswith("optim/")})
    return meta, model_state, optim_state


def load_checkpoint(path, model, optimizer=None, config=None, precision=None):
    """Load ``path`` into ``model`` (and ``optimizer``); returns the metadata dict (config, step, extra).

    The stored config must equal ``config`` (default: ``model.config``); a checkpoint made for
    another configuration raises ValueError listing the keys that differ.
    ``precision``: a ``MixedPrecision`` attached to ``model``: its loss scaler continues from the
    saved state (if the run was saved in the same precision) and its copies are refreshed.
    A quantized checkpoint (``python -m tformer quantize``) is refused with a ValueError: it holds
    no optimizer state, and ``tformer.decoding.quantize.load_model`` loads it (or a float one) for inference.
    """
    meta, model_state, optim_state = read_checkpoint(path)
    if "quantized" in meta:
        raise ValueError(f"path: {path!r} is a quantized checkpoint (inference only): it holds no "
                         f"optimizer or precision state; load it with tformer.decoding.quantize.load_model")
    check_config(path, dict(config if config is not None else getattr(model, "config", {})),
                 meta["config"])
    model.load_state_dict(model_state)
    if optimizer is not None:
        optimizer.load_state_dict(optim_state)
    if precision is not None:
        if meta.get("precision") is not None:
            precision.load_state_dict(meta["precision"])
        else:
            precision.refresh()
    if meta.get("rng_state") is not None and isinstance(getattr(model, "rng", None), np.random.Generator):
        model.rng.bit_generator.state = meta["rng_state"]
    return meta
