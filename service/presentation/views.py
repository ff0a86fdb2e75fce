"""View models: turn plain result data into the rows the templates print.

Why separate from routes: these functions take plain data (case summaries with per-metric
statistics, lists of values) and return plain rows, so the layout rules (which column a metric
lands in, how a cell is judged against its bound, which case is another's baseline for a
speed-up) are unit-testable without a database or a browser.

The job page mirrors the report's tables (service/presentation/report.py, one per suite): accuracy per tensor
(relative-L2, max abs, max rel, finite), speed (median / p90 / min with the speed-up against the
baseline backend or CP mode), memory, trajectories, checks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.domain.compare import difference
from service.presentation import conventions
from service.presentation.conventions import BYTE_UNITS, human_bytes
from service.presentation.numbers import fmt
from workers import verdict
from workers.stats import CaseStats, MetricStats

# An accuracy metric named "<tensor>_<suffix>" lands in the column of its suffix.
ACCURACY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rel_l2", "rel-L2"),
    ("max_abs", "max abs"),
    ("max_rel", "max rel"),
    ("finite", "finite"),
)
# The report's baselines: P2P is compared with Ulysses (same backend), any other backend with
# eager, or with the backend the case's job names as its `baseline` (gdn-op's parameter): see
# `baseline_pairs`. The CP mode comes first: a P2P+Triton case is measured against
# Ulysses+Triton, as in the report.
BASELINE_PARAMS: tuple[tuple[str, str], ...] = (("mode", "ulysses"), ("backend", "eager"))


@dataclass(frozen=True)
class Cell:
    """A judged number: `state` is ok | bad | none; `mark` is the word/symbol shown beside the colour."""

    text: str
    state: str = "none"
    mark: str = ""
    title: str = ""


QUIET_UNITS = frozenset({"", "ratio", "abs", "bool", "count", "unit"})


def shown_unit(unit: str) -> str:
    """Units worth printing beside a number ('ms', 'x'); 'ratio', 'bool' and the like are noise."""
    return "" if unit.strip().lower() in QUIET_UNITS else unit


def judge(value: float, m: MetricStats, unit: str | None = None) -> Cell:
    """The value with ✓/✗ against the metric's bound; NaN/Inf always fails."""
    unit = shown_unit(m.unit) if unit is None else unit
    text = fmt(value, unit)
    if value != value or math.isinf(value):
        return Cell(text, "bad", "✗ not finite", "not a finite number")
    bad = m.nonfinite
    if bad:
        return Cell(text, "bad", f"✗ {bad} not finite", f"{bad} of {m.count} values not finite")
    if m.bound is None:
        return Cell(text)
    rel = "≤" if m.direction == "lower" else "≥"
    ok = verdict.bound_holds(value, m.bound, m.direction)
    title = f"bound {rel} {fmt(m.bound, unit)}"
    over = ">" if m.direction == "lower" else "<"
    return Cell(text, "ok" if ok else "bad", "✓" if ok else f"✗ {over} bound", title)


def backend_of(params: Mapping[str, Any]) -> str | None:
    """The core backend a case ran (its `backend` parameter: gdn-op, cp-layer), or None."""
    value = params.get("backend")
    return value if isinstance(value, str) and value else None


def case_backends(cases: Sequence[Any]) -> dict[str, str]:
    """fingerprint -> backend of every case that names one: the pages label each row with it."""
    return {c.fingerprint: b for c in cases if (b := backend_of(c.params or {})) is not None}


OWN_DISTRIBUTION = "gdnval"  # a backend of this distribution is our code: built in


def backend_records(info: Mapping[str, Any], our_commit: str | None = None) -> list[dict[str, str]]:
    """The ranks' record of where each backend's code came from (`info["backends"]`), as text.

    A built-in backend (distribution gdnval) is the job's own code, so its commit is the job's:
    `our_commit` (the job's record of our code's commit), else the one its ranks ran
    (`info["commit"]`), whatever the backend's record names (a job run from a commit's snapshot
    once recorded the commit of the checkout the snapshot sat in). Another distribution keeps the
    commit its ranks found installed."""
    out = []
    for b in info.get("backends") or []:
        if isinstance(b, Mapping) and b.get("backend"):
            where = b.get("distribution") or (f"not found: {b['error']}" if b.get("error") else "–")
            commit = b.get("commit")
            if where == OWN_DISTRIBUTION:
                commit = our_commit or info.get("commit") or commit
            out.append({"backend": str(b["backend"]), "distribution": str(where),
                        "version": str(b.get("version") or "–"), "commit": str(commit or "")})
    return out


