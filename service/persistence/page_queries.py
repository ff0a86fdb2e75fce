"""The few read queries only the pages need (plots, job-list verdicts, suite overview).

Why not in the store: these shape data for drawing (raw lanes per rank, worst rank per
repetition with its idx, medians per job for sparklines). Each is one grouped SQL query whose
rows go straight into numpy, so a job with 100k samples costs a covering-index scan, not 100k
Python objects. Everything else comes from the entity modules of `service.persistence`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import Select, func, literal, select
from sqlalchemy import case as sa_case
from sqlalchemy.orm import Session

from service.persistence.models import (
    CaseResultRow,
    CaseRow,
    CommitRow,
    JobRow,
    MetricRow,
    SampleRow,
    SummaryRow,
)
from service.persistence.samples import worst_of_group
from service.persistence.summaries import stored_stats
from workers.stats import MetricStats, worst_rank


def job_case_counts(session: Session, job_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """job id -> case status -> count, for the verdict column of the job list (one query); only
    the results of each job's latest attempt (max(1, attempts)) count."""
    if not job_ids:
        return {}
    q = (
        select(CaseResultRow.job_id, CaseResultRow.status, func.count())
        .join(JobRow, JobRow.id == CaseResultRow.job_id)
        .where(CaseResultRow.job_id.in_(list(job_ids)), CaseResultRow.attempt == _job_attempt())
        .group_by(CaseResultRow.job_id, CaseResultRow.status)
    )
    out: dict[int, dict[str, int]] = {}
    for job_id, status, n in session.execute(q):
        out.setdefault(job_id, {})[status] = n
    return out


def fetch_array(session: Session, query: Select[Any], columns: int) -> np.ndarray:
    """Run `query` on the DB-API cursor and return its rows as a float64 array (NULL -> NaN).

    Why: numpy converting SQLAlchemy Row objects probes each for array attributes through
    Row.__getattr__ (an exception per row): 6 s for 100k rows, against ~0.1 s for the driver's
    plain tuples. Parameters are bound as literals (ints and names only, never user text)."""
    conn = session.connection()
    sql = str(query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql)
        rows = cursor.fetchall()
    finally:
        cursor.close()
    if not rows:
        return np.empty((0, columns))
    return np.array(rows, dtype=np.float64)


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


def _per_metric(steps: dict[int, int]) -> Any:
    """SQL: the step of each row's metric (a simple CASE on metric_id), 1 where none is asked for."""
    whens = {m: k for m, k in steps.items() if k > 1}
    return sa_case(whens, value=SampleRow.metric_id, else_=1) if whens else literal(1)


def timing_groups(
    session: Session,
    job_id: int,
    attempt: int,
    case_ids: Sequence[int],
    metrics: dict[int, tuple[str, str]],
    strides: dict[int, int],
) -> list[Group]:
    """Timing samples of one run (`attempt`) of a job for the strip plots: every repetition, or
    for a metric in `strides` only every k-th repetition (idx % k == 0, all ranks of it), so a
    page never pulls 100k rows into Python. The case and metric lists let SQLite seek each
    (case, metric) range of the covering index; the stride filter runs inside that scan.

    Returns per (case, metric) the lanes (rank -> values in idx order) and the worst rank per
    kept idx (`workers.stats.worst_rank`)."""
    if not metrics:
        return []
    s = SampleRow
    q = (
        select(s.case_id, s.metric_id, s.idx, s.rank, s.value)
        .where(s.job_id == job_id, s.attempt == attempt, s.case_id.in_(list(case_ids)),
               s.metric_id.in_(list(metrics)))
        .order_by(s.case_id, s.metric_id, s.idx, s.rank)
    )
    if any(k > 1 for k in strides.values()):
        q = q.where(s.idx % _per_metric(strides) == 0)
    arr = fetch_array(session, q, 5)
    if arr.size == 0:
        return []
    case, metric = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)
    idx, rank, value = arr[:, 2].astype(np.int64), arr[:, 3].astype(np.int64), arr[:, 4]
    key = case * (1 << 32) + metric
    cut = np.flatnonzero(np.diff(key)) + 1
    starts, ends = np.r_[0, cut], np.r_[cut, len(key)]
    out: list[Group] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        name, direction = metrics[int(metric[a])]
        gi, gr, gv = idx[a:b], rank[a:b], value[a:b]
        worst = worst_rank(np.zeros(b - a, np.int64), gi, gv, np.full(b - a, direction != "higher"))
        order = np.argsort(gr, kind="stable")  # rank-major, idx order kept inside a rank
        rs, vs = gr[order], gv[order]
        rcut = np.r_[0, np.flatnonzero(np.diff(rs)) + 1, len(rs)]
        lanes = {int(rs[c0]): vs[c0:c1] for c0, c1 in itertools.pairwise(rcut.tolist())}
        out.append(Group(int(case[a]), name, lanes, worst.idx, worst.value))
    return out


