"""Time statistics of many (base, head) groups at once, batched by their sample counts: the
ratio of medians, its percentile bootstrap CI and the two-sided Mann-Whitney U test."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from service.domain.compare.config import CompareConfig
from workers import verdict


@cache
def _bootstrap_plan(n1: int, n2: int, bootstrap: int, seed: int) -> tuple[np.ndarray, ...]:
    """Where each of `bootstrap` paired resamples takes its two medians from: per side, the
    distinct (lo, hi) median position pairs, shape (U, 2), and each resample's pair, shape
    (bootstrap,).

    A resample drawn through sorted indices from sorted values is itself sorted, so its median
    is the mean of the values at two positions, the same positions for every group of the same
    size: a group's bootstrap is a gather, not `bootstrap` sorts. Few position pairs occur (the
    middle of a sorted resample of 20 lands on a few dozen), so each group sums its pairs once
    and the resamples gather those sums. The random stream depends only on (seed, n1, n2), so a
    group's CI does not depend on the other groups in the comparison.
    """
    rng = np.random.default_rng([seed, n1, n2])
    rb = np.sort(rng.integers(0, n1, size=(bootstrap, n1)), axis=1)
    rh = np.sort(rng.integers(0, n2, size=(bootstrap, n2)), axis=1)
    out = []
    for r, n in ((rb, n1), (rh, n2)):
        pairs, which = np.unique(np.stack([r[:, (n - 1) // 2], r[:, n // 2]], axis=1), axis=0,
                                 return_inverse=True)
        out += [pairs, which.reshape(-1)]
    for a in out:
        a.setflags(write=False)  # cached: shared by every comparison
    return tuple(out)


BOOTSTRAP_ROWS = 1024  # groups per block: a block's ratios are BOOTSTRAP_ROWS x bootstrap floats


def _bootstrap_ratio_ci(
    base_sorted: np.ndarray, head_sorted: np.ndarray, cfg: CompareConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI (inverted-CDF quantiles) of head median / base median per row.

    The two quantiles are order statistics of each row's `bootstrap` ratios, found by
    `np.partition` (linear) rather than a sort; NaN ratios order last, as in a sort."""
    n1, n2 = base_sorted.shape[1], head_sorted.shape[1]
    bpairs, bwhich, hpairs, hwhich = _bootstrap_plan(n1, n2, cfg.bootstrap, cfg.seed)
    a = (1 - cfg.ci_level) / 2
    # inverted CDF: the k-th smallest (0-based) of B values is the first whose rank k+1 >= q*B
    k_lo = min(max(math.ceil(a * cfg.bootstrap) - 1, 0), cfg.bootstrap - 1)
    k_hi = min(max(math.ceil((1 - a) * cfg.bootstrap) - 1, 0), cfg.bootstrap - 1)
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
