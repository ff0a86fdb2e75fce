"""The statistics of a metric, in one place: the worst rank per idx, then count / median / p90 /
min / max / mean / non-finite count / worst, and the one record they are kept in.

Every reader of samples reaches its numbers through this module: the verdict rule
(`workers.verdict`), `gdnval run`, the store's summaries, the compare engine, the pages, the API
and the benchmark scripts, so a published table and a stored verdict cannot disagree. It is
vectorised with numpy over many (case, metric) series at once (the compare engine reduces two
jobs of 100k samples in one pass) and imports no torch and no database code.

1. **Worst rank per idx.** Samples are raw per rank. Per idx (repetition, step, seed) the worst
   rank's value is kept: the largest for lower-is-better metrics, the smallest for
   higher-is-better ones. A non-finite value on any rank makes the idx non-finite: the idx takes
   that value (NaN, +inf or -inf), or NaN when its ranks disagree (a NaN beside an infinity, or
   +inf beside -inf).
2. **Statistics** over the idx of a series: `count` (values after the reduction), `nonfinite`
   (how many of them are NaN or ±inf: counted, never dropped), and median, p90 (numpy's linear
   quantile), min, max and mean of the finite values; `worst` is the max (lower-is-better) or the
   min (higher), NaN when any value is non-finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_NAN = math.nan
_NO_IDX = np.iinfo(np.int64).max


@dataclass(frozen=True, slots=True)
class MetricStats:
    """One metric of one case after the worst-rank reduction: what the metric is, its statistics,
    and (where a reader judged it) whether it holds its bound (`workers.verdict.judge`).

    The store's summary rows, the compare engine's two sides, the pages, the CLI's table and the
    API's `MetricSummaryOut` are all this record."""

    metric: str = ""
    unit: str = ""
    kind: str = ""
    direction: str = "lower"
    bound: float | None = None  # the bound it was judged with
    count: int = 0  # values after the rank reduction (one per idx)
    samples: int = 0  # raw rows over all ranks
    ranks: int = 1  # the most ranks that reported one idx
    median: float = _NAN
    p90: float = _NAN
    min: float = _NAN
    max: float = _NAN
    mean: float = _NAN
    passes: bool | None = None  # the bound's judgement; None: no bound, or not judged here
    nonfinite: int = 0
    worst: float = _NAN  # max (lower-is-better) or min (higher); NaN when any value is non-finite
    first_nonfinite_idx: int | None = None  # where known: the idx of the first non-finite value
    diagnostic: bool = False  # recorded, never judged (workers.suite.Metric.diagnostic)

    @property
    def finite(self) -> bool:
        return self.nonfinite == 0


@dataclass
class CaseStats:
    """One case of one job with its metrics' statistics: the one case record from the store
    (`service.persistence.summaries.case_summaries`) and `gdnval run` to the pages, the reports,
    the API's `CaseOut` and the CLI's tables."""

    case_id: int | None  # the store's id; None for a run not stored
    name: str
    fingerprint: str
    params: dict[str, Any]
    status: str | None  # None: no result reported (yet)
    error: str | None
    expected_error: str | None
    metrics: dict[str, MetricStats] = field(default_factory=dict)
    source_job_id: int | None = None  # the job that measured it, when this job took it from one


def worst_value(direction: str, lo: float, hi: float, nonfinite: int) -> float:
    """`worst` from the stored min, max and non-finite count (a summary row keeps no worst)."""
    if nonfinite:
        return _NAN
    return hi if direction != "higher" else lo


# ----------------------------------------------------------------------------- rank reduction


@dataclass(frozen=True)
class Reduced:
    """Rows after the worst-rank reduction, one per (group, idx), in (group, idx) order."""

    group: np.ndarray  # int64 group code
    idx: np.ndarray  # int64
    value: np.ndarray  # float64: the worst rank's value (see the module's rule for non-finite)
    ranks: np.ndarray  # int64: the rows (ranks) that reported the idx
    most_ranks: np.ndarray  # int64, one per group (in group order): the most rows any idx had