def step_groups(
    session: Session,
    job_id: int,
    attempt: int,
    case_ids: Sequence[int],
    metrics: dict[int, tuple[str, str]],
    bins: dict[int, int],
) -> list[Group]:
    """Per-step series (trajectories) reduced in SQL: the worst rank of each step, and for a
    metric in `bins` the worst value of each bin of k steps (a spike is never lost).
    One grouped query in index order; only the (binned) steps cross into Python."""
    if not metrics:
        return []
    s = SampleRow
    b = (s.idx // _per_metric(bins)) if any(v > 1 for v in bins.values()) else s.idx
    higher = [mid for mid, (_, direction) in metrics.items() if direction == "higher"]
    q = (
        select(s.case_id, s.metric_id, func.min(s.idx), worst_of_group(higher))
        .where(s.job_id == job_id, s.attempt == attempt, s.case_id.in_(list(case_ids)),
               s.metric_id.in_(list(metrics)))
        .group_by(s.case_id, s.metric_id, b)
        .order_by(s.case_id, s.metric_id, b)
    )
    arr = fetch_array(session, q, 4)
    if arr.size == 0:
        return []
    case, metric = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)
    key = case * (1 << 32) + metric
    cut = np.flatnonzero(np.diff(key)) + 1
    out: list[Group] = []
    for a, e in zip(np.r_[0, cut].tolist(), np.r_[cut, len(key)].tolist(), strict=True):
        name, _ = metrics[int(metric[a])]
        out.append(Group(int(case[a]), name, {}, arr[a:e, 2].astype(np.int64), arr[a:e, 3].copy()))
    return out


def _job_attempt() -> Any:
    """SQL: the job's latest run, max(1, attempts): the only summary and case-result rows a page
    shows."""
    return sa_case((JobRow.attempts > 1, JobRow.attempts), else_=1)


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
    jq = select(JobRow.id).where(JobRow.suite == suite, JobRow.status == "succeeded")
    if device:
        jq = jq.where(JobRow.device == device)
    if world_size:
        jq = jq.where(JobRow.world_size == world_size)
    job_ids = sorted(session.scalars(jq.order_by(JobRow.id.desc()).limit(last)).all())
    mq = select(MetricRow).where(MetricRow.suite == suite, MetricRow.kind == kind)
    mdefs = {m.id: m for m in session.scalars(mq)}
    if not job_ids or not mdefs:
        return []
    r = SummaryRow
    q = (
        select(r.case_id, r.metric_id, r.job_id, r.median)
        .join(JobRow, JobRow.id == r.job_id)
        .where(r.job_id.in_(job_ids), r.metric_id.in_(list(mdefs)), r.attempt == _job_attempt())
        .order_by(r.case_id, r.metric_id, r.job_id)
    )
    per: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
    for cid, mid, jid, med in session.execute(q):
        jobs, meds = per.setdefault((cid, mid), ([], []))
        jobs.append(jid)
        meds.append(float("nan") if med is None else med)
    if not per:
        return []
    cases = {c.id: c for c in session.scalars(select(CaseRow).where(CaseRow.id.in_({c for c, _ in per})))}
    out = []
    for (cid, mid), (jobs, meds) in sorted(per.items(), key=lambda kv: (cases[kv[0][0]].name, kv[0][1])):
        c, m = cases[cid], mdefs[mid]
        out.append(OverviewSeries(cid, c.name, c.fingerprint, c.device, c.world_size, m.name, m.unit,
                                  m.direction, jobs, meds))
    return out


