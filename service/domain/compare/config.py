"""The thresholds of the compare rules, and the byte units a memory metric may use."""

from __future__ import annotations

from dataclasses import dataclass

from workers import verdict

MIB = 1024 * 1024
UNIT_BYTES: dict[str, float] = {
    "b": 1.0,
    "byte": 1.0,
    "bytes": 1.0,
    "kib": 1024.0,
    "mib": float(MIB),
    "gib": float(1024 * MIB),
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
}


def unit_bytes(unit: str) -> float:
    """Bytes per unit of a memory metric (so the 1 MiB rule holds whatever unit a suite uses)."""
    try:
        return UNIT_BYTES[unit.strip().lower()]
    except KeyError:
        raise ValueError(
            f"memory metric unit {unit!r} is not a byte unit; expected one of {sorted(UNIT_BYTES)}"
        ) from None


@dataclass(frozen=True)
class CompareConfig:
    """Thresholds of the rules; defaults are the issue's. Part of every result, for the record."""

    alpha: float = verdict.ALPHA  # significance level of the Mann-Whitney U test
    ci_level: float = 0.95  # bootstrap CI of the ratio of medians
    bootstrap: int = 2000  # bootstrap resamples
    seed: int = 20240611  # bootstrap seed: same inputs -> same CI, whatever else is compared
    memory_abs_bytes: float = verdict.MEMORY_MIN_BYTES  # memory regresses only above this growth
    accuracy_floor: float = verdict.ACCURACY_FLOOR  # worsened only above this absolute floor ...
    accuracy_floor_bound_frac: float = 0.1  # ... and above this fraction of the bound (if any)

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha={self.alpha!r}; expected 0 < alpha < 1")
        if not 0 < self.ci_level < 1:
            raise ValueError(f"ci_level={self.ci_level!r}; expected 0 < ci_level < 1")
        if self.bootstrap < 100:
            raise ValueError(f"bootstrap={self.bootstrap!r}; expected at least 100 resamples")