def rank_backend_versions(info: Mapping[str, Any]) -> dict[str, dict[str, list[int]]]:
    """backend -> version -> the ranks that loaded it, from each rank's record
    (`info["ranks"][i]["backends"]`; a job stored before ranks recorded it has none)."""
    out: dict[str, dict[str, list[int]]] = {}
    for i, r in enumerate(info.get("ranks") or []):
        if not isinstance(r, Mapping) or not isinstance(r.get("backends"), Mapping):
            continue
        for name, version in r["backends"].items():
            out.setdefault(str(name), {}).setdefault(str(version or "–"), []).append(int(r.get("rank", i)))
    return out


def params_key(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, default=str)


def short_params(params: Mapping[str, Any], limit: int = 6) -> str:
    """`k=v` pairs for a table cell; long values abbreviated."""
    parts = []
    for k, v in list(params.items())[:limit]:
        s = json.dumps(v, default=str) if not isinstance(v, str) else v
        parts.append(f"{k}={s if len(s) <= 24 else s[:21] + '…'}")
    if len(params) > limit:
        parts.append("…")
    return " ".join(parts)


def split_accuracy_metric(name: str) -> tuple[str, str | None]:
    """'dq_rel_l2' -> ('dq', 'rel_l2'); a name without a known suffix -> (name, None)."""
    for suffix, _ in ACCURACY_COLUMNS:
        if name.endswith("_" + suffix):
            return name[: -len(suffix) - 1], suffix
        if name == suffix:
            return "", suffix
    return name, None


@dataclass
class AccuracyRow:
    case: str
    fingerprint: str
    tensor: str
    cells: dict[str, Cell]
    span: int = 0  # >0 on the first row of a case: rowspan of the case cell


def in_accuracy_table(m: MetricStats, metrics: Mapping[str, Any]) -> bool:
    """Accuracy metrics, and `<tensor>_finite` checks whose tensor has error metrics (suites may
    declare 'finite' as a check): they belong in the tensor's row, not in the checks table."""
    if m.kind == "accuracy":
        return True
    tensor, col = split_accuracy_metric(m.metric)
    return m.kind == "check" and col == "finite" and any(
        f"{tensor}_{suffix}" in metrics for suffix in ("rel_l2", "max_abs", "max_rel"))


def accuracy_rows(cases: Sequence[CaseStats]) -> list[AccuracyRow]:
    """One row per (case, tensor); columns rel-L2 / max abs / max rel / finite, each judged by
    its bound on the worst rank. Accuracy metrics without a known suffix get a row of their own
    (their value in the rel-L2 column is wrong, so they go to `other` instead)."""
    rows: list[AccuracyRow] = []
    for c in cases:
        tensors: dict[str, dict[str, Cell]] = {}
        for m in c.metrics.values():
            if not in_accuracy_table(m, c.metrics):
                continue
            tensor, col = split_accuracy_metric(m.metric)
            if col is None:
                tensors.setdefault(m.metric, {})["other"] = judge(m.worst, m)
                continue
            if col == "finite":
                ok = m.worst == 1.0
                cell = Cell("yes" if ok else "NO", "ok" if ok else "bad", "✓" if ok else "✗ non-finite")
            else:
                cell = judge(m.worst, m)
            tensors.setdefault(tensor or "value", {})[col] = cell
        first = len(rows)
        for tensor, cells in tensors.items():
            rows.append(AccuracyRow(c.name, c.fingerprint, tensor, cells))
        if len(rows) > first:
            rows[first].span = len(rows) - first
    return rows


