"""A training history written to a file a reader can plot: JSON lines or CSV, written atomically.

One row per logged step: ``step``, ``loss``, ``lr``, ``grad_norm`` (the global norm ‖g‖ before
clipping), ``clip_ratio`` (min(1, c/‖g‖)), ``time`` (seconds since the start), ``loss_scale`` under
fp16, and the evaluation metrics of that step (``eval_<name>``) where there was an evaluation.
A name ending in ``.csv`` gives CSV (one header line, empty cells where a row has no value);
anything else gives JSON lines (one object per line; a missing value is absent, a NaN is null).
The file is written whole to a temporary file in the same folder, flushed, synced and renamed over
the target, so a reader never sees half a file, even while a run rewrites it at each checkpoint.
"""
import csv
import io
import json
import os

from tformer.core.atomic import atomic_open, jsonable

STEP_KEYS = ("step", "loss", "lr", "grad_norm", "clip_ratio", "time", "loss_scale")


def history_rows(hist):
    """The history dict of ``tformer.training.train.train`` as a list of row dicts, one per logged step."""
    steps = hist.get("step", [])
    rows = []
    for i, step in enumerate(steps):
        row = {k: hist[k][i] for k in STEP_KEYS if k in hist and i < len(hist[k])}
        rows.append(row)
    at = {row["step"]: row for row in rows}
    for step, metrics in hist.get("eval", []):
        row = at.get(step)
        if row is None:                              # evaluated at a step that was not logged
            row = at[step] = {"step": step}
            rows.append(row)
        row.update({f"eval_{k}": v for k, v in metrics.items()})
    return sorted(rows, key=lambda r: r["step"])


def format_history(hist, fmt):
    """The text of the history in ``fmt`` (``"csv"`` or ``"jsonl"``)."""
    rows = [jsonable(row) for row in history_rows(hist)]
    if fmt == "jsonl":
        return "".join(json.dumps(row) + "\n" for row in rows)
    if fmt != "csv":
        raise ValueError(f"fmt: expected 'csv' or 'jsonl', got {fmt!r}")
    columns = [k for k in STEP_KEYS if any(k in r for r in rows)]
    columns += sorted({k for r in rows for k in r} - set(columns))
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def write_history(path, hist):
    """Write ``hist`` to ``path`` atomically (CSV if the name ends in ``.csv``, else JSON lines);
    returns ``path``."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"path: expected a file name, got {path!r}")
    fmt = "csv" if os.fspath(path).lower().endswith(".csv") else "jsonl"
    text = format_history(hist, fmt)
    with atomic_open(path, "w", newline="") as f:
        f.write(text)
    return path


def read_history(path):
    """The rows of a file written by ``write_history`` (CSV values parsed as floats where they can be)."""
    with open(path, newline="") as f:
        if os.fspath(path).lower().endswith(".csv"):
            return [{k: _parse(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
        return [json.loads(line) for line in f if line.strip()]


def _parse(v):
    try:
        x = float(v)
    except ValueError:
        return v
    return int(x) if x.is_integer() and "." not in v and "e" not in v.lower() else x