def worst_rank(group: np.ndarray, idx: np.ndarray, value: np.ndarray, lower: np.ndarray) -> Reduced:
    """The worst rank of every (group, idx) over rows of any rank, in any order: `lower[i]` says
    row i's metric is lower-is-better."""
    group = np.asarray(group, dtype=np.int64)
    idx = np.asarray(idx, dtype=np.int64)
    value = np.asarray(value, dtype=np.float64)
    n = len(value)
    if n == 0:
        ints = np.zeros(0, dtype=np.int64)
        return Reduced(ints, ints, np.zeros(0), ints, ints)
    order = np.lexsort((idx, group))
    g, i, v = group[order], idx[order], value[order]
    sign = np.where(np.asarray(lower, dtype=bool)[order], 1.0, -1.0)
    new_run = np.empty(n, dtype=bool)
    new_run[0] = True
    new_run[1:] = (g[1:] != g[:-1]) | (i[1:] != i[:-1])
    starts = np.flatnonzero(new_run)
    finite = np.isfinite(v)
    signed = np.where(finite, v * sign, -np.inf)
    worst = np.maximum.reduceat(signed, starts) * sign[starts]
    has_nan = np.logical_or.reduceat(np.isnan(v), starts)
    has_pos = np.logical_or.reduceat(v == np.inf, starts)
    has_neg = np.logical_or.reduceat(v == -np.inf, starts)
    worst[has_pos] = np.inf
    worst[has_neg] = -np.inf
    worst[has_nan | (has_pos & has_neg)] = np.nan
    rows = np.diff(np.append(starts, n))
    group_first = np.flatnonzero(np.r_[True, g[starts][1:] != g[starts][:-1]])
    return Reduced(g[starts], i[starts], worst, rows, np.maximum.reduceat(rows, group_first))


def _one_series(rows: Iterable[tuple[int, int, float]], direction: str) -> tuple[int, Reduced]:
    """The worst-rank reduction of one metric's (rank, idx, value) rows, and the number of rows."""
    arr = np.array(list(rows), dtype=np.float64).reshape(-1, 3)  # rank, idx, value
    n = len(arr)
    lower = np.full(n, direction != "higher")
    return n, worst_rank(np.zeros(n, np.int64), arr[:, 1], arr[:, 2], lower)


def reduce_ranks(rows: Iterable[tuple[int, int, float]], direction: str) -> list[float]:
    """(rank, idx, value) rows of one metric -> one value per idx (ordered by idx): the worst rank's."""
    return _one_series(rows, direction)[1].value.tolist()


# ----------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class GroupStats:
    """The statistics of many series at once, one list entry per group (Python lists, so building
    thousands of records costs no per-group numpy calls)."""

    count: list[int]
    nonfinite: list[int]
    median: list[float]
    p90: list[float]
    min: list[float]
    max: list[float]
    mean: list[float]
    worst: list[float]
    first_nonfinite_idx: list[int | None]

    def records(
        self, about: Sequence[tuple[str, str, str, str, float | None]], samples: Sequence[int],
        ranks: Sequence[int],
    ) -> list[MetricStats]:
        """Every group as a record, built positionally (the compare engine builds thousands at
        once): `about[g]` is group g's (metric, unit, kind, direction, bound)."""
        cols = zip(about, samples, ranks, self.count, self.median, self.p90, self.min, self.max, self.mean,
                   self.nonfinite, self.worst, self.first_nonfinite_idx, strict=True)
        return [
            MetricStats(m, u, k, d, b, n, s, r, med, p90, lo, hi, mean, None, bad, worst, first)
            for (m, u, k, d, b), s, r, n, med, p90, lo, hi, mean, bad, worst, first in cols
        ]

    def record(self, g: int, **about: Any) -> MetricStats:
        """Group g as a record; `about`: the record's other fields (metric, unit, ranks, ...)."""
        return MetricStats(
            count=self.count[g], nonfinite=self.nonfinite[g], median=self.median[g], p90=self.p90[g],
            min=self.min[g], max=self.max[g], mean=self.mean[g], worst=self.worst[g],
            first_nonfinite_idx=self.first_nonfinite_idx[g], **about,
        )


def _quantile(sorted_vals: np.ndarray, first: np.ndarray, n: np.ndarray, q: float | np.ndarray) -> np.ndarray:
    """numpy's default (linear) quantile `q` of each group's `n` values sorted from `first`; NaN
    for a group of none."""
    top = np.maximum(n - 1, 0)
    pos = q * top
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, top)
    a, b = sorted_vals[first + lo], sorted_vals[first + hi]
    with np.errstate(invalid="ignore"):
        out = a + (pos - lo) * (b - a)
    return np.where(n > 0, out, np.nan)


