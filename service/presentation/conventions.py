"""One rule per number: how gains, speed-ups, backward estimates and memory are computed and
printed, the same in the campaign report, the job report, the job page and `gdnval run`.

The rules are the hand-written PR report's:
- **gain** of a candidate over a baseline = time saved, (U − P) / U, in percent (U the baseline's
  median, P the candidate's): 160.283 → 132.973 ms is 17.0%. Negative when the candidate is slower.
- **speed-up** of a backend = baseline median / this median, in × (12.65×).
- **backward estimate** = median(fwd+bwd) − median(fwd) of the medians shown beside it (a macro
  split, not a timing: never a per-rank difference reduced afterwards, which need not equal the
  difference of the shown medians).
- **growth** (weak scaling, checkpoint overhead) = (after − before) / before, in percent.
- memory a device does not track (a CPU) is "not tracked", never "0.0 MiB".
"""

from __future__ import annotations

import math

from service.presentation.numbers import fmt

NOT_TRACKED = "not tracked"
BYTE_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3}
# Device kinds whose allocator keeps no statistics: their peak-memory samples are zeros, not readings.
UNTRACKED_DEVICES = frozenset({"cpu"})


def _positive(*values: float | None) -> bool:
    return all(v is not None and math.isfinite(v) and v > 0 for v in values)


def gain(baseline: float | None, this: float | None) -> float | None:
    """Time saved against the baseline, (U − P) / U; None without two positive finite medians."""
    if not _positive(baseline, this):
        return None
    assert baseline is not None and this is not None
    return (baseline - this) / baseline


def percent(value: float | None, *, signed: bool = False) -> str:
    """A fraction as the report prints it: '17.0%' ('+17.0%' when signed), '–' for none."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def gain_text(baseline: float | None, this: float | None) -> str:
    """'17.0%' for 160.283 → 132.973 ms; '-3.2%' when slower; '–' without two medians."""
    return percent(gain(baseline, this))


def speedup(baseline: float | None, this: float | None) -> float | None:
    """Baseline median / this median; None without two positive finite medians."""
    if not _positive(baseline, this):
        return None
    assert baseline is not None and this is not None
    return baseline / this


def speedup_text(baseline: float | None, this: float | None) -> str:
    """'12.65×', always as a factor (whatever its size), '–' without two medians."""
    s = speedup(baseline, this)
    return "–" if s is None else f"{s:.2f}×"


def bwd_estimate(fwd_median: float | None, fwd_bwd_median: float | None) -> float | None:
    """median(fwd+bwd) − median(fwd) of the two shown medians; None when either is missing."""
    if fwd_median is None or fwd_bwd_median is None:
        return None
    if not (math.isfinite(fwd_median) and math.isfinite(fwd_bwd_median)):
        return None
    return fwd_bwd_median - fwd_median


def growth(before: float | None, after: float | None) -> float | None:
    """(after − before) / before: weak-scaling growth, checkpoint overhead, memory change."""
    if not _positive(before) or after is None or not math.isfinite(after):
        return None
    assert before is not None
    return (after - before) / before


def memory_tracked(device: str | None) -> bool:
    """Whether a job's device kind reports peak memory (False on a CPU: its samples are 0)."""
    return (device or "").lower() not in UNTRACKED_DEVICES


def allocator_reading(metric: str, unit: str) -> bool:
    """Whether a memory metric reads the device allocator (peaks, their growth), which an
    untracked device reports as 0, rather than measuring something else in bytes (a file)."""
    return unit.strip().lower() in BYTE_UNITS and ("peak" in metric or "growth" in metric)


def human_bytes(value: float, unit: str) -> str:
    """Memory in GiB/MiB/KiB when the unit is a byte unit, else the number with its unit."""
    scale = BYTE_UNITS.get(unit.strip().lower())
    if scale is None or value != value:
        return fmt(value, unit)
    b = value * scale
    if abs(b) >= 1024**3:
        return f"{b / 1024**3:.2f} GiB"
    if abs(b) >= 1024**2 or b == 0:
        return f"{b / 1024**2:.1f} MiB"
    if abs(b) >= 1024:
        return f"{b / 1024:.1f} KiB"
    return f"{b:.0f} B"


def memory_text(value: float | None, unit: str, *, tracked: bool = True) -> str:
    """A peak-memory reading; "not tracked" where the device keeps no statistics or none was stored."""
    if not tracked or value is None:
        return NOT_TRACKED
    return human_bytes(value, unit)