def baseline_pairs(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(parameter, baseline value) pairs a case with `params` is measured against, in order: the
    CP mode Ulysses, then the backend its job names as `baseline` (eager when it names none)."""
    named = params.get("baseline")
    if not isinstance(named, str) or not named:
        return BASELINE_PARAMS
    return tuple((key, named if key == "backend" else base) for key, base in BASELINE_PARAMS)


def find_baseline(case: CaseStats, by_params: Mapping[str, CaseStats]) -> tuple[CaseStats, str] | None:
    """The case this one is measured against: the same parameters with the CP mode Ulysses or
    the baseline backend (`baseline_pairs`). Returns (baseline case, label) or None."""
    for key, base in baseline_pairs(case.params):
        value = case.params.get(key)
        if value is None or value == base:
            continue
        other = by_params.get(params_key({**case.params, key: base}))
        if other is not None:
            return other, f"vs {base}"
    return None


def baseline_metric(name: str, metrics: Mapping[str, Any]) -> str | None:
    """For a per-backend (or per-mode) metric '<x>_<rest>' of a case that measures several, the
    same measure of the baseline: 'triton_fwd_bwd_ms' -> 'eager_fwd_bwd_ms', 'p2p_layer_ms' ->
    'ulysses_layer_ms'. None when the case has no such sibling."""
    token, _, rest = name.partition("_")
    if not rest:
        return None
    for _, base in BASELINE_PARAMS:
        other = f"{base}_{rest}"
        if token != base and other in metrics:
            return other
    return None


def _baseline_of(c: CaseStats, m: MetricStats,
                 case_base: tuple[CaseStats, str] | None) -> tuple[MetricStats, str, str] | None:
    """The value this metric is measured against: the same metric of the baseline case (Ulysses
    mode / the job's baseline backend), else the baseline's metric in the same case. Returns
    (its statistics, the label, the fingerprint of the case it belongs to); the label names the
    job that measured the baseline case when this job took it from one (another process's times)."""
    if case_base is not None and m.metric in case_base[0].metrics:
        other_case = case_base[0]
        taken = f", measured by job {other_case.source_job_id}" if other_case.source_job_id else ""
        return (other_case.metrics[m.metric], f"{case_base[1]} ({other_case.name}{taken})",
                other_case.fingerprint)
    other = baseline_metric(m.metric, c.metrics)
    if other is not None:
        return c.metrics[other], f"vs {other}", c.fingerprint
    return None


TIME_UNITS = frozenset({"ns", "us", "µs", "ms", "s"})


# (fingerprint, metric name) -> that metric's values after the worst-rank reduction, one per
# repetition: what an interval is computed from (None: not loaded, so no interval is claimed).
ValuesOf = Callable[[str, str], Sequence[float] | None]
NOT_SIGNIFICANT = "~"  # the mark of a difference whose interval does not support a claim
VERSUS_NOTE = (f"[..]: 95% bootstrap interval over the repetitions; {NOT_SIGNIFICANT}: no significant "
               "difference (the interval and the test do not support a claim)")


def versus_cell(base: MetricStats, this: MetricStats, base_values: Sequence[float] | None,
                this_values: Sequence[float] | None, *, device: str | None, cp_mode: bool) -> Cell:
    """This time against its baseline's, with the interval the repetitions give
    (`service.domain.compare.judgment.difference`, the compare rule): a CP mode's gain over
    Ulysses, time saved (U − P) / U ('+17.0% [12.1, 21.5]'), or a backend's speed-up over the
    baseline backend, base / this ('2.46× [2.31, 2.60]'). Coloured only when the difference is
    significant; otherwise marked '~'. Without the values no interval, and no claim, is made."""
    style = "gain" if cp_mode else "speedup"
    if not (base.median > 0 and this.median > 0):
        return Cell("–")
    if base_values is None or this_values is None:
        point = (conventions.percent(conventions.gain(base.median, this.median), signed=True) if cp_mode
                 else conventions.speedup_text(base.median, this.median))
        return Cell(f"{point} (no interval)", "none", "", "the repetitions were not loaded: no claim made")
    d = difference(base_values, this_values, direction=this.direction, device=device)
    if d.verdict == "unknown":
        return Cell("–")
    if cp_mode:
        g, lo, hi = d.gain()
        text = f"{g:+.1%} [{lo * 100:+.1f}, {hi * 100:+.1f}]"
    else:
        s, lo, hi = d.speedup()
        text = f"{s:.3g}× [{lo:.3g}, {hi:.3g}]"
    if not d.significant:
        return Cell(f"{NOT_SIGNIFICANT} {text}", "none", "", d.describe(style))
    better = d.verdict == "better"
    return Cell(text, "ok" if better else "bad", "faster" if better else "slower", d.describe(style))


def _against_mode(label: str) -> bool:
    """Whether a baseline label names the CP mode baseline (Ulysses) rather than a backend."""
    mode_base = dict(BASELINE_PARAMS)["mode"]
    return label.startswith(f"vs {mode_base}")


@dataclass
class SpeedRow:
    case: str
    fingerprint: str
    metric: str
    unit: str
    median: Cell
    p90: str
    min: str
    n: str
    speedup: Cell
    baseline: str = ""
    span: int = 0


# Backward estimates some suites store per rank (a difference reduced afterwards, which need not
# equal the difference of the medians shown): the tables compute theirs from the medians instead.
STORED_ESTIMATES = frozenset({"bwd_est_ms", "bwd_estimate_ms"})
BWD_ESTIMATE = "bwd estimate"


def speed_rows(cases: Sequence[CaseStats], values_of: ValuesOf | None = None,
               device: str | None = None) -> list[SpeedRow]:
    """One row per (case, time metric): median / p90 / min over the worst rank per repetition,
    and the speed-up against the baseline case's same metric (a CP mode's gain over Ulysses)
    with its interval (`versus_cell`); then the backward estimate, median(fwd+bwd) − median(fwd)
    of the rows above."""
    def values(fp: str, metric: str) -> Sequence[float] | None:
        return values_of(fp, metric) if values_of is not None else None

    by_params = {params_key(c.params): c for c in cases}
    rows: list[SpeedRow] = []
    for c in cases:
        base = find_baseline(c, by_params)
        first = len(rows)
        for m in c.metrics.values():
            if m.kind != "time" or m.metric in STORED_ESTIMATES:
                continue
            sp, label = Cell("–"), ""
            against = _baseline_of(c, m, base) if m.unit in TIME_UNITS else None
            if against is not None:
                base_m, label, base_fp = against
                sp = versus_cell(base_m, m, values(base_fp, base_m.metric), values(c.fingerprint, m.metric),
                                 device=device, cp_mode=_against_mode(label))
            n = f"{m.count}" + (f" × {m.ranks} ranks" if m.ranks > 1 else "")
            rows.append(SpeedRow(c.name, c.fingerprint, m.metric, m.unit, judge(m.median, m), fmt(m.p90),
                                 fmt(m.min), n, sp, label))
        fwd, both = c.metrics.get("fwd_ms"), c.metrics.get("fwd_bwd_ms")
        if fwd is not None and both is not None and fwd.unit == both.unit and fwd.kind == both.kind == "time":
            est = conventions.bwd_estimate(fwd.median, both.median)
            cell = Cell(fmt(est, shown_unit(fwd.unit)), title="median(fwd+bwd) − median(fwd)")
            rows.append(SpeedRow(c.name, c.fingerprint, BWD_ESTIMATE, fwd.unit, cell, "–", "–", "–",
                                 Cell("–")))
        if len(rows) > first:
            rows[first].span = len(rows) - first
    return rows


def memory_versus(value: float, base: float, unit: str) -> Cell:
    """'3.84× lower' for a real factor; near parity (within 5%) the difference itself,
    '12.0 MiB higher (+0.2%)', since '1.00× higher' says nothing."""
    r = base / value
    title = f"baseline {human_bytes(base, unit)}"
    if 1 / 1.05 <= r <= 1.05:
        diff = human_bytes(abs(value - base), unit)
        word = "higher" if value > base else ("lower" if value < base else "equal")
        text = f"{diff} {word} ({value / base - 1:+.1%})" if word != "equal" else "equal"
        return Cell(text, "none", "", title)
    if r >= 1:
        return Cell(f"{r:.2f}× lower", "ok", "", title)
    return Cell(f"{1 / r:.2f}× higher", "bad", "", title)


@dataclass
class MemoryRow:
    case: str
    fingerprint: str
    metric: str
    value: Cell
    versus: Cell
    baseline: str = ""
    span: int = 0


def memory_rows(cases: Sequence[CaseStats], *, tracked: bool = True) -> list[MemoryRow]:
    """One row per (case, memory metric): the max over ranks, and how many times lower than the
    baseline case (the report's 'about 3.84× lower'). On a device that keeps no allocator
    statistics (`tracked` False) the peak readings say "not tracked"."""
    by_params = {params_key(c.params): c for c in cases}
    rows: list[MemoryRow] = []
    for c in cases:
        base = find_baseline(c, by_params)
        first = len(rows)
        for m in c.metrics.values():
            if m.kind != "memory":
                continue
            v = m.worst
            if not tracked and conventions.allocator_reading(m.metric, m.unit):
                untracked = Cell(conventions.NOT_TRACKED)
                rows.append(MemoryRow(c.name, c.fingerprint, m.metric, untracked, Cell("–")))
                continue
            cell = judge(v, m, unit="")
            cell = Cell(human_bytes(v, m.unit), cell.state, cell.mark, cell.title)
            versus, label = Cell("–"), ""
            against = _baseline_of(c, m, base) if m.unit.lower() in BYTE_UNITS else None
            if against is not None:
                bv = against[0].worst
                if v > 0 and bv > 0:
                    versus = memory_versus(v, bv, m.unit)
                    label = against[1]
            rows.append(MemoryRow(c.name, c.fingerprint, m.metric, cell, versus, label))
        if len(rows) > first:
            rows[first].span = len(rows) - first
    return rows


@dataclass
class ValueRow:
    """Trajectory and check metrics: the worst value over steps/ranks against the bound."""

    case: str
    fingerprint: str
    metric: str
    value: Cell
    steps: int
    span: int = 0


def value_rows(cases: Sequence[CaseStats], kind: str) -> list[ValueRow]:
    rows: list[ValueRow] = []
    for c in cases:
        first = len(rows)
        for m in c.metrics.values():
            if m.kind == kind and not in_accuracy_table(m, c.metrics):
                rows.append(ValueRow(c.name, c.fingerprint, m.metric, judge(m.worst, m), m.count))
        if len(rows) > first:
            rows[first].span = len(rows) - first
    return rows


def case_verdict(status: str | None, cells: Sequence[Cell]) -> tuple[str, str]:
    """A case's word and css class: its run status, downgraded to 'failed' if a bound is broken."""
    if status in ("error", "failed", "skipped"):
        return status, f"st-{status}"
    if any(c.state == "bad" for c in cells):
        return "out of bound", "st-failed"
    if status is None:
        return "no result", "st-queued"
    return status.replace("_", " "), f"st-{status}"


@dataclass
class CaseView:
    name: str
    fingerprint: str
    params: dict[str, Any]
    status: str
    status_class: str
    error: str | None
    expected_error: str | None
    bad_metrics: list[str] = field(default_factory=list)
    source_job_id: int | None = None  # the job that measured it, when this job took it from one


def case_views(cases: Sequence[CaseStats]) -> list[CaseView]:
    out = []
    for c in cases:
        bad = []
        cells = []
        for m in c.metrics.values():
            if in_accuracy_table(m, c.metrics) and split_accuracy_metric(m.metric)[1] == "finite":
                cell = Cell("", "ok" if m.worst == 1.0 else "bad")
            else:  # the statistic the kind is judged on (workers.verdict.JUDGED_ON)
                cell = judge(verdict.judged_value(m.kind, m), m)
            cells.append(cell)
            if cell.state == "bad":
                bad.append(m.metric)
        word, css = case_verdict(c.status, cells)
        out.append(CaseView(c.name, c.fingerprint, dict(c.params), word, css, c.error, c.expected_error, bad,
                            c.source_job_id))
    return out


def job_verdict(status: str, stored: str | None, case_counts: Mapping[str, int]) -> tuple[str, str]:
    """The verdict column and badge: the job's stored verdict (`workers.verdict.job_verdict`,
    recorded when it ended; recomputed from the case counts for jobs stored before verdicts
    were), with its counts; nothing while the job is queued or running."""
    if status in ("queued", "running"):
        return "–", ""
    judged = verdict.job_verdict(
        [s for s, n in case_counts.items() for _ in range(n)], ran=status == "succeeded"
    )
    word = stored or judged.verdict
    total = sum(case_counts.values())
    bad = case_counts.get("failed", 0) + case_counts.get("error", 0)
    detail = f"{bad} of {total} cases" if bad else f"{total} cases"
    if status != "succeeded":
        detail = f"job {status}"
    css = {"passed": "v-unchanged", "failed": "v-failed", "errored": "v-errored"}[word]
    return f"{word} ({detail})", css


def duration(start: datetime | None, end: datetime | None, now: datetime | None = None) -> str:
    """'1 h 02 min', '3 min 05 s', '12.3 s'; running jobs count to `now`."""
    if start is None:
        return "–"
    end = end or now
    if end is None:
        return "–"
    s = (end - start).total_seconds()
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def progress_percent(done: int, total: int) -> int:
    return round(100 * done / total) if total > 0 else 0


# ---------------------------------------------------------------------------------------- compare

COMPARE_VIEWS: dict[str, str] = {
    "changes": "changes only",
    "regressions": "regressions and failures",
    "all": "every metric",
}
_BAD_VERDICTS = frozenset({"regressed", "failed", "worsened", "errored"})


def stat_text(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    return human_bytes(value, unit) if unit.strip().lower() in BYTE_UNITS else fmt(value, shown_unit(unit))


def compare_verdict(cmp: Any) -> tuple[str, str]:
    """The comparison's verdict as the compare page and `gdnval compare` print it, with its
    badge class."""
    if cmp.passed:
        return "PASS: no regression", "v-unchanged"
    return f"FAIL: {len(cmp.failing_cases())} case(s) regressed or failed", "v-regressed"


def compare_rows(cmp: Any, show: str = "changes", history_query: str = "") -> list[dict[str, Any]]:
    """Rows of the compare table: per case and metric the base and head statistic (median for
    time, worst value otherwise), delta, ratio, CI, p, verdict and its reason; each case links
    its history (`history_query` added: the repository of the head's commits, when not ours).

    show='changes' hides unchanged metrics (a case then says how many it hid), 'regressions'
    keeps only regressed/failed/worsened/errored ones, 'all' keeps everything."""
    rows: list[dict[str, Any]] = []
    for c in cmp.cases:
        metrics = list(c.metrics)
        if show == "regressions":
            metrics = [m for m in metrics if m.verdict in _BAD_VERDICTS]
            if not metrics and c.verdict not in _BAD_VERDICTS:
                continue
        elif show == "changes":
            metrics = [m for m in metrics if m.verdict != "unchanged"]
        hidden = len(c.metrics) - len(metrics)
        first = len(rows)
        for m in metrics:
            stat = "median" if m.kind == "time" else "worst"
            b = getattr(m.base, stat) if m.base is not None else None
            h = getattr(m.head, stat) if m.head is not None else None
            delta = "–"
            if m.delta is not None:
                delta = stat_text(m.delta, m.unit)
                if m.rel_delta is not None and math.isfinite(m.rel_delta):
                    delta += f" ({m.rel_delta:+.1%})"
            rows.append({
                "case": c.name, "fingerprint": c.fingerprint, "case_verdict": c.verdict,
                "backend": backend_of(c.params or {}), "metric": m.metric, "verdict": m.verdict,
                "reason": m.reason,
                "base": stat_text(b, m.unit), "head": stat_text(h, m.unit), "delta": delta,
                "ratio": f"{m.ratio:.3f}" if m.ratio is not None and math.isfinite(m.ratio) else "–",
                "ci": f"[{m.ci_low:.3f}, {m.ci_high:.3f}]" if m.ci_low is not None and m.ci_high is not None
                else "–",
                "p": f"{m.p_value:.2g}" if m.p_value is not None else "–",
            })
        if len(rows) == first:  # nothing to list: one row that says why
            reason = c.reason or ""
            if hidden:
                extra = f"; {reason}" if reason and c.verdict != "unchanged" else ""
                reason = f"{hidden} metric(s) unchanged{extra}"
            rows.append({"case": c.name, "fingerprint": c.fingerprint, "case_verdict": c.verdict,
                         "backend": backend_of(c.params or {}), "metric": "(case)", "verdict": c.verdict,
                         "reason": reason, "base": "–",
                         "head": "–", "delta": "–", "ratio": "–", "ci": "–", "p": "–"})
        rows[first]["span"] = len(rows) - first
        rows[first]["hidden"] = hidden if len(rows) - first > 0 and metrics else 0
        rows[first]["history"] = next(
            (f"/history?fingerprint={c.fingerprint}&metric={m.metric}{history_query}" for m in c.metrics
             if m.kind == "time"), None)
    return rows