def quantiles(values: Sequence[float] | np.ndarray, qs: Sequence[float] | np.ndarray) -> list[float]:
    """The quantiles `qs` (0 to 1) of the finite values of one series, as `group_stats` takes its
    median and p90 (a box plot's p25 and p75 too); NaN each when none is finite."""
    v = np.asarray(values, dtype=np.float64)
    v = np.sort(v[np.isfinite(v)])
    q = np.asarray(qs, dtype=np.float64)
    if v.size == 0:
        return [_NAN] * len(q)
    return _quantile(v, np.zeros(len(q), dtype=np.int64), np.full(len(q), v.size), q).tolist()


def group_stats(
    starts: np.ndarray, values: np.ndarray, lower: Sequence[bool] | np.ndarray, idx: np.ndarray | None = None
) -> GroupStats:
    """Statistics of the rank-reduced series `values[starts[g]:starts[g+1]]` (`starts` ends with
    len(values); every group non-empty); `lower[g]`: group g is lower-is-better; `idx`: the idx
    of each value, for the first non-finite one (None without: values in no particular order)."""
    starts = np.asarray(starts, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    first = starts[:-1]
    counts = np.diff(starts)
    gid = np.repeat(np.arange(len(counts)), counts)
    finite = np.isfinite(values)
    bad = ~finite
    nonfinite = np.add.reduceat(bad.astype(np.int64), first) if len(values) else counts
    nfin = counts - nonfinite
    # finite values first, ascending, within each group
    sorted_vals = values[np.lexsort((np.where(finite, values, 0.0), bad, gid))]
    any_finite = nfin > 0
    if len(values):
        vmin = np.where(any_finite, np.minimum.reduceat(np.where(finite, values, np.inf), first), np.nan)
        vmax = np.where(any_finite, np.maximum.reduceat(np.where(finite, values, -np.inf), first), np.nan)
        total = np.add.reduceat(np.where(finite, values, 0.0), first)
    else:
        vmin = vmax = total = np.zeros(0)
    if idx is None or not len(values):
        first_bad: list[int | None] = [None] * len(counts)
    else:
        lowest = np.minimum.reduceat(np.where(finite, _NO_IDX, np.asarray(idx, dtype=np.int64)), first)
        first_bad = [None if b == _NO_IDX else b for b in lowest.tolist()]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(any_finite, total / np.maximum(nfin, 1), np.nan)
    worst = np.where(nonfinite > 0, np.nan, np.where(np.asarray(lower, dtype=bool), vmax, vmin))
    return GroupStats(
        count=counts.tolist(), nonfinite=nonfinite.tolist(),
        median=_quantile(sorted_vals, first, nfin, 0.5).tolist(),
        p90=_quantile(sorted_vals, first, nfin, 0.9).tolist(), min=vmin.tolist(), max=vmax.tolist(),
        mean=mean.tolist(), worst=worst.tolist(), first_nonfinite_idx=first_bad,
    )


def summarise(values: Iterable[float] | np.ndarray, direction: str, **about: Any) -> MetricStats:
    """Statistics of one rank-reduced series; an empty one has count 0 and NaN statistics.
    `about`: the record's other fields (metric, unit, kind, bound, samples, ranks)."""
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64).ravel()
    if arr.size == 0:
        return MetricStats(direction=direction, **about)
    return group_stats(np.array([0, arr.size]), arr, [direction != "higher"]).record(
        0, direction=direction, **about
    )


def summarise_samples(rows: Iterable[tuple[int, int, float]], direction: str, **about: Any) -> MetricStats:
    """(rank, idx, value) rows of one metric -> statistics after the worst-rank reduction, with
    `samples` and `ranks` counted from the rows."""
    n, red = _one_series(rows, direction)
    if n == 0:
        return MetricStats(direction=direction, **about)
    about.setdefault("samples", n)
    about.setdefault("ranks", int(red.most_ranks[0]))
    return group_stats(np.array([0, len(red.value)]), red.value, [direction != "higher"], red.idx).record(
        0, direction=direction, **about
    )
