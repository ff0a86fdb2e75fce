"""A preset on a device that cannot run the backend it names: one rule for every suite.

On device `npu` a preset's backends are replaced by the backends that declare `npu`
(`DEVICE_BACKENDS`): our Triton kernels through triton-ascend, and the eager core, the reference.
FLA and FlashQLA need CUDA, so a preset naming them runs Triton there instead. The rule reads the
parameters every suite names its backends by:

- `backend`, `baseline`, `<side>_backend` (a string): replaced by the device's first backend;
- `backends` (a sequence): filtered to the device's backends (the first one when none is left);
- `candidates` (a sequence of "<mode>+<backend>"): each backend replaced, duplicates dropped.

It applies to the preset's values (its own and the schema defaults), never to a parameter the
caller sets: an explicit `backend=triton` on npu stays, and fails with the device's reason.
Triton is never swapped for eager: whether the NPU host can run it (triton-ascend installed) is
answered on the rank, before any case, by the backend's own capability check (`device_refusal`);
a job that cannot run it fails there, naming triton-ascend. Imports no torch at import time (the
service reads presets on a head node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Backends that run on a device, by device kind; a kind missing here runs every backend.
DEVICE_BACKENDS: dict[str, tuple[str, ...]] = {"npu": ("triton", "eager")}
# A problem every declared backend supports: the device question is asked with it.
PROBE_SHAPE = (1, 64, 1, 1, 128, 128)


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


def device_refusal(backends: Sequence[str], device: Any) -> str | None:
    """Why a job on `device` (a torch device or its name) cannot start: the first backend it
    names whose capability check refuses the device itself, with that check's reason; None on
    devices without a backend list, and when every backend can run there."""
    kind = str(device).partition(":")[0]
    if kind not in DEVICE_BACKENDS:
        return None
    import torch

    from gdn.backends import get_backend
    from gdn.ops import GDNShape

    for name in backends:
        why = get_backend(name).check(GDNShape(*PROBE_SHAPE), torch.bfloat16, torch.device(device))
        if why is not None:
            return f"backend {name!r} cannot run on {kind}: {why}"
    return None
