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
from workers.stats import MetricStats, group_stats, worst_rank
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
class MetricResult:
    """Verdict and evidence for one metric of one case. `ratio`/`ci_*` are head/base."""

    metric: str
    kind: MetricKind
    unit: str
    direction: str
    bound: float | None
    verdict: Verdict
    reason: str
    base: MetricStats | None = None
    head: MetricStats | None = None
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
    """Rank-reduced values of one side: per (case, metric) group, values ordered by idx, and the
    statistics of every group computed at once (`workers.stats.group_stats`)."""

    keys: list[tuple[str, str]]  # (fingerprint, metric) per group
    starts: np.ndarray  # group g is values[starts[g]:starts[g+1]]
    idx: np.ndarray
    values: np.ndarray
    ranks: list[int]  # per group: the most ranks that reported one idx
    samples: list[int]  # per group: the raw rows (over all ranks)

    def get(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = self.starts[g], self.starts[g + 1]
        return self.idx[s:e], self.values[s:e]

    def summaries(self, metrics: list[Metric]) -> list[MetricStats]:
        """Every group's statistics; `metrics[g]`: group g's metric definition."""
        if not self.keys:
            return []
        st = group_stats(self.starts, self.values, [m.direction != "higher" for m in metrics], self.idx)
        about = [(m.name, m.unit, m.kind, m.direction, m.bound) for m in metrics]
        return st.records(about, self.samples, self.ranks)


def series_of(samples: SampleTable, metrics: Mapping[str, Metric]) -> Series:
    """Worst rank per (case, metric, idx) (`workers.stats.worst_rank`), grouped by (case, metric).

    Rows the store reduced already (`SampleTable.ranks`), one per (case, metric, idx) in that
    order, are taken as they are: only their grouping is worked out.
    """
    n = len(samples)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return Series([], np.zeros(1, dtype=np.int64), empty, np.zeros(0), [], [])
    n_metrics = max(len(samples.metric_keys), 1)
    metric_col = np.asarray(samples.metric, dtype=np.int64)
    group = np.asarray(samples.case, dtype=np.int64) * n_metrics + metric_col
    idx_col = np.asarray(samples.idx, dtype=np.int64)
    in_order = samples.ranks is not None and _one_row_per_idx_in_order(group, idx_col)
    if in_order:
        run_group, run_idx = group, idx_col
        values = np.asarray(samples.value, dtype=np.float64)
        reported = np.asarray(samples.ranks, dtype=np.int64)
    else:
        higher = {name for name, m in metrics.items() if m.direction == "higher"}
        lower_of_metric = np.array([m not in higher for m in samples.metric_keys] or [True])
        red = worst_rank(group, idx_col, samples.value, lower_of_metric[metric_col])
        run_group, run_idx, values = red.group, red.idx, red.value
        reported = None if samples.ranks is None else np.asarray(samples.ranks, dtype=np.int64)
    new_group = np.empty(len(run_group), dtype=bool)  # group starts among the reduced rows
    new_group[0] = True
    new_group[1:] = run_group[1:] != run_group[:-1]
    gstarts = np.flatnonzero(new_group)
    groups = run_group[gstarts]
    starts = np.append(gstarts, len(run_group))
    if reported is not None and in_order:  # pre-reduced rows
        ranks_per_group = np.maximum.reduceat(reported, gstarts)
        rows_per_group = np.add.reduceat(reported, gstarts)
    elif reported is not None:  # pre-reduced rows out of order: the most ranks any of its rows had
        ranks_per_group, rows_per_group = _most_ranks(group, reported, groups)
    else:
        ranks_per_group, rows_per_group = red.most_ranks, np.add.reduceat(red.ranks, gstarts)
    keys = list(
        zip(
            map(samples.case_keys.__getitem__, (groups // n_metrics).tolist()),
            map(samples.metric_keys.__getitem__, (groups % n_metrics).tolist()),
            strict=True,
        )
    )
    return Series(keys, starts, run_idx, values, ranks_per_group.tolist(), rows_per_group.tolist())


def _most_ranks(group: np.ndarray, reported: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group of `groups` (sorted), the largest `reported` of its rows and their sum."""
    order = np.argsort(group, kind="stable")
    g, r = group[order], reported[order]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    at = np.searchsorted(g[first], groups)
    return np.maximum.reduceat(r, first)[at], np.add.reduceat(r, first)[at]


def _one_row_per_idx_in_order(group: np.ndarray, idx: np.ndarray) -> bool:
    """Rows strictly increasing in (group, idx): one row per idx, grouped, as the store sends them."""
    dg = np.diff(group)
    return bool(np.all((dg > 0) | ((dg == 0) & (np.diff(idx) > 0))))


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


def _time_stats_batch(
    base: np.ndarray, head: np.ndarray, medians: np.ndarray, cfg: CompareConfig
) -> _TimeStats:
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
    bser = series_of(base.samples, metrics)
    hser = series_of(head.samples, metrics)
    # one rule per metric name of either side, worked out before the per-group loops
    rules: dict[str, _Rule] = {
        name: _Rule.of(metrics.get(name) or Metric(name, "", "accuracy"), cfg, device, same_code)
        for name in dict.fromkeys([*base.samples.metric_keys, *head.samples.metric_keys])
    }
    bsums = bser.summaries([rules[m].metric for _, m in bser.keys])
    hsums = hser.summaries([rules[m].metric for _, m in hser.keys])
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
        medians = np.array([(mr.base.median, mr.head.median) for mr, _, _ in items])  # type: ignore[union-attr]
        stats = _time_stats_batch(base_vals, head_vals, medians, cfg)
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
    bsums: list[MetricStats],
    bg: int | None,
    hser: Series,
    hsums: list[MetricStats],
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
    if h.nonfinite:
        mr.bound_ok = False if metric.bound is not None else None
        mr.verdict = "failed"
        mr.reason = f"non-finite value at idx {h.first_nonfinite_idx}"
        return mr
    if metric.bound is not None and rule.not_judged is None:
        value = h.median if rule.judged_on_median else h.worst
        mr.bound_ok = verdict.bound_holds(value, metric.bound, metric.direction)
        if not mr.bound_ok:
            judged = verdict.judge(kind, metric.direction, metric.bound, h)
            mr.verdict, mr.reason = "failed", judged.reason
            return mr
    if b is None:
        mr.verdict, mr.reason = "added", "metric only in head"
        return mr
    if b.nonfinite:
        mr.verdict, mr.reason = "improved", "base had non-finite values, head is finite"
        return mr

    if kind == "time" and metric.repeated:
        if b.median <= 0 or h.median <= 0:
            mr.verdict, mr.reason = "changed", "non-positive median time, ratio undefined (recorded)"
            return mr
        assert bg is not None and hg is not None
        pending.setdefault((b.count, h.count), []).append((mr, bg, hg))
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


def _deltas(
    base: MetricStats, head: MetricStats, is_time: bool
) -> tuple[float | None, float | None, float | None]:
    """(delta, relative delta, ratio) of the compared statistic: the median for time (whose ratio
    is the batched statistics' ratio of medians, so None here), else the worst value; none when
    either side has a non-finite value."""
    b, h = (base.median, head.median) if is_time else (base.worst, head.worst)
    if base.nonfinite or head.nonfinite or not (math.isfinite(b) and math.isfinite(h)):
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
