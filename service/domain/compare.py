"""The compare engine: two jobs of one suite, case by case (fingerprint) and metric by metric.

Pure and database-free: the store loader (`service.domain.baselines`) turns jobs into `JobSide`s, the
gate and the report render the resulting `Comparison`. Everything is vectorised with numpy so that
two jobs of 100k samples compare in well under half a second (`benchmarks/compare_bench.py`).

The rules are `workers.verdict`'s (its docstring says which statistic each kind is judged on and
the minimum effects); this module applies them to whole jobs at once:

- Samples are raw per rank. The worst rank of each idx is taken first, then statistics run over
  the idx axis. Jobs on other hardware, at another world size or with another suite definition
  version are *incomparable*: every case says so, with the reason, and nothing is computed.
- time (repeated): ratio of medians head/base, a percentile bootstrap CI of that ratio (fixed
  seed), and a two-sided Mann-Whitney U test. *regressed* only when significant (p < alpha) and
  larger than the minimum effect; *unchanged* when the change is within the minimum effect;
  *inconclusive* when it is larger but not significant (the gate then measures again); *improved*
  symmetric. A time metric with one value per case (`Metric.repeated` False: derived ratios) and
  a check are judged by their bound only; a move beyond the minimum effect is *changed* (recorded).
  A time `workers.verdict.time_not_judged` exempts (raw wall clock on a cpu; any time of two jobs
  whose code under test is byte-identical, `JobRef.code`) is shown with its statistics, its move
  beyond the minimum effect *changed*, never failing, re-measured or confirmed.
- memory: the worst value per side; regressed when it grows by more than the minimum effect (1 %)
  and more than 1 MiB (improved symmetric).
- accuracy: *failed* when the head's worst value breaks the bound (a non-finite value always
  does); *worsened* when it grows by more than the minimum effect (2x) above a small floor.
- trajectory: the worst value over steps against the bound, any NaN/Inf step fails; evidence
  carries the max abs / max rel difference head vs base over the common steps.
- Cases only in head are *added*, only in base *removed*; a case whose run errored on either side
  is *errored* and kept out of statistics (the head's bounds still count when only base errored).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cache
from typing import Any, Literal

import numpy as np

from workers import verdict
from workers.suite import CaseStatus, Metric, MetricKind

Verdict = Literal[
    "regressed",
    "improved",
    "unchanged",
    "inconclusive",
    "failed",
    "worsened",
    "added",
    "removed",
    "errored",
    "skipped",
    "changed",
    "incomparable",
]
VERDICTS: tuple[str, ...] = Verdict.__args__  # type: ignore[attr-defined]

# Case verdict = the most severe of its metric verdicts, in this order.
SEVERITY: dict[str, int] = {
    v: i
    for i, v in enumerate(
        [
            "incomparable",
            "errored",
            "failed",
            "regressed",
            "worsened",
            "inconclusive",
            "changed",
            "improved",
            "unchanged",
            "added",
            "removed",
            "skipped",
        ]
    )
}
# Verdicts that make a gate fail (exit 1).
FAILING: frozenset[str] = frozenset({"failed", "regressed", "worsened"})

MIB = 1024 * 1024
_UNIT_BYTES: dict[str, float] = {
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
        return _UNIT_BYTES[unit.strip().lower()]
    except KeyError:
        raise ValueError(
            f"memory metric unit {unit!r} is not a byte unit; expected one of {sorted(_UNIT_BYTES)}"
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


# --------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class CaseInfo:
    """One case of one job: identity, parameters and how its run ended."""

    fingerprint: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    status: CaseStatus | None = None  # None: no case result recorded (treated as passed)
    error: str | None = None


@dataclass(frozen=True)
class JobRef:
    """What a side is, for the record and for links (job page `/jobs/{job_id}`)."""

    job_id: int | None = None
    suite: str = ""
    preset: str = ""
    commit: str | None = None
    device: str = ""
    world_size: int = 1
    status: str | None = None
    device_name: str | None = None  # the hardware the job ran on (rank 0's device name)
    suite_version: int | None = None  # the suite's definition version the job ran with
    code: str | None = None  # the code under test's content identity (workers.provenance.code_identity)


@dataclass
class SampleTable:
    """Columnar raw samples of one job: parallel arrays, case and metric as integer codes."""

    case: np.ndarray  # int codes into `case_keys`
    metric: np.ndarray  # int codes into `metric_keys`
    rank: np.ndarray
    idx: np.ndarray
    value: np.ndarray  # float64
    case_keys: list[str]  # fingerprints
    metric_keys: list[str]
    # rows already reduced over ranks (the store's SQL rank reduction): how many ranks each row
    # stands for, and `rank` is meaningless; None: raw rows, one per rank
    ranks: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.value)
        for name in ("case", "metric", "rank", "idx"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"SampleTable.{name} has {len(getattr(self, name))} rows; expected {n}")

    def __len__(self) -> int:
        return len(self.value)

    @classmethod
    def from_records(cls, records: Iterable[tuple[str, str, int, int, float]]) -> SampleTable:
        """From (fingerprint, metric, rank, idx, value) tuples."""
        case_ids: dict[str, int] = {}
        metric_ids: dict[str, int] = {}
        cols: list[tuple[int, int, int, int, float]] = []
        for fp, metric, rank, idx, value in records:
            c = case_ids.setdefault(fp, len(case_ids))
            m = metric_ids.setdefault(metric, len(metric_ids))
            cols.append((c, m, rank, idx, value))
        arr = np.array(cols, dtype=np.float64).reshape(-1, 5)
        return cls(
            case=arr[:, 0].astype(np.int64),
            metric=arr[:, 1].astype(np.int64),
            rank=arr[:, 2].astype(np.int64),
            idx=arr[:, 3].astype(np.int64),
            value=arr[:, 4],
            case_keys=list(case_ids),
            metric_keys=list(metric_ids),
        )


@dataclass
class JobSide:
    """One side of a comparison: a job's cases, its suite's metrics and its raw samples."""

    ref: JobRef
    cases: Mapping[str, CaseInfo]  # fingerprint -> case
    metrics: Mapping[str, Metric]  # metric name -> definition
    samples: SampleTable


# --------------------------------------------------------------------------------------------
# Outputs


@dataclass(slots=True)
class Summary:
    """Statistics of one side of one metric after the worst-rank reduction."""

    n: int  # values after the rank reduction (repetitions, steps, tensors)
    ranks: int
    median: float
    p90: float
    min: float
    max: float
    worst: float  # max for lower-is-better, min for higher-is-better (NaN if any NaN)
    finite: bool
    first_nonfinite_idx: int | None = None


@dataclass(slots=True)
class MetricResult:
    """Verdict and evidence for one metric of one case. `ratio`/`ci_*` are head/base."""

    metric: str
    kind: MetricKind
    unit: str
    direction: str
    bound: float | None
    verdict: Verdict
    reason: str
    base: Summary | None = None
    head: Summary | None = None
    ratio: float | None = None  # time: ratio of medians; memory/accuracy/trajectory: of worst values
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None  # Mann-Whitney U, two-sided; None when not run
    delta: float | None = None  # head - base of the compared statistic, in `unit`
    rel_delta: float | None = None  # delta / |base|
    max_abs_diff: float | None = None  # trajectory: over the common steps
    max_rel_diff: float | None = None
    bound_ok: bool | None = None  # head's compared statistic against the bound (None: no bound)


@dataclass(slots=True)
class CaseResult:
    fingerprint: str
    name: str
    params: dict[str, Any]
    verdict: Verdict
    reason: str
    base_status: str | None
    head_status: str | None
    base_error: str | None = None
    head_error: str | None = None
    metrics: list[MetricResult] = field(default_factory=list)


@dataclass(slots=True)
class Comparison:
    """All case results of one base/head pair of jobs of one suite."""

    suite: str
    base: JobRef
    head: JobRef
    config: CompareConfig
    cases: list[CaseResult]

    def counts(self) -> dict[str, int]:
        """Case verdict -> number of cases (every verdict present, zeros included)."""
        out = dict.fromkeys(VERDICTS, 0)
        for c in self.cases:
            out[c.verdict] += 1
        return out

    def metric_counts(self) -> dict[str, int]:
        out = dict.fromkeys(VERDICTS, 0)
        for c in self.cases:
            for m in c.metrics:
                out[m.verdict] += 1
        return out

    def failing_cases(self) -> list[CaseResult]:
        """Cases that fail a gate: a failing metric verdict, or an error on the head side."""
        return [c for c in self.cases if _case_fails(c)]

    @property
    def passed(self) -> bool:
        return not self.failing_cases()

    def time_regressions(self) -> list[tuple[CaseResult, MetricResult]]:
        return [
            (c, m) for c in self.cases for m in c.metrics if m.kind == "time" and m.verdict == "regressed"
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN/Inf become strings so the output is strict JSON)."""
        return {
            "suite": self.suite,
            "base": to_jsonable(self.base),
            "head": to_jsonable(self.head),
            "config": to_jsonable(self.config),
            "passed": self.passed,
            "counts": self.counts(),
            "metric_counts": self.metric_counts(),
            "cases": [to_jsonable(c) for c in self.cases],
        }