def suites_with_results(session: Session) -> list[str]:
    return sorted(session.scalars(select(JobRow.suite).distinct()).all())


def case_metric_names(session: Session, fingerprint: str) -> list[str]:
    """Metrics that have samples for this case in any job (for the history picker).

    One EXISTS per metric of the case's suite, each answered by the first entry of
    `ix_sample_case`: flat in the number of jobs and samples, where a DISTINCT over the case's
    samples read every sample of the case in every job."""
    case = session.scalar(select(CaseRow).where(CaseRow.fingerprint == fingerprint))
    if case is None:
        return []
    has_samples = (
        select(SampleRow.id)
        .where(SampleRow.case_id == case.id, SampleRow.metric_id == MetricRow.id)
        .exists()
    )
    q = select(MetricRow.name).where(MetricRow.suite == case.suite, has_samples).order_by(MetricRow.name)
    return list(session.scalars(q).all())


def previous_job(session: Session, job: JobRow) -> JobRow | None:
    """The run before this one of the same suite, preset, device and world size that succeeded:
    the natural base of a "what changed?" comparison."""
    q = (
        select(JobRow)
        .where(JobRow.id < job.id, JobRow.suite == job.suite, JobRow.preset == job.preset,
               JobRow.device == job.device, JobRow.world_size == job.world_size, JobRow.status == "succeeded")
        .order_by(JobRow.id.desc())
        .limit(1)
    )
    return session.scalars(q).unique().first()


@dataclass(frozen=True)
class SeriesJob:
    """What the history page shows of a job: its id, commit and end."""

    id: int
    code_commit: str | None  # as JobRow.code_commit
    finished_at: datetime | None


@dataclass
class SeriesStat:
    """One job of a series with its statistics of the case and metric (worst rank applied)."""

    job: SeriesJob | JobRow
    stats: MetricStats


def series_summaries(session: Session, case_id: int, metric_id: int, *, last: int = 200) -> list[SeriesStat]:
    """The last `last` succeeded jobs' stored summaries of one series, oldest first: one indexed
    query instead of re-reducing every job's raw samples (finished jobs' samples never change).
    Ordered by the summary's job id so that `ix_summary_series` is read newest-first and stops
    after `last` rows, whatever the number of jobs in the store; only the three job columns the
    page shows are read (a whole `Job` row, with its JSON columns, cost more than the query)."""
    r = SummaryRow
    q = (
        select(JobRow.id, func.coalesce(JobRow.backend_commit, CommitRow.sha), JobRow.finished_at,
               r.count, r.median, r.min, r.p90, r.max, r.mean, r.nonfinite, r.direction)
        .select_from(r)
        .join(JobRow, JobRow.id == r.job_id)
        .outerjoin(CommitRow, CommitRow.id == JobRow.commit_id)
        .where(r.case_id == case_id, r.metric_id == metric_id, JobRow.status == "succeeded",
               r.attempt == _job_attempt())
        .order_by(r.job_id.desc())
        .limit(last)
    )
    out = [SeriesStat(SeriesJob(jid, sha, end), stored_stats(n, med, p90, lo, hi, mean, bad, way or "lower"))
           for jid, sha, end, n, med, lo, p90, hi, mean, bad, way in session.execute(q)]
    return out[::-1]
