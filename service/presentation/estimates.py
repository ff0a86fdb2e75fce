"""A number the report derives from several runs' medians (a per-layer cost, a fixed cost, a
share of a saving, a ratio from one length to another), with its bootstrap interval, and the
words the report uses for it.

The interval is the compare rules' percentile bootstrap (`service.domain.compare.time_stats`:
`resampled_medians`, `percentile_interval`), with their resample count, level and seed
(`CompareConfig`): each run's samples are resampled on their own, the derived quantity is
recomputed from every resample's medians, and the same inputs always give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from service.domain.compare.config import CompareConfig
from service.domain.compare.time_stats import percentile_interval, resampled_medians

CONFIG = CompareConfig()
NOT_ZERO = "not distinguishable from zero"
NO_CHANGE = "no change the data can support"
MIN_SAMPLES = 2  # a run with fewer gives no interval (every resample of one value is that value)

# maps medians of shape (..., runs) to the derived quantity, shape (...)
Derived = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Estimate:
    """A derived value and its interval at `level`; `low`/`high` NaN when there is none."""

    value: float
    low: float
    high: float
    level: float = CONFIG.ci_level

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def excludes(self, x: float) -> bool:
        """Whether the interval lies wholly above or wholly below `x` (False without one)."""
        return self.has_interval and (self.low > x or self.high < x)

    def text(self, fmt: Callable[[float], str]) -> str:
        """'estimate [low, high]', or 'estimate (no interval)' where a run has fewer than
        `MIN_SAMPLES` samples or the resampled values are not finite."""
        if not self.has_interval:
            return f"{fmt(self.value)} (no interval)"
        return f"{fmt(self.value)} [{fmt(self.low)}, {fmt(self.high)}]"

    def against_zero(self, fmt: Callable[[float], str]) -> str:
        """`text`, followed by 'not distinguishable from zero' unless the interval excludes 0."""
        return self.text(fmt) if self.excludes(0.0) else f"{self.text(fmt)}, {NOT_ZERO}"


def estimate(samples: Sequence[np.ndarray], derived: Derived, cfg: CompareConfig = CONFIG) -> Estimate:
    """`derived` of the runs' medians, with its percentile bootstrap interval over the runs'
    samples (`samples[i]`: run i's values, in the order `derived` reads its medians)."""
    runs = [np.asarray(x, dtype=np.float64) for x in samples]
    runs = [x[np.isfinite(x)] for x in runs]
    if any(x.size == 0 for x in runs):
        return Estimate(math.nan, math.nan, math.nan, cfg.ci_level)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(derived(np.array([np.median(x) for x in runs])))
        if any(x.size < MIN_SAMPLES for x in runs):
            return Estimate(value, math.nan, math.nan, cfg.ci_level)
        low, high = percentile_interval(derived(resampled_medians(runs, cfg)), cfg)
    return Estimate(value, low, high, cfg.ci_level)