def _case_fails(c: CaseResult) -> bool:
    if c.verdict == "errored":
        return c.head_status == "error"
    if c.verdict == "added" and c.head_status == "error":
        return True
    return any(m.verdict in FAILING for m in c.metrics) or c.head_status == "failed"


def to_jsonable(obj: Any) -> Any:
    """Dataclasses/mappings/sequences -> plain JSON types; non-finite floats -> 'nan'/'inf'/'-inf'."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        if math.isfinite(f):
            return f
        return "nan" if f != f else ("inf" if f > 0 else "-inf")
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


# --------------------------------------------------------------------------------------------
# Rank reduction and grouping


@dataclass
class Series:
    """Rank-reduced values of one side: per (case, metric) group, values ordered by idx.

    The per-group statistics are computed for all groups at once (`_group_stats`) and kept as
    Python lists, so building thousands of results costs no per-group numpy calls.
    """

    keys: list[tuple[str, str]]  # (fingerprint, metric) per group
    starts: np.ndarray  # group g is values[starts[g]:starts[g+1]]
    idx: np.ndarray
    values: np.ndarray
    ranks: list[int]  # distinct ranks per group
    n: list[int] = field(default_factory=list)
    median: list[float] = field(default_factory=list)
    p90: list[float] = field(default_factory=list)
    vmin: list[float] = field(default_factory=list)
    vmax: list[float] = field(default_factory=list)
    finite: list[bool] = field(default_factory=list)
    first_bad: list[int] = field(default_factory=list)  # idx of the first non-finite value, or -1

    def get(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = self.starts[g], self.starts[g + 1]
        return self.idx[s:e], self.values[s:e]

    def summaries(self, lower: list[bool]) -> list[Summary]:
        """Every group's Summary; `lower[g]`: group g is lower-is-better (its worst value is the max)."""
        nan = math.nan
        cols = zip(self.n, self.ranks, self.median, self.p90, self.vmin, self.vmax, self.finite,
                   self.first_bad, lower, strict=True)  # fmt: skip
        return [
            Summary(n, r, m, p, lo, hi, (hi if low else lo) if ok else nan, ok, None if bad < 0 else bad)
            for n, r, m, p, lo, hi, ok, bad, low in cols
        ]


