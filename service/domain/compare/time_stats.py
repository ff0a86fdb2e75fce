"""Time statistics of many (base, head) groups at once, batched by their sample counts: the
ratio of medians, its percentile bootstrap CI and the two-sided Mann-Whitney U test; and the
same bootstrap of several runs' medians for a quantity derived from them (`resampled_medians`,
`percentile_interval`: one draw, one percentile rule)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from service.domain.compare.config import CompareConfig
from workers import verdict


def _median_positions(rng: np.random.Generator, n: int, bootstrap: int) -> tuple[np.ndarray, np.ndarray]:
    """One side's draw of `bootstrap` resamples of n values: the distinct (lo, hi) positions its
    resamples take their median from, shape (U, 2), and each resample's pair, shape (bootstrap,).

    A resample drawn through sorted indices from sorted values is itself sorted, so its median
    is the mean of the values at two positions, the same positions for every group of the same
    size: a group's bootstrap is a gather, not `bootstrap` sorts. Few position pairs occur (the
    middle of a sorted resample of 20 lands on a few dozen), so each group sums its pairs once
    and the resamples gather those sums."""
    r = np.sort(rng.integers(0, n, size=(bootstrap, n)), axis=1)
    pairs, which = np.unique(np.stack([r[:, (n - 1) // 2], r[:, n // 2]], axis=1), axis=0,
                             return_inverse=True)
    return pairs, which.reshape(-1)


@cache
def _bootstrap_plan(n1: int, n2: int, bootstrap: int, seed: int) -> tuple[np.ndarray, ...]:
    """Where each of `bootstrap` paired resamples takes its two medians from (`_median_positions`
    of the base side, then of the head side). The random stream depends only on (seed, n1, n2),
    so a group's CI does not depend on the other groups in the comparison."""
    rng = np.random.default_rng([seed, n1, n2])
    out = [*_median_positions(rng, n1, bootstrap), *_median_positions(rng, n2, bootstrap)]
    for a in out:
        a.setflags(write=False)  # cached: shared by every comparison
    return tuple(out)


def percentile_ranks(cfg: CompareConfig) -> tuple[int, int]:
    """The 0-based ranks, among `cfg.bootstrap` sorted resampled values, of the two ends of the
    percentile interval at `cfg.ci_level` (inverted-CDF quantiles: the k-th smallest of B values
    is the first whose rank k+1 >= q*B)."""
    a = (1 - cfg.ci_level) / 2
    k_lo = min(max(math.ceil(a * cfg.bootstrap) - 1, 0), cfg.bootstrap - 1)
    k_hi = min(max(math.ceil((1 - a) * cfg.bootstrap) - 1, 0), cfg.bootstrap - 1)
    return k_lo, k_hi


def resampled_medians(samples: Sequence[Sequence[float]], cfg: CompareConfig) -> np.ndarray:
    """The medians of `cfg.bootstrap` resamples of each run's samples, shape (bootstrap, runs):
    every run resampled on its own (with replacement, its own size), row b of every run drawn in
    resample b, by the same draw as the ratio's CI (`_median_positions`) from a stream that
    depends only on the seed and the runs' sizes. A derived quantity of several runs' medians
    (a slope, a share) is computed per row, and `percentile_interval` gives its interval."""
    runs = [np.sort(np.asarray(x, dtype=np.float64)) for x in samples]
    if any(r.size == 0 for r in runs):
        raise ValueError("resampled_medians: a run has no samples")
    rng = np.random.default_rng([cfg.seed, *(r.size for r in runs)])
    out = np.empty((cfg.bootstrap, len(runs)))
    for i, r in enumerate(runs):
        pairs, which = _median_positions(rng, r.size, cfg.bootstrap)
        out[:, i] = ((r[pairs[:, 0]] + r[pairs[:, 1]]) / 2)[which]
    return out


def percentile_interval(values: np.ndarray, cfg: CompareConfig) -> tuple[float, float]:
    """The percentile interval at `cfg.ci_level` of one quantity's resampled values (one per
    bootstrap resample), by the same ranks as the ratio's CI; NaN values order last."""
    k_lo, k_hi = percentile_ranks(cfg)
    picked = np.partition(np.asarray(values, dtype=np.float64), (k_lo, k_hi))
    return float(picked[k_lo]), float(picked[k_hi])


BOOTSTRAP_ROWS = 1024  # groups per block: a block's ratios are BOOTSTRAP_ROWS x bootstrap floats


def _bootstrap_ratio_ci(
    base_sorted: np.ndarray, head_sorted: np.ndarray, cfg: CompareConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI (inverted-CDF quantiles) of head median / base median per row.

    The two quantiles are order statistics of each row's `bootstrap` ratios, found by
    `np.partition` (linear) rather than a sort; NaN ratios order last, as in a sort."""
    n1, n2 = base_sorted.shape[1], head_sorted.shape[1]
    bpairs, bwhich, hpairs, hwhich = _bootstrap_plan(n1, n2, cfg.bootstrap, cfg.seed)
    k_lo, k_hi = percentile_ranks(cfg)
    lo = np.empty(len(base_sorted))
    hi = np.empty(len(base_sorted))
    for start in range(0, len(base_sorted), BOOTSTRAP_ROWS):
        bs = base_sorted[start : start + BOOTSTRAP_ROWS]
        hs = head_sorted[start : start + BOOTSTRAP_ROWS]
        # twice each distinct median (the halves cancel in the ratio), then one per resample
        bsum = np.take(bs, bpairs[:, 0], axis=1) + np.take(bs, bpairs[:, 1], axis=1)
        hsum = np.take(hs, hpairs[:, 0], axis=1) + np.take(hs, hpairs[:, 1], axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):  # np.take: a fraction of bs[:, idx]'s time
            ratios = np.take(hsum, hwhich, axis=1) / np.take(bsum, bwhich, axis=1)
        picked = np.partition(ratios, (k_lo, k_hi), axis=1)
        lo[start : start + len(bs)] = picked[:, k_lo]
        hi[start : start + len(bs)] = picked[:, k_hi]
    return lo, hi


@dataclass(slots=True)
class TimeStats:
    ratio: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    p: np.ndarray  # NaN where not testable


def time_stats_batch(
    base: np.ndarray, head: np.ndarray, medians: np.ndarray, cfg: CompareConfig
) -> TimeStats:
    """base (G, n1), head (G, n2), all finite and > 0 medians checked by the caller; `medians`
    (G, 2): each pair's base and head median (`workers.stats`)."""
    from scipy.stats import mannwhitneyu

    n1, n2 = base.shape[1], head.shape[1]
    bs, hs = np.sort(base, axis=1), np.sort(head, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = medians[:, 1] / medians[:, 0]
    ci_low, ci_high = _bootstrap_ratio_ci(bs, hs, cfg)
    if verdict.min_two_sided_p(n1, n2) < cfg.alpha:
        p = np.asarray(mannwhitneyu(base, head, axis=1, alternative="two-sided").pvalue, dtype=np.float64)
    else:
        p = np.full(len(base), np.nan)
    return TimeStats(ratio, ci_low, ci_high, p)
