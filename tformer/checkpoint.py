"""Save and load model + optimizer + config + step in one file, written atomically.

The file is a NumPy ``.npz`` archive: ``model/<name>`` for every parameter, ``optim/<key>`` for the
optimizer state, and one JSON string ``meta`` with the config, the step, the optimizer's scalars
and any extra JSON-able state (e.g. an RNG state). It is written to a temporary file in the same
folder and renamed over the target, so a crash mid-write never leaves a half-written checkpoint.
"""
import json
import os
import tempfile

import numpy as np


def _rng_state(model):
    rng = getattr(model, "rng", None)
    return rng.bit_generator.state if isinstance(rng, np.random.Generator) else None


def save_checkpoint(path, model, optimizer=None, config=None, step=0, extra=None):
    """Write ``path`` atomically (temporary file, then ``os.replace``). Returns ``path``."""
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
    arrays["meta"] = np.array(json.dumps(meta))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def read_checkpoint(path):
    """Return ``(meta, model_state, optim_state)`` from ``path`` without building anything."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"path: no checkpoint at {path!r}")
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        model_state = {k[6:]: z[k] for k in z.files if k.startswith("model/")}
        optim_state = dict(meta["optim_scalars"])
        optim_state.update({k[6:]: z[k] for k in z.files if k.startswith("optim/")})
    return meta, model_state, optim_state


def load_checkpoint(path, model, optimizer=None, config=None):
    """Load ``path`` into ``model`` (and ``optimizer``); returns the metadata dict (config, step, extra).

    The stored config must equal ``config`` (default: ``model.config``); a checkpoint made for
    another configuration raises ValueError listing the keys that differ.
    """
    meta, model_state, optim_state = read_checkpoint(path)
    want = dict(config if config is not None else getattr(model, "config", {}))
    have = meta["config"]
    if want and json.loads(json.dumps(want)) != have:
        keys = sorted(k for k in set(want) | set(have) if json.loads(json.dumps(want.get(k))) != have.get(k))
        diff = ", ".join(f"{k}: checkpoint {have.get(k)!r} vs model {want.get(k)!r}" for k in keys)
        raise ValueError(f"checkpoint {path!r} was made for another configuration ({diff})")
    model.load_state_dict(model_state)
    if optimizer is not None:
        optimizer.load_state_dict(optim_state)
    if meta.get("rng_state") is not None and isinstance(getattr(model, "rng", None), np.random.Generator):
        model.rng.bit_generator.state = meta["rng_state"]
    return meta