def reduce_ranks(samples: SampleTable, metrics: Mapping[str, Metric]) -> Series:
    """Worst rank per (case, metric, idx): max for lower-is-better metrics, min for higher.

    NaN is the worst value of all (it propagates), so a NaN on any rank survives the reduction.
    Rows the store reduced already (`SampleTable.ranks`), one per (case, metric, idx) in that
    order, are taken as they are: only their grouping is worked out.
    """
    n = len(samples)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return Series([], np.zeros(1, dtype=np.int64), empty, np.zeros(0), [])
    n_metrics = max(len(samples.metric_keys), 1)
    metric_col = np.asarray(samples.metric, dtype=np.int64)
    group = np.asarray(samples.case, dtype=np.int64) * n_metrics + metric_col
    idx_col = np.asarray(samples.idx, dtype=np.int64)
    if samples.ranks is not None and _one_row_per_idx_in_order(group, idx_col):
        run_group, run_idx = group, idx_col
        values = np.asarray(samples.value, dtype=np.float64)
        reported: np.ndarray | None = np.asarray(samples.ranks, dtype=np.int64)
        r_sorted = g_sorted = None
    else:
        run_group, run_idx, values, reported, g_sorted, r_sorted = _worst_per_idx(samples, metrics, group,
                                                                                  idx_col)  # fmt: skip
    new_group = np.empty(len(run_group), dtype=bool)  # group starts among the reduced rows
    new_group[0] = True
    new_group[1:] = run_group[1:] != run_group[:-1]
    gstarts = np.flatnonzero(new_group)
    groups = run_group[gstarts]
    metric_codes = groups % n_metrics
    starts = np.append(gstarts, len(run_group))
    counts = np.diff(starts)
    if reported is not None:  # pre-reduced rows: the most ranks any idx of the group had
        ranks_per_group = np.maximum.reduceat(reported, gstarts)
    else:
        # distinct ranks per group: distinct (group, rank) pairs; within a (group, idx) run ranks
        # are sorted, so count rank changes over the (group, rank)-sorted order.
        assert g_sorted is not None and r_sorted is not None
        gr_order = np.lexsort((r_sorted, g_sorted))
        gs, rs = g_sorted[gr_order], r_sorted[gr_order]
        distinct = np.empty(n, dtype=bool)
        distinct[0] = True
        distinct[1:] = (gs[1:] != gs[:-1]) | (rs[1:] != rs[:-1])
        g_first = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
        ranks_per_group = np.add.reduceat(distinct.astype(np.int64), g_first)
    keys = list(
        zip(
            map(samples.case_keys.__getitem__, (groups // n_metrics).tolist()),
            map(samples.metric_keys.__getitem__, metric_codes.tolist()),
            strict=True,
        )
    )
    series = Series(keys, starts, run_idx, values, ranks_per_group.tolist())
    _group_stats(series, counts)
    return series


def _one_row_per_idx_in_order(group: np.ndarray, idx: np.ndarray) -> bool:
    """Rows strictly increasing in (group, idx): one row per idx, grouped, as the store sends them."""
    dg = np.diff(group)
    return bool(np.all((dg > 0) | ((dg == 0) & (np.diff(idx) > 0))))


def _worst_per_idx(
    samples: SampleTable, metrics: Mapping[str, Metric], group: np.ndarray, idx_col: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """The rank reduction proper: (group, idx, worst value, ranks reported or None) per reduced
    row in (group, idx) order, and the group and rank columns of the sorted input."""
    n = len(samples)
    # sign +1 for lower-is-better, -1 for higher: max over signed values is the worst rank.
    sign_of_metric = np.array(
        [-1.0 if (metrics.get(m) is not None and metrics[m].direction == "higher") else 1.0
         for m in samples.metric_keys] or [1.0]
    )
    metric_col = np.asarray(samples.metric, dtype=np.int64)
    rank_col = np.asarray(samples.rank, dtype=np.int64)
    order = np.lexsort((rank_col, idx_col, group))
    g_sorted = group[order]
    i_sorted = idx_col[order]
    signed = np.asarray(samples.value, dtype=np.float64)[order] * sign_of_metric[metric_col[order]]
    r_sorted = rank_col[order]
    new_run = np.empty(n, dtype=bool)  # run starts of (group, idx)
    new_run[0] = True
    new_run[1:] = (g_sorted[1:] != g_sorted[:-1]) | (i_sorted[1:] != i_sorted[:-1])
    run_starts = np.flatnonzero(new_run)
    run_metric = metric_col[order][run_starts]
    values = np.maximum.reduceat(signed, run_starts) * sign_of_metric[run_metric]
    reported = None
    if samples.ranks is not None:
        reported = np.asarray(samples.ranks, dtype=np.int64)[order][run_starts]
    return g_sorted[run_starts], i_sorted[run_starts], values, reported, g_sorted, r_sorted


def _group_stats(series: Series, counts: np.ndarray) -> None:
    """n, median, p90, min, max, finiteness and first non-finite idx of every group at once."""
    starts = series.starts[:-1]
    values = series.values
    gid = np.repeat(np.arange(len(counts)), counts)
    sorted_vals = values[np.lexsort((values, gid))]
    finite_mask = np.isfinite(values)
    finite = np.logical_and.reduceat(finite_mask, starts)

    def quantile(q: float) -> np.ndarray:  # numpy's default (linear) method, per group
        pos = q * (counts - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, counts - 1)
        a, b = sorted_vals[starts + lo], sorted_vals[starts + hi]
        with np.errstate(invalid="ignore"):
            out = a + (pos - lo) * (b - a)
        return np.where(finite, out, np.nan)

    with np.errstate(invalid="ignore"):
        vmin = np.fmin.reduceat(values, starts)
        vmax = np.fmax.reduceat(values, starts)
    big = np.iinfo(np.int64).max
    first_bad = np.minimum.reduceat(np.where(finite_mask, big, series.idx), starts)
    series.n = counts.tolist()
    series.median = quantile(0.5).tolist()
    series.p90 = quantile(0.9).tolist()
    series.vmin = vmin.tolist()
    series.vmax = vmax.tolist()
    series.finite = finite.tolist()
    series.first_bad = np.where(first_bad == big, -1, first_bad).tolist()


def summarise(values: np.ndarray, direction: str, ranks: int = 1, idx: np.ndarray | None = None) -> Summary:
    """Summary of one rank-reduced series (the engine uses the batched `Series.summary`)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        nan = math.nan
        return Summary(0, ranks, nan, nan, nan, nan, nan, True)
    idx = np.arange(len(values)) if idx is None else np.asarray(idx, dtype=np.int64)
    series = Series([("", "")], np.array([0, len(values)]), idx, values, [ranks])
    _group_stats(series, np.array([len(values)]))
    return series.summaries([direction != "higher"])[0]


# --------------------------------------------------------------------------------------------
# Time statistics, batched by sample counts


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
                                 return_inverse=True)  # fmt: skip
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
class _TimeStats:
    ratio: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    p: np.ndarray  # NaN where not testable


def _time_stats_batch(base: np.ndarray, head: np.ndarray, cfg: CompareConfig) -> _TimeStats:
    """base (G, n1), head (G, n2), all finite and > 0 medians checked by the caller."""
    from scipy.stats import mannwhitneyu

    n1, n2 = base.shape[1], head.shape[1]
    bs, hs = np.sort(base, axis=1), np.sort(head, axis=1)
    base_med = np.median(bs, axis=1)
    head_med = np.median(hs, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = head_med / base_med
    ci_low, ci_high = _bootstrap_ratio_ci(bs, hs, cfg)
    if verdict.min_two_sided_p(n1, n2) < cfg.alpha:
        p = np.asarray(mannwhitneyu(base, head, axis=1, alternative="two-sided").pvalue, dtype=np.float64)
    else:
        p = np.full(len(base), np.nan)
    return _TimeStats(ratio, ci_low, ci_high, p)


def _time_verdict(
    ratio: float, lo: float, hi: float, p: float, rule: _Rule, cfg: CompareConfig
) -> tuple[Verdict, str]:
    """Significant and larger than the minimum effect -> regressed/improved; a change within the
    minimum effect -> unchanged; larger but not (yet) significant -> inconclusive, which the gate
    measures again until decided (it never passes a gate silently)."""
    eff = rule.min_effect
    moved = verdict.time_moved(ratio, eff, rule.metric.direction)
    testable = p == p
    significant = testable and p < cfg.alpha
    pct = f"{ratio - 1.0:+.1%}"
    ptxt = f"p={p:.2g}" if testable else "too few samples for significance"
    ci_txt = f"CI [{lo:.3f}, {hi:.3f}]"
    if rule.not_judged is not None:  # shown with its evidence, never a verdict that fails or waits
        if moved == "same":
            return "unchanged", f"median {pct} within ±{eff:.0%} ({ptxt}; not judged: {rule.not_judged})"
        return "changed", f"median {pct} ({ptxt}, {ci_txt}; recorded, not judged: {rule.not_judged})"
    if significant and moved in ("worse", "better"):
        why = f"median {pct} ({ptxt}, {ci_txt}; min effect {eff:.0%})"
        return ("regressed" if moved == "worse" else "improved"), why
    if moved == "same":
        return "unchanged", f"median {pct} within the min effect ±{eff:.0%} ({ptxt}, {ci_txt})"
    return "inconclusive", f"median {pct} exceeds ±{eff:.0%} but is not significant ({ptxt}, {ci_txt})"


# --------------------------------------------------------------------------------------------
# The engine


@contextmanager
def collector_paused() -> Iterator[None]:
    """Build many small objects without the cyclic garbage collector's passes.

    A comparison of two 100k-sample jobs creates ~40k results and summaries (no reference
    cycles); their allocations trigger collections, and in a server process the older
    generations' passes walk every object the server holds.
    Nested or concurrent uses are safe: only the outermost one that found the collector on turns it
    back on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def compare(base: JobSide, head: JobSide, config: CompareConfig | None = None) -> Comparison:
    """Compare `head` against `base` case by case; cases matched by fingerprint."""
    with collector_paused():
        return _compare(base, head, config)


def _compare(base: JobSide, head: JobSide, config: CompareConfig | None) -> Comparison:
    cfg = config or CompareConfig()
    why_not = incomparable_reason(base.ref, head.ref)
    if why_not is not None:
        return _incomparable(base, head, cfg, why_not)
    device = head.ref.device or base.ref.device or None
    same_code = base.ref.code is not None and base.ref.code == head.ref.code
    metrics: dict[str, Metric] = {**base.metrics, **head.metrics}
    bser = reduce_ranks(base.samples, metrics)
    hser = reduce_ranks(head.samples, metrics)
    # one rule per metric name of either side, worked out before the per-group loops
    rules: dict[str, _Rule] = {
        name: _Rule.of(metrics.get(name) or Metric(name, "", "accuracy"), cfg, device, same_code)
        for name in dict.fromkeys([*base.samples.metric_keys, *head.samples.metric_keys])
    }
    bsums = bser.summaries([rules[m].lower for _, m in bser.keys])
    hsums = hser.summaries([rules[m].lower for _, m in hser.keys])
    bgroups: dict[tuple[str, str], int] = {k: g for g, k in enumerate(bser.keys)}
    hgroups: dict[tuple[str, str], int] = {k: g for g, k in enumerate(hser.keys)}
    by_case_b: dict[str, list[str]] = {}
    for fp, m in bser.keys:
        by_case_b.setdefault(fp, []).append(m)
    by_case_h: dict[str, list[str]] = {}
    for fp, m in hser.keys:
        by_case_h.setdefault(fp, []).append(m)

    fps = list(dict.fromkeys([*head.cases, *by_case_h, *base.cases, *by_case_b]))
    case_results: list[CaseResult] = []
    undecided: list[CaseResult] = []  # verdict waits for the batched time statistics
    # time pairs batched by (n_base, n_head): (metric result, base group, head group)
    pending: dict[tuple[int, int], list[tuple[MetricResult, int, int]]] = {}

    for fp in fps:
        binfo, hinfo = base.cases.get(fp), head.cases.get(fp)
        in_base = binfo is not None or fp in by_case_b
        in_head = hinfo is not None or fp in by_case_h
        info = hinfo or binfo or CaseInfo(fp, fp)
        bstat = (binfo.status or "passed") if binfo else ("passed" if in_base else None)
        hstat = (hinfo.status or "passed") if hinfo else ("passed" if in_head else None)
        cr = CaseResult(
            fingerprint=fp,
            name=info.name,
            params=dict(info.params),
            verdict="unchanged",
            reason="",
            base_status=bstat,
            head_status=hstat,
            base_error=binfo.error if binfo else None,
            head_error=hinfo.error if hinfo else None,
        )
        case_results.append(cr)
        if hstat == "error":
            cr.verdict, cr.reason = "errored", f"head run errored: {_first_line(cr.head_error)}"
            continue
        if not in_head:
            cr.verdict, cr.reason = "removed", "case only in base"
            continue
        if hstat == "skipped":
            cr.verdict, cr.reason = "skipped", "skipped on head"
            continue
        base_usable = in_base and bstat not in ("error", "skipped")
        hnames, bnames = by_case_h.get(fp, []), (by_case_b.get(fp, []) if base_usable else [])
        names = hnames if hnames == bnames else list(dict.fromkeys([*hnames, *bnames]))
        results = cr.metrics
        for name in names:
            key = (fp, name)
            bg = bgroups.get(key) if base_usable else None
            hg = hgroups.get(key)
            results.append(_metric_result(rules[name], bser, bsums, bg, hser, hsums, hg, pending))
        undecided.append(cr)

    for (n1, n2), items in pending.items():
        bidx = np.array([bg for _, bg, _ in items])
        hidx = np.array([hg for _, _, hg in items])
        base_vals = bser.values[bser.starts[bidx][:, None] + np.arange(n1)]
        head_vals = hser.values[hser.starts[hidx][:, None] + np.arange(n2)]
        stats = _time_stats_batch(base_vals, head_vals, cfg)
        rows = zip(stats.ratio.tolist(), stats.ci_low.tolist(), stats.ci_high.tolist(), stats.p.tolist(),
                   strict=True)
        for (mr, _, _), (r, lo, hi, p) in zip(items, rows, strict=True):
            mr.ratio, mr.ci_low, mr.ci_high = r, lo, hi
            mr.p_value = p if p == p else None
            mr.verdict, mr.reason = _time_verdict(r, lo, hi, p, rules[mr.metric], cfg)
    for cr in undecided:
        _settle_case(cr, cr.base_status is not None, cr.base_status)
    return Comparison(head.ref.suite or base.ref.suite, base.ref, head.ref, cfg, case_results)


def incomparable_reason(base: JobRef, head: JobRef) -> str | None:
    """Why two jobs' results cannot be compared (other hardware, another definition), or None."""
    if base.device and head.device and base.device != head.device:
        return f"device kind {base.device!r} vs {head.device!r}"
    if base.world_size != head.world_size:
        return f"world size {base.world_size} vs {head.world_size}"
    if base.device_name and head.device_name and base.device_name != head.device_name:
        return f"hardware {base.device_name!r} vs {head.device_name!r}"
    versions = (base.suite_version, head.suite_version)
    if None not in versions and versions[0] != versions[1]:
        return f"suite definition version {versions[0]} vs {versions[1]}"
    return None


def _incomparable(base: JobSide, head: JobSide, cfg: CompareConfig, why: str) -> Comparison:
    """Every case `incomparable` with the reason: no statistic is computed across a hardware or
    definition change."""
    fps = list(dict.fromkeys([*head.cases, *base.cases]))
    results = []
    for fp in fps:
        info = head.cases.get(fp) or base.cases[fp]
        b, h = base.cases.get(fp), head.cases.get(fp)
        results.append(CaseResult(fp, info.name, dict(info.params), "incomparable", f"not comparable: {why}",
                                  b.status if b else None, h.status if h else None))  # fmt: skip
    return Comparison(head.ref.suite or base.ref.suite, base.ref, head.ref, cfg, results)


def _first_line(text: str | None) -> str:
    return (text or "no error text").strip().splitlines()[-1][:200] if text else "no error text"


def _settle_case(cr: CaseResult, in_base: bool, bstat: str | None) -> None:
    """Case verdict from its metrics: the most severe one; added / errored-base noted."""
    if cr.head_status == "failed" and not any(m.verdict == "failed" for m in cr.metrics):
        cr.verdict, cr.reason = "failed", f"head case failed: {_first_line(cr.head_error)}"
        return
    worst = min(cr.metrics, key=lambda m: SEVERITY[m.verdict], default=None)
    if not in_base:
        if worst is not None and worst.verdict == "failed":
            cr.verdict, cr.reason = "failed", f"case only in head; {worst.metric}: {worst.reason}"
        else:
            cr.verdict, cr.reason = "added", "case only in head"
        return
    if bstat == "error":
        if worst is not None and worst.verdict == "failed":
            cr.verdict, cr.reason = "failed", f"{worst.metric}: {worst.reason}"
        else:
            cr.verdict, cr.reason = "errored", f"base run errored: {_first_line(cr.base_error)}"
        return
    if worst is None:
        cr.verdict, cr.reason = "unchanged", "no samples on either side"
        return
    cr.verdict = worst.verdict
    cr.reason = f"{worst.metric}: {worst.reason}"


@dataclass(frozen=True, slots=True)
class _Rule:
    """What the rules need of one metric, worked out once per comparison instead of per case."""

    metric: Metric
    lower: bool  # lower is better
    judged_on_median: bool  # the bound's statistic (workers.verdict.JUDGED_ON)
    min_effect: float  # workers.verdict.min_effect for this metric on this device
    floor: float  # accuracy and trajectory: no 'worsened' at or below this absolute value
    memory_abs_bytes: float  # memory: no regression below this growth
    not_judged: str | None = None  # time: why it is shown but not judged (workers.verdict.time_not_judged)

    @classmethod
    def of(cls, metric: Metric, cfg: CompareConfig, device: str | None, same_code: bool = False) -> _Rule:
        floor = cfg.accuracy_floor
        if metric.bound is not None:
            floor = max(floor, cfg.accuracy_floor_bound_frac * abs(metric.bound))
        return cls(
            metric,
            metric.direction != "higher",
            verdict.JUDGED_ON.get(metric.kind) == "median",
            verdict.min_effect(metric.kind, metric.min_effect, device),
            floor,
            cfg.memory_abs_bytes,
            verdict.time_not_judged(metric.min_effect, device, same_code) if metric.kind == "time" else None,
        )


def _metric_result(
    rule: _Rule,
    bser: Series,
    bsums: list[Summary],
    bg: int | None,
    hser: Series,
    hsums: list[Summary],
    hg: int | None,
    pending: dict[tuple[int, int], list[tuple[MetricResult, int, int]]],
) -> MetricResult:
    metric = rule.metric
    kind = metric.kind
    h = hsums[hg] if hg is not None else None
    b = bsums[bg] if bg is not None else None
    mr = MetricResult(metric.name, kind, metric.unit, metric.direction, metric.bound, "unchanged", "", b, h)
    if h is None:
        mr.verdict, mr.reason = "removed", "metric only in base"
        return mr
    if b is not None:
        mr.delta, mr.rel_delta, mr.ratio = _deltas(b, h, kind == "time")
        if kind == "trajectory":
            _set_trajectory_diffs(mr, *bser.get(bg), *hser.get(hg))  # type: ignore[arg-type]

    # The head against the bound (workers.verdict: non-finite fails every kind; the judged
    # statistic per kind). Most metrics have no bound: the rule is called only for those that do.
    if not h.finite:
        mr.bound_ok = False if metric.bound is not None else None
        mr.verdict = "failed"
        mr.reason = f"non-finite value at idx {h.first_nonfinite_idx}"
        return mr
    if metric.bound is not None and rule.not_judged is None:
        value = h.median if rule.judged_on_median else h.worst
        mr.bound_ok = verdict.bound_holds(value, metric.bound, metric.direction)
        if not mr.bound_ok:
            stats = verdict.Stats(h.n, 0, h.median, h.p90, h.min, h.max, math.nan, h.worst)
            judged = verdict.judge(kind, metric.direction, metric.bound, stats)
            mr.verdict, mr.reason = "failed", judged.reason
            return mr
    if b is None:
        mr.verdict, mr.reason = "added", "metric only in head"
        return mr
    if not b.finite:
        mr.verdict, mr.reason = "improved", "base had non-finite values, head is finite"
        return mr

    if kind == "time" and metric.repeated:
        if b.median <= 0 or h.median <= 0:
            mr.verdict, mr.reason = "changed", "non-positive median time, ratio undefined (recorded)"
            return mr
        assert bg is not None and hg is not None
        pending.setdefault((b.n, h.n), []).append((mr, bg, hg))
        return mr
    if kind == "memory":
        _memory_verdict(mr, rule)
    elif kind in ("check", "time"):  # a check, or a one-value time metric (not repeated)
        _recorded_verdict(mr, rule)
    else:
        mr.verdict, mr.reason = _accuracy_verdict(mr.base.worst, mr.head.worst, rule)
    return mr


def _recorded_verdict(mr: MetricResult, rule: _Rule) -> None:
    """A check, or a time metric with one value per case: judged only by its bound (above); a
    move beyond the kind's minimum effect is shown as `changed` (recorded, never a gate failure:
    for a derived ratio the metrics it derives from carry the verdict)."""
    assert mr.base is not None and mr.head is not None
    metric = rule.metric
    b, h = mr.base.worst, mr.head.worst
    if metric.kind == "time":
        b, h = mr.base.median, mr.head.median
    moved = verdict.classify_change(metric.kind, metric.direction, b, h, rule.min_effect)
    if moved == "same":
        mr.verdict, mr.reason = "unchanged", f"{h:g}" if b == h else f"{b:.4g} -> {h:.4g}"
    elif moved == "better":
        mr.verdict, mr.reason = "improved", f"{b:.4g} -> {h:.4g}"
    else:
        mr.verdict, mr.reason = "changed", f"{b:.4g} -> {h:.4g} (recorded, not judged)"


def _deltas(base: Summary, head: Summary, is_time: bool) -> tuple[float | None, float | None, float | None]:
    """(delta, relative delta, ratio) of the compared statistic: the median for time (whose ratio
    is the batched statistics' ratio of medians, so None here), else the worst value."""
    b, h = (base.median, head.median) if is_time else (base.worst, head.worst)
    if not (math.isfinite(b) and math.isfinite(h)):
        return None, None, None
    delta = h - b
    if b == 0:
        return delta, None, None
    return delta, delta / abs(b), None if is_time else h / b


def _set_trajectory_diffs(mr: MetricResult, bidx: np.ndarray, bvals: np.ndarray, hidx: np.ndarray,
                          hvals: np.ndarray) -> None:
    common, bi, hi = np.intersect1d(bidx, hidx, assume_unique=True, return_indices=True)
    if len(common) == 0:
        return
    diff = np.abs(hvals[hi] - bvals[bi])
    with np.errstate(all="ignore"):
        rel = diff / np.abs(bvals[bi])
        rel = np.where(diff == 0, 0.0, rel)
    mr.max_abs_diff = float(np.max(diff))
    mr.max_rel_diff = float(np.max(rel))


def _memory_verdict(mr: MetricResult, rule: _Rule) -> None:
    """Bytes: more than the minimum effect (1 % by default) and more than 1 MiB. A memory metric
    in another unit (a ratio of two peaks) has no absolute scale: only the relative rule applies."""
    assert mr.base is not None and mr.head is not None
    metric = rule.metric
    b, h = mr.base.worst, mr.head.worst
    eff = rule.min_effect
    grow = (h - b) if metric.direction == "lower" else (b - h)
    rel = grow / abs(b) if b else (math.inf if grow > 0 else 0.0)
    if metric.unit.strip().lower() not in _UNIT_BYTES:
        why = f"{b:.4g} -> {h:.4g} ({rel:+.1%}, {metric.unit or 'no unit'})"
        if rel > eff:
            mr.verdict, mr.reason = "regressed", why
        elif -rel > eff:
            mr.verdict, mr.reason = "improved", why
        else:
            mr.verdict, mr.reason = "unchanged", f"{b:.4g} -> {h:.4g} ({rel:+.1%}) within {eff:.0%}"
        return
    grow_bytes = grow * unit_bytes(metric.unit)
    mib = grow_bytes / MIB
    if grow_bytes > rule.memory_abs_bytes and rel > eff:
        mr.verdict, mr.reason = "regressed", f"grew {mib:+.2f} MiB ({rel:+.1%})"
    elif -grow_bytes > rule.memory_abs_bytes and -rel > eff:
        mr.verdict, mr.reason = "improved", f"shrank {mib:+.2f} MiB ({rel:+.1%})"
    else:
        mr.verdict, mr.reason = "unchanged", f"{mib:+.2f} MiB ({rel:+.1%}) within 1 MiB or {eff:.0%}"


def _accuracy_verdict(b: float, h: float, rule: _Rule) -> tuple[Verdict, str]:
    """Worst values of base and head: worse or better only by more than the minimum effect
    (a factor, 2x by default) and above the absolute floor."""
    floor = rule.floor
    f = 1.0 + rule.min_effect
    if rule.lower:
        worse = h > f * b and h > floor
        better = b > f * h and b > floor
    else:
        worse = b > f * h and b > floor
        better = h > f * b and h > floor
    if worse:
        return "worsened", f"{b:.3g} -> {h:.3g} (more than {f:g}x, above floor {floor:.1g})"
    if better:
        return "improved", f"{b:.3g} -> {h:.3g} (more than {f:g}x better)"
    return "unchanged", f"{b:.3g} -> {h:.3g}"
