"""The reference trajectory's file: its steps, read instead of computed, keyed by what they depend on.

A small JSON file (format `gdnval-reference-trajectory`,
version 1) with the reference's per-step loss and grad-norm and the key they belong to:
the reference side of the config (model name, overrides and the resolved model config, data
window, padding, precision, seed, learning rate, weight decay, reference backend), the optimizer's
fixed settings, the token file's sha256 and size, the device kind and the deterministic flag.
No path, host or device index is part of the key, so a file carries over between machines.
The step count is not part of it either: a file of N steps serves any run of <= N steps (the
first steps of a trajectory do not depend on how many follow). When the file exists its key must
equal this run's (`ReferenceFileMismatch` names the fields that differ) and it must hold at least
the steps asked (`ReferenceFileMismatch` too; a longer reference is computed only after the file
is deleted or another path is given: the optimizer state at the file's last step is not kept,
so the missing steps cannot be appended). When it does not exist, the computed reference is
written there (temporary file + rename) as soon as its last step is done, before the candidate
starts. Read and write happen on CP rank 0 only. Not in the key: the code of the reference side
(gdn's model and layers) and the torch version (recorded in the file, not compared); a change of
the reference's arithmetic bumps `REFERENCE_NUMERICS` (in the key), other changes need the file
deleted. The "package" corpus is built from gdn's own sources, so
with it any change under gdn/ changes the data hash and the file no longer matches; the "stdlib"
corpus (the presets' long runs) changes only with the Python version.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gdn import device as devices


class ReferenceFileMismatch(ValueError):
    """A reference file that cannot serve this run: another key, too few steps, or not one."""


@dataclass(frozen=True)
class StepRecord:
    loss: float
    grad_norm: float


REFERENCE_FORMAT = "gdnval-reference-trajectory"
REFERENCE_VERSION = 1
# In the key: bump when the reference side's arithmetic changes, so stored files stop matching
# (2: the eager GDN core computes in fp32 inside the bf16 autocast region; 1 ran its products in bf16).
REFERENCE_NUMERICS = 2
_TOKEN_HASHES: dict[tuple[str, int, int], str] = {}


def token_file_digest(token_file: str | Path) -> dict[str, Any]:
    """The token file by content: sha256 and size (hashed once per process per path/size/mtime)."""
    path = Path(token_file)
    st = path.stat()
    memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _TOKEN_HASHES:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _TOKEN_HASHES[memo] = h.hexdigest()
    return {"sha256": _TOKEN_HASHES[memo], "size": st.st_size}


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def key_differences(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """`field: file X, this run Y` for every leaf that differs (dotted names)."""
    a, b = _flatten(stored), _flatten(wanted)
    missing = object()
    return [
        f"{k}: file {a.get(k, '<absent>')!r}, this run {b.get(k, '<absent>')!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k, missing) != b.get(k, missing)
    ]


def read_reference_file(path: str | Path, key: dict[str, Any], steps: int) -> list[StepRecord]:
    """The first `steps` records of a reference file whose key equals `key`; otherwise
    `ReferenceFileMismatch` naming what differs (never a silent recompute)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReferenceFileMismatch(
            f"reference file {path} cannot be read as JSON ({exc}); delete it to compute a new one"
        ) from exc
    if not isinstance(doc, dict) or doc.get("format") != REFERENCE_FORMAT:
        raise ReferenceFileMismatch(
            f"{path} is not a reference trajectory file (format {REFERENCE_FORMAT!r})"
        )
    if doc.get("version") != REFERENCE_VERSION:
        raise ReferenceFileMismatch(
            f"reference file {path} has version {doc.get('version')!r}, this code reads {REFERENCE_VERSION}"
        )
    diffs = key_differences(doc.get("key") or {}, key)
    if diffs:
        raise ReferenceFileMismatch(
            f"reference file {path} was computed for another run; differing field(s): " + "; ".join(diffs)
        )
    records = [StepRecord(float(loss), float(gn)) for loss, gn in doc.get("records") or []]
    if len(records) < steps:
        raise ReferenceFileMismatch(
            f"reference file {path} holds {len(records)} step(s), this run asks for {steps}: run with "
            f"steps <= {len(records)}, or delete the file (or give another path) to compute {steps} steps"
        )
    return records[:steps]


def write_reference_file(
    path: str | Path,
    key: dict[str, Any],
    records: list[StepRecord],
    device: torch.device,
    seconds: float | None = None,
) -> None:
    """Write atomically: a temporary file in the same folder, then a rename."""
    path = Path(path)
    doc = {
        "format": REFERENCE_FORMAT,
        "version": REFERENCE_VERSION,
        "key": key,
        "steps": len(records),
        "records": [[r.loss, r.grad_norm] for r in records],
        # informational only (not compared): what produced it
        "produced": {
            "torch": torch.__version__,
            "device_name": devices.device_info(device).get("device_name"),
            "seconds": None if seconds is None else round(seconds, 3),  # None: not computed here
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
