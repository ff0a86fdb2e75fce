"""The few read queries only the pages need (plots, job-list verdicts, suite overview).

Why not in the store: these shape data for drawing (raw lanes per rank, worst rank per
repetition with its idx, medians per job for sparklines). Each is one grouped SQL query whose
rows go straight into numpy, so a job with 100k samples costs a covering-index scan, not 100k
Python objects. Everything else comes from `service.store`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Case, CaseResult, Job, MetricDef, SampleRow, SummaryRow


def job_case_counts(session: Session, job_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """job id -> case status -> count, for the verdict column of the job list (one query)."""
    if not job_ids:
        return {}
    q = (
        select(CaseResult.job_id, CaseResult.status, func.count())
        .where(CaseResult.job_id.in_(list(job_ids)))
        .group_by(CaseResult.job_id, CaseResult.status)
    )
    out: dict[int, dict[str, int]] = {}
    for job_id, status, n in session.execute(q):
        out.setdefault(job_id, {})[status] = n
    return out


@dataclass
class Group:
    """Samples of one (case, metric) in one job, for plots.

    `lanes`: rank -> values in idx order (every repetition of that rank);
    `idx`/`worst`: per idx the worst rank's value (max for lower-is-better, min for higher; NaN wins).
    """

    case_id: int
    metric: str
    lanes: dict[int, np.ndarray]
    idx: np.ndarray
    worst: np.ndarray


def plot_groups(
    session: Session, job_id: int, attempt: int, metrics: dict[int, tuple[str, str]]
) -> list[Group]:
    """Raw samples of the given metrics (id -> (name, direction)) of one run (`attempt`) of a job,
    grouped for plots. One query in the order of the covering index (job, attempt, case, metric,
    idx, rank): no sort in SQL, no per-row Python objects."""
    if not metrics:
        return []
    s = SampleRow
    q = (
        select(s.case_id, s.metric_id, s.idx, s.rank, s.value)
        .where(s.job_id == job_id, s.attempt == attempt, s.metric_id.in_(list(metrics)))
        .order_by(s.case_id, s.metric_id, s.idx, s.rank)
    )
    rows = session.connection().execute(q).all()
    if not rows:
        return []
    arr = np.array(rows, dtype=np.float64)
    case, metric = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)
    idx, rank, value = arr[:, 2].astype(np.int64), arr[:, 3].astype(np.int64), arr[:, 4]
    key = case * (1 << 32) + metric
    cut = np.flatnonzero(np.diff(key)) + 1
    starts, ends = np.r_[0, cut], np.r_[cut, len(key)]
    out: list[Group] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        name, direction = metrics[int(metric[a])]
        gi, gr, gv = idx[a:b], rank[a:b], value[a:b]
        # worst rank per idx: runs of equal idx (rows are idx-major)
        run = np.r_[0, np.flatnonzero(np.diff(gi)) + 1]
        signed = gv if direction != "higher" else -gv
        nan_in_run = np.add.reduceat(np.isnan(gv).astype(np.int64), run) > 0
        with np.errstate(invalid="ignore"):
            w = np.fmax.reduceat(signed, run)
        w = w if direction != "higher" else -w
        w[nan_in_run] = np.nan
        order = np.argsort(gr, kind="stable")  # rank-major, idx order kept inside a rank
        rs, vs = gr[order], gv[order]
        rcut = np.r_[0, np.flatnonzero(np.diff(rs)) + 1, len(rs)]
        lanes = {int(rs[c0]): vs[c0:c1] for c0, c1 in itertools.pairwise(rcut.tolist())}
        out.append(Group(int(case[a]), name, lanes, gi[run], w))
    return out


@dataclass
class OverviewSeries:
    """Medians of one (case, metric) over the last jobs of a suite, oldest first."""

    case_id: int
    case: str
    fingerprint: str
    device: str
    world_size: int
    metric: str
    unit: str
    direction: str
    job_ids: list[int]
    medians: list[float]


def suite_overview(
    session: Session,
    suite: str,
    kind: str,
    *,
    device: str | None = None,
    world_size: int | None = None,
    last: int = 20,
) -> list[OverviewSeries]:
    """Per case and metric of `kind`, the worst-rank median in each of the last `last` succeeded
    jobs of `suite`, read from the summaries stored when each job finished (one query, no
    re-aggregation of raw samples)."""
    jq = select(Job.id).where(Job.suite == suite, Job.status == "succeeded")
    if device:
        jq = jq.where(Job.device == device)
    if world_size:
        jq = jq.where(Job.world_size == world_size)
    job_ids = sorted(session.scalars(jq.order_by(Job.id.desc()).limit(last)).all())
    mq = select(MetricDef).where(MetricDef.suite == suite, MetricDef.kind == kind)
    mdefs = {m.id: m for m in session.scalars(mq)}
    if not job_ids or not mdefs:
        return []
    r = SummaryRow
    q = (
        select(r.case_id, r.metric_id, r.job_id, r.median)
        .where(r.job_id.in_(job_ids), r.metric_id.in_(list(mdefs)))
        .order_by(r.case_id, r.metric_id, r.job_id)
    )
    per: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
    for cid, mid, jid, med in session.execute(q):
        jobs, meds = per.setdefault((cid, mid), ([], []))
        jobs.append(jid)
        meds.append(float("nan") if med is None else med)
    if not per:
        return []
    cases = {c.id: c for c in session.scalars(select(Case).where(Case.id.in_({c for c, _ in per})))}
    out = []
    for (cid, mid), (jobs, meds) in sorted(per.items(), key=lambda kv: (cases[kv[0][0]].name, kv[0][1])):
        c, m = cases[cid], mdefs[mid]
        out.append(OverviewSeries(cid, c.name, c.fingerprint, c.device, c.world_size, m.name, m.unit,
                                  m.direction, jobs, meds))
    return out


def metric_names_by_kind(session: Session, suite: str) -> dict[str, list[str]]:
    """kind -> metric names declared by `suite` (for pickers)."""
    out: dict[str, list[str]] = {}
    for m in session.scalars(select(MetricDef).where(MetricDef.suite == suite).order_by(MetricDef.id)):
        out.setdefault(m.kind, []).append(m.name)
    return out


def suites_with_results(session: Session) -> list[str]:
    return sorted(session.scalars(select(Job.suite).distinct()).all())


def case_metric_names(session: Session, fingerprint: str) -> list[str]:
    """Metrics that have samples for this case in any job (for the history picker)."""
    q = (
        select(MetricDef.name)
        .join(SampleRow, SampleRow.metric_id == MetricDef.id)
        .join(Case, Case.id == SampleRow.case_id)
        .where(Case.fingerprint == fingerprint)
        .distinct()
        .order_by(MetricDef.name)
    )
    return list(session.scalars(q).all())
