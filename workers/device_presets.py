"""A preset on a device that cannot run the backend it names: one rule for every suite.

Our Triton kernels run on CUDA (and on CPU under the interpreter), not on an Ascend NPU, where
Triton is not even installed. So on device `npu` a preset's backends are replaced by the
backends that declare `npu` (`DEVICE_BACKENDS`: the eager core today; an Ascend backend, e.g.
FLA's triton_ascend or ours ported to triton-ascend, adds itself to that entry when it is
registered). The rule reads the parameters every suite names its backends by:

- `backend`, `baseline`, `<side>_backend` (a string): replaced by the device's first backend;
- `backends` (a sequence): filtered to the device's backends (the first one when none is left);
- `candidates` (a sequence of "<mode>+<backend>"): each backend replaced, duplicates dropped.

It applies to the preset's values (its own and the schema defaults), never to a parameter the
caller sets: an explicit `backend=triton` on npu stays, and fails with the device's reason.
Imports no torch (the service reads presets on a head node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Backends that run on a device, by device kind; a kind missing here runs every backend.
DEVICE_BACKENDS: dict[str, tuple[str, ...]] = {"npu": ("eager",)}


def _dedupe(items: list[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(items))


def adapt_preset(values: Mapping[str, Any], device: str | None) -> dict[str, Any]:
    """`values` with every backend the device cannot run replaced by one it can (see module doc)."""
    allowed = DEVICE_BACKENDS.get(device or "")
    out = dict(values)
    if not allowed:
        return out
    for key, value in values.items():
        if (key in ("backend", "baseline") or key.endswith("_backend")) and isinstance(value, str):
            out[key] = value if value in allowed else allowed[0]
        elif key == "backends" and isinstance(value, Sequence) and not isinstance(value, str):
            kept = [b for b in value if b in allowed]
            out[key] = _dedupe(kept or [allowed[0]])
        elif key == "candidates" and isinstance(value, Sequence) and not isinstance(value, str):
            mapped = []
            for cand in value:
                mode, sep, backend = str(cand).partition("+")
                mapped.append(cand if not sep or backend in allowed else f"{mode}+{allowed[0]}")
            out[key] = _dedupe(mapped)
    return out
