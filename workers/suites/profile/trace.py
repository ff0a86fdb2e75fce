"""What a profiler trace says about communication: collective time per family, the time spent
communicating and computing, and how much of the communication ran under compute. Torch-free:
it reads the Chrome trace's event list (`traceEvents`, times in µs).

Which events are which:
- communication: a device's collective kernels (`nccl…`, `hccl…`) when the trace has device
  kernels; otherwise the host's collective work, gloo's (`gloo:all_gather` on its worker
  threads, `gloo:send` on the caller's); otherwise the `c10d::` operators themselves;
- compute: the device's other kernels; on a host-only trace the `aten::` operators outside the
  communication.
Overlap is the time when both ran (the union of one intersected with the union of the other),
its share the part of the communication time it hides. On a CPU the collectives of the CP
layer block the calling thread, so only FSDP's background gathers can overlap.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FAMILIES: tuple[tuple[str, str], ...] = (
    ("send_recv", r"send|recv"),
    ("all_to_all", r"all_?to_?all"),
    ("all_gather", r"all_?gather"),
    ("reduce_scatter", r"reduce_?scatter"),
    ("all_reduce", r"all_?reduce"),
    ("broadcast", r"broadcast"),
)
OTHER = "other"
DEVICE_COMM = re.compile(r"^(nccl|hccl)", re.I)
HOST_COMM = re.compile(r"^gloo:")
OPERATOR_COMM = re.compile(r"^c10d::")
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

Interval = tuple[float, float]


def family(name: str) -> str:
    """The collective family of an event name ('gloo:all_gather' -> 'all_gather')."""
    low = name.lower()
    return next((f for f, pattern in FAMILIES if re.search(pattern, low)), OTHER)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Disjoint intervals covering the same time, in order."""
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(intervals: Sequence[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersection(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Time covered by both sets of disjoint, ordered intervals."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass
class TraceSummary:
    """A trace's communication (ms, calls per family), compute and their overlap (ms)."""

    source: str  # which events were communication: "device", "host" or "operators" (or "none")
    comm_ms: float
    compute_ms: float
    overlap_ms: float
    family_ms: dict[str, float] = field(default_factory=dict)
    family_calls: dict[str, int] = field(default_factory=dict)

    @property
    def overlap_share(self) -> float | None:
        return self.overlap_ms / self.comm_ms if self.comm_ms > 0 else None


def _span(e: Mapping[str, Any]) -> Interval:
    start = float(e["ts"])
    return start, start + float(e.get("dur") or 0.0)


def summarise_trace(events: Sequence[Mapping[str, Any]]) -> TraceSummary:
    """The summary of one rank's trace events (complete events, `ph` "X", only)."""
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e and isinstance(e.get("name"), str)]
    device = [e for e in complete if e.get("cat") in DEVICE_CATEGORIES]
    if device:
        comm = [e for e in device if DEVICE_COMM.match(e["name"])]
        source = "device"
        compute = [_span(e) for e in device if not DEVICE_COMM.match(e["name"])]
    else:
        comm = [e for e in complete if HOST_COMM.match(e["name"])]
        source = "host"
        if not comm:
            comm = [e for e in complete if OPERATOR_COMM.match(e["name"])]
            source = "operators"
        busy = {e.get("tid"): union(_span(x) for x in comm if x.get("tid") == e.get("tid")) for e in comm}
        compute = [
            _span(e)
            for e in complete
            if e["name"].startswith("aten::") and not intersection(busy.get(e.get("tid"), []), [_span(e)])
        ]
    if not comm:
        return TraceSummary("none", 0.0, length(union(compute)) / 1e3, 0.0)
    comm_u, compute_u = union(_span(e) for e in comm), union(compute)
    summary = TraceSummary(
        source, length(comm_u) / 1e3, length(compute_u) / 1e3, intersection(comm_u, compute_u) / 1e3
    )
    for e in comm:
        f = family(e["name"])
        summary.family_ms[f] = summary.family_ms.get(f, 0.0) + float(e.get("dur") or 0.0) / 1e3
        summary.family_calls[f] = summary.family_calls.get(f, 0) + 1
    return summary
