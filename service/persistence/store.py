"""Data access of the results store: the functions the API, pages, compare and gate share.

Writes that are hot (samples) go through SQLAlchemy Core executemany in one transaction per
batch, so a batch is either fully stored or absent. Summaries apply the worst rank first (per
idx: max over ranks for lower-is-better metrics, min for higher-is-better), then take statistics
in numpy over the rows SQL already grouped, never per-row Python.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, Select, Text, cast, delete, func, insert, select
from sqlalchemy import case as sa_case
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from service.persistence.artifacts import artifact_path
from service.persistence.db import immediate, write_tx
from service.persistence.models import (
    ArtifactRow,
    BaselineRow,
    CaseResultRow,
    CaseRow,
    CommitRow,
    JobEventRow,
    JobRow,
    MetricRow,
    SampleRow,
    SummaryRow,
)
from workers import verdict
from workers.suite import Case, Metric

SAMPLE_BATCH = 20_000  # rows per executemany; bounds memory, keeps each batch one transaction

# ---------------------------------------------------------------------------------------- writes


def ensure_commit(session: Session, sha: str | None, **fields: Any) -> CommitRow | None:
    """The commit row for `sha` (a hex sha or a ref, as submitted), created on first use."""
    if not sha:
        return None
    row = session.scalar(select(CommitRow).where(CommitRow.sha == sha))
    if row is None:
        try:
            with session.begin_nested():
                row = CommitRow(sha=sha, **fields)
                session.add(row)
        except IntegrityError:  # created concurrently
            row = session.scalar(select(CommitRow).where(CommitRow.sha == sha))
    else:
        for key, value in fields.items():
            if value is not None:
                setattr(row, key, value)
    return row


def ensure_metrics(session: Session, suite: str, metrics: Iterable[Metric]) -> dict[str, int]:
    """Store (or refresh) a suite's metric declarations; returns name -> metric id."""
    existing = {m.name: m for m in session.scalars(select(MetricRow).where(MetricRow.suite == suite))}
    for m in metrics:
        row = existing.get(m.name)
        if row is None:
            row = MetricRow(suite=suite, name=m.name)
            session.add(row)
            existing[m.name] = row
        row.unit, row.kind, row.direction, row.bound = m.unit, m.kind, m.direction, m.bound
        row.description, row.min_effect = m.description, m.min_effect  # declared (None: the kind's)
    session.flush()
    return {name: row.id for name, row in existing.items()}


def ensure_cases(
    session: Session, cases: Iterable[Case], device: str, world_size: int
) -> dict[str, int]:
    """Case rows (one per fingerprint) for a job's matrix; returns case name -> case id."""
    out: dict[str, int] = {}
    for c in cases:
        fp = c.fingerprint(device, world_size)
        row = session.scalar(select(CaseRow).where(CaseRow.fingerprint == fp))
        if row is None:
            row = CaseRow(
                fingerprint=fp,
                suite=c.suite,
                name=c.name,
                params=dict(c.params),
                device=device,
                world_size=world_size,
                expected_error=c.expected_error,
            )
            session.add(row)
            session.flush()
        out[c.name] = row.id
    return out


def insert_samples(
    engine: Engine, job_id: int, rows: Sequence[tuple[int, int, int, int, float]], attempt: int = 1
) -> int:
    """Store `(case_id, metric_id, rank, idx, value)` rows of one job's run in one transaction."""
    return insert_sample_rows(engine, [(job_id, attempt, c, m, r, i, v) for c, m, r, i, v in rows])


SAMPLE_COLUMNS: tuple[str, ...] = ("job_id", "attempt", "case_id", "metric_id", "rank", "idx", "value")


def insert_sample_rows(engine: Engine, rows: Sequence[tuple[int, int, int, int, int, int, float]]) -> int:
    """Store full `SAMPLE_COLUMNS` tuples in one transaction (the sink's hot path: no re-packing)."""
    if not rows:
        return 0
    with immediate(engine).begin() as conn:
        raw = conn.dialect.paramstyle == "qmark"  # pysqlite: multi-row VALUES on the DBAPI cursor
        for start in range(0, len(rows), SAMPLE_BATCH):
            chunk = rows[start : start + SAMPLE_BATCH]
            if raw:
                _insert_qmark(conn, chunk)
            else:
                conn.execute(
                    insert(SampleRow.__table__), [dict(zip(SAMPLE_COLUMNS, r, strict=True)) for r in chunk]
                )
    return len(rows)


ROWS_PER_STATEMENT = 100  # 700 parameters per INSERT, far below SQLite's variable limit


def _insert_qmark(conn: Any, chunk: Sequence[tuple[Any, ...]]) -> None:
    """One INSERT per 100 rows: about 1.7x fewer CPU seconds than a row-per-statement executemany."""
    n = ROWS_PER_STATEMENT
    full = len(chunk) // n * n
    cur = conn.connection.cursor()  # inside the transaction SQLAlchemy began on this connection
    dbapi_error = conn.dialect.loaded_dbapi.Error
    try:
        if full:
            cur.executemany(
                _QMARK_MULTI, [tuple(chain.from_iterable(chunk[j : j + n])) for j in range(0, full, n)]
            )
        if full < len(chunk):
            cur.executemany(_QMARK_INSERT, chunk[full:])
    except dbapi_error as exc:  # as SQLAlchemy would raise it (IntegrityError, OperationalError, ...)
        raise DBAPIError.instance(_QMARK_INSERT, None, exc, dbapi_error) from exc
    finally:
        cur.close()


_QMARK_INSERT = (
    "INSERT INTO sample (job_id, attempt, case_id, metric_id, rank, idx, value) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_QMARK_MULTI = (
    _QMARK_INSERT.partition(" VALUES ")[0]
    + " VALUES "
    + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * ROWS_PER_STATEMENT)
)


def add_event(
    session: Session, job_id: int, kind: str, message: str = "", data: Mapping[str, Any] | None = None
) -> JobEventRow:
    ev = JobEventRow(job_id=job_id, kind=kind, message=message, data=dict(data) if data else None)
    session.add(ev)
    return ev


def set_case_result(
    session: Session, job_id: int, case_id: int, status: str, error: str | None, attempt: int | None = None
) -> None:
    """Record (or overwrite, if reported again) a case's outcome in one run of a job: `attempt`,
    the run that reported it (default: the job's current one). A stale run passes its own
    attempt, so it never touches the rows of a later run, and readers never show its rows."""
    if attempt is None:
        job = session.get(JobRow, job_id)
        attempt = job_attempt(job) if job is not None else 1
    r = CaseResultRow
    row = session.scalar(select(r).where(r.job_id == job_id, r.attempt == attempt, r.case_id == case_id))
    if row is None:
        session.add(CaseResultRow(job_id=job_id, attempt=attempt, case_id=case_id, status=status,
                                  error=error))
    else:
        row.status, row.error = status, error


def drop_earlier_case_results(session: Session, job_id: int, attempt: int) -> None:
    """Case results of the job's runs before `attempt`: never shown again once a new run started."""
    r = CaseResultRow
    session.execute(delete(r).where(r.job_id == job_id, r.attempt < attempt))


def latest_case_results(session: Session, job_id: int) -> list[CaseResultRow]:
    """The case results of the job's latest attempt (what pages, the API, compare and gate read)."""
    job = session.get(JobRow, job_id)
    if job is None:
        return []
    r = CaseResultRow
    return list(session.scalars(select(r).where(r.job_id == job_id, r.attempt == job_attempt(job))))


def save_artifact(
    session: Session, job_id: int, name: str, media_type: str, data: bytes, artifacts_dir: Path
) -> ArtifactRow:
    """Write the artifact under `artifacts_dir` at `service.persistence.artifacts.artifact_path` (a folder of
    this store, then the job) and record it (replaces same name)."""
    path = artifact_path(artifacts_dir, session.get_bind().engine.url, job_id, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(path)  # atomic: a crash never leaves a half-written artifact under its name
    row = session.scalar(select(ArtifactRow).where(ArtifactRow.job_id == job_id, ArtifactRow.name == name))
    if row is None:
        row = ArtifactRow(job_id=job_id, name=name, media_type=media_type, size=len(data), path=str(path))
        session.add(row)
    else:
        row.media_type, row.size, row.path, row.blob = media_type, len(data), str(path), None
    return row


# ----------------------------------------------------------------------------------------- reads


def get_job(session: Session, job_id: int) -> JobRow | None:
    return session.get(JobRow, job_id)


def list_jobs(
    session: Session,
    *,
    status: str | None = None,
    suite: str | None = None,
    commit: str | None = None,
    device: str | None = None,
    label: tuple[str, str] | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> tuple[list[JobRow], int | None]:
    """Newest first. Returns the page and the cursor (an id) for the next page, or None."""
    q = select(JobRow).order_by(JobRow.id.desc()).limit(limit + 1)
    if status:
        q = q.where(JobRow.status == status)
    if suite:
        q = q.where(JobRow.suite == suite)
    if device:
        q = q.where(JobRow.device == device)
    if commit:
        q = q.where(JobRow.commit_id.in_(commit_ids(commit)))
    if before_id is not None:
        q = q.where(JobRow.id < before_id)
    if label is not None:
        q = q.where(JobRow.labels[label[0]].as_string() == label[1])
    rows = list(session.scalars(q).unique())
    nxt = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], nxt


def job_events(
    session: Session, job_id: int, *, after_id: int = 0, limit: int = 200, kind: str | None = None
) -> tuple[list[JobEventRow], int | None]:
    """Oldest first from `after_id`; returns the page and the next cursor (an event id) or None."""
    q = (
        select(JobEventRow)
        .where(JobEventRow.job_id == job_id, JobEventRow.id > after_id)
        .order_by(JobEventRow.id)
        .limit(limit + 1)
    )
    if kind:
        q = q.where(JobEventRow.kind == kind)
    rows = list(session.scalars(q))
    nxt = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], nxt


@dataclass
class MetricSummary:
    """Statistics of one metric of one case in one job, after the worst-rank reduction
    (`workers.verdict`: statistics of the finite values, non-finite ones counted)."""

    metric: str
    unit: str
    kind: str
    direction: str
    bound: float | None  # the bound it was judged with (copied onto the stored row)
    count: int  # number of idx values (after the rank reduction)
    samples: int  # raw rows (all ranks)
    ranks: int
    median: float
    p90: float
    min: float
    max: float
    mean: float
    passes: bool | None  # workers.verdict.judge (None when the metric has no bound and is finite)
    nonfinite: int = 0

    @property
    def stats(self) -> verdict.Stats:
        worst = math.nan if self.nonfinite else (self.max if self.direction == "lower" else self.min)
        return verdict.Stats(self.count, self.nonfinite, self.median, self.p90, self.min, self.max,
                             self.mean, worst)  # fmt: skip


def _summary(
    name: str, unit: str, kind: str, direction: str, bound: float | None, stats: verdict.Stats,
    samples: int, ranks: int,
) -> MetricSummary:
    judged = verdict.judge(kind, direction, bound, stats)
    return MetricSummary(
        metric=name, unit=unit, kind=kind, direction=direction, bound=bound, count=stats.n,
        samples=samples, ranks=ranks, median=stats.median, p90=stats.p90, min=stats.min,
        max=stats.max, mean=stats.mean, passes=judged.ok, nonfinite=stats.nonfinite,
    )  # fmt: skip


@dataclass
class CaseSummary:
    case_id: int
    name: str
    fingerprint: str
    params: dict[str, Any]
    status: str | None  # None: no result reported (yet)
    error: str | None
    expected_error: str | None
    metrics: dict[str, MetricSummary] = field(default_factory=dict)


def worst_rank_arrays(
    session: Session,
    job_id: int,
    *,
    case_id: int | None = None,
    metric_id: int | None = None,
    case_ids: Sequence[int] | None = None,
    attempt: int | None = None,
) -> dict[tuple[int, int], WorstRank]:
    """(case_id, metric_id) -> the job's latest-attempt (or `attempt`'s) values after the
    worst-rank reduction, of every case or only of `case_id` / `case_ids`.

    One SQL pass over the job's covering index reduces ranks per idx (max for lower-is-better,
    min for higher-is-better metrics; NULL, i.e. NaN, on any rank makes the idx NaN) and, on
    SQLite/PostgreSQL, string-aggregates each (case, metric) group so only one row per group
    crosses into Python, parsed by numpy in C (SQLite renders REALs with 15 significant digits).
    Values come unordered: statistics only, not pairing by idx.
    """
    job = session.get(JobRow, job_id)
    if job is None:
        return {}
    if case_ids is not None and not case_ids:
        return {}
    attempt = job_attempt(job) if attempt is None else attempt
    # metric rows are per suite (undeclared ones too, see StoreSink), so no scan of samples here
    higher = list(
        session.scalars(
            select(MetricRow.id).where(MetricRow.suite == job.suite, MetricRow.direction == "higher")
        )
    )
    s = SampleRow
    where = [s.job_id == job_id, s.attempt == attempt]
    if case_id is not None:
        where.append(s.case_id == case_id)
    if case_ids is not None:  # an IN list: SQLite seeks each case's range of the job index
        where.append(s.case_id.in_(sorted(set(case_ids))))
    if metric_id is not None:
        where.append(s.metric_id == metric_id)
    dialect = session.get_bind().dialect.name
    agg_fn = _string_agg(dialect)
    if job.world_size == 1 and agg_fn is not None:
        # one rank: nothing to reduce, aggregate the raw rows directly (about twice as fast)
        q = (
            select(
                s.case_id,
                s.metric_id,
                func.count(s.id),
                func.count(s.id) - func.count(s.value),
                agg_fn(s.value),
            )
            .where(*where)
            .group_by(s.case_id, s.metric_id)
        )
        return {
            (c, m): WorstRank(_parse(text, nans), int(total), 1)
            for c, m, total, nans, text in session.execute(q)
        }
    inner = worst_rank_per_idx(where, higher).subquery()
    if agg_fn is not None:
        q = select(
            inner.c.case_id,
            inner.c.metric_id,
            func.sum(inner.c.n),
            func.max(inner.c.n),
            func.count() - func.count(inner.c.w),
            agg_fn(inner.c.w),
        ).group_by(inner.c.case_id, inner.c.metric_id)
        return {
            (c, m): WorstRank(_parse(text, nans), int(total), int(ranks))
            for c, m, total, ranks, nans, text in session.execute(q)
        }
    # portable fallback: one row per (case, metric, idx)
    groups: dict[tuple[int, int], list[tuple[int, float | None]]] = {}
    for c, m, cnt, w in session.execute(select(inner.c.case_id, inner.c.metric_id, inner.c.n, inner.c.w)):
        groups.setdefault((c, m), []).append((cnt, w))
    return {
        key: WorstRank(
            np.array([np.nan if w is None else w for _, w in items], dtype=np.float64),
            sum(i[0] for i in items),
            max(i[0] for i in items),
        )
        for key, items in groups.items()
    }


def worst_rank_per_idx(where: Sequence[Any], higher: Sequence[int]) -> Any:
    """The rank reduction of `workers.verdict` in SQL, one row per (case, metric, idx) over the
    covering job index: case_id, metric_id, idx, n (rows: the ranks reporting) and w (the worst
    rank's value: max, or min for the `higher` metric ids; NULL, i.e. NaN, when any rank's is)."""
    s = SampleRow
    n = func.count(s.id)
    worst = func.max(s.value)
    if higher:
        worst = sa_case((s.metric_id.in_(list(higher)), func.min(s.value)), else_=func.max(s.value))
    return (
        select(
            s.case_id.label("case_id"),
            s.metric_id.label("metric_id"),
            s.idx.label("idx"),
            n.label("n"),
            sa_case((func.count(s.value) < n, None), else_=worst).label("w"),
        )
        .where(*where)
        .group_by(s.case_id, s.metric_id, s.idx)
    )


@dataclass(frozen=True)
class WorstRank:
    values: np.ndarray  # one value per idx (unordered); NaN where any rank reported NaN
    samples: int  # raw rows across ranks
    ranks: int  # the most rows any idx has (= ranks reporting)


def _string_agg(dialect: str) -> Any:
    if dialect in ("sqlite", "mysql", "mariadb"):
        return func.group_concat
    if dialect == "postgresql":
        return lambda col: func.string_agg(cast(col, Text), ",")
    return None


def _parse(text: str | None, nans: int) -> np.ndarray:
    values = np.fromstring(text, sep=",") if text else np.empty(0)
    if nans:
        values = np.concatenate((values, np.full(int(nans), np.nan)))
    return values


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def job_attempt(job: JobRow) -> int:
    """The job's current (latest) run: what its pages and summaries show."""
    return max(1, job.attempts)


def compute_summary(
    session: Session, job_id: int, *, case_ids: Sequence[int] | None = None, attempt: int | None = None
) -> dict[tuple[int, int], MetricSummary]:
    """Summaries computed from the raw samples of the job's latest attempt (or `attempt`), of
    every case or only of `case_ids`: for cases still running, and to store when a case ends."""
    arrays = worst_rank_arrays(session, job_id, case_ids=case_ids, attempt=attempt)
    if not arrays:
        return {}
    metric_ids = {m for _, m in arrays}
    metrics = {m.id: m for m in session.scalars(select(MetricRow).where(MetricRow.id.in_(metric_ids)))}
    out: dict[tuple[int, int], MetricSummary] = {}
    for key, wr in arrays.items():
        m = metrics[key[1]]
        stats = verdict.summarise_array(wr.values, m.direction)
        out[key] = _summary(m.name, m.unit, m.kind, m.direction, m.bound, stats, wr.samples, wr.ranks)
    return out


def store_summary(
    session: Session,
    job_id: int,
    summary: dict[tuple[int, int], MetricSummary] | None = None,
    *,
    case_ids: Sequence[int] | None = None,
    attempt: int | None = None,
) -> int:
    """Store the summaries of the job's latest attempt (or `attempt`), computed here unless given.

    Without `case_ids`: the whole job's rows of that attempt are replaced, and rows of earlier
    attempts dropped. With `case_ids` (a case that just ended): only those cases' rows are
    replaced; `summary` then holds those cases only. Returns the number of rows written."""
    if attempt is None:
        job = session.get(JobRow, job_id)
        attempt = job_attempt(job) if job is not None else 1
    if summary is None:
        summary = compute_summary(session, job_id, case_ids=case_ids, attempt=attempt)
    r = SummaryRow
    if case_ids is None:
        session.execute(delete(r).where(r.job_id == job_id, r.attempt <= attempt))
    else:
        wanted = set(case_ids)
        if any(c not in wanted for c, _ in summary):
            raise ValueError("the summary holds cases that are not in case_ids")
        if wanted:
            session.execute(
                delete(r).where(r.job_id == job_id, r.attempt == attempt, r.case_id.in_(sorted(wanted)))
            )
    _add_rows(session, job_id, attempt, summary)
    return len(summary)


def _add_rows(
    session: Session, job_id: int, attempt: int, summary: dict[tuple[int, int], MetricSummary]
) -> None:
    session.add_all(
        SummaryRow(
            job_id=job_id,
            attempt=attempt,
            case_id=c,
            metric_id=m,
            count=ms.count,
            samples=ms.samples,
            ranks=ms.ranks,
            median=_none(ms.median),
            p90=_none(ms.p90),
            min=_none(ms.min),
            max=_none(ms.max),
            mean=_none(ms.mean),
            kind=ms.kind,
            direction=ms.direction,
            bound=ms.bound,
            nonfinite=ms.nonfinite,
        )
        for (c, m), ms in summary.items()
    )
    session.flush()


def drop_case_summaries(session: Session, job_id: int, attempt: int, case_ids: Iterable[int]) -> None:
    """Forget stored summaries of cases that got new samples after they ended (shown live again)."""
    ids = sorted(set(case_ids))
    if ids:
        r = SummaryRow
        session.execute(delete(r).where(r.job_id == job_id, r.attempt == attempt, r.case_id.in_(ids)))


def drop_earlier_summaries(session: Session, job_id: int, attempt: int) -> None:
    """Rows of the job's runs before `attempt`: never shown again once a new run started."""
    session.execute(delete(SummaryRow).where(SummaryRow.job_id == job_id, SummaryRow.attempt < attempt))


def _none(v: float) -> float | None:
    return None if v != v else v


def sampled_case_ids(session: Session, job_id: int, attempt: int) -> list[int]:
    """The cases with samples in one run of a job, by a loose index scan: one seek per case on
    the job index (a recursive CTE of `min(case_id) > previous`), not a scan of the samples."""
    s = SampleRow
    first = select(func.min(s.case_id).label("cid")).where(s.job_id == job_id, s.attempt == attempt)
    cte = first.cte("sampled_case", recursive=True)
    following = (
        select(s.case_id)
        .where(s.job_id == job_id, s.attempt == attempt, s.case_id > cte.c.cid)
        .order_by(s.case_id)
        .limit(1)
        .scalar_subquery()
    )
    cte = cte.union_all(select(following).where(cte.c.cid.is_not(None)))
    return [c for c in session.scalars(select(cte.c.cid)) if c is not None]


def stored_summary(session: Session, job_id: int, attempt: int) -> dict[tuple[int, int], MetricSummary]:
    """The summary rows stored for one run of a job (cases that ended, or the whole finished job)."""
    rows = session.execute(
        select(SummaryRow, MetricRow)
        .join(MetricRow, MetricRow.id == SummaryRow.metric_id)
        .where(SummaryRow.job_id == job_id, SummaryRow.attempt == attempt)
    ).all()
    out = {}
    for r, m in rows:
        # judged with the definition stored on the row (a later change of the bound never
        # re-judges an old job); rows written before that was stored take the metric's
        kind, direction = r.kind or m.kind, r.direction or m.direction
        bound = r.bound if r.kind is not None else m.bound
        lo, hi = _nan(r.min), _nan(r.max)
        worst = math.nan if r.nonfinite else (hi if direction == "lower" else lo)
        stats = verdict.Stats(
            r.count, r.nonfinite or 0, _nan(r.median), _nan(r.p90), lo, hi, _nan(r.mean), worst
        )
        out[(r.case_id, r.metric_id)] = _summary(m.name, m.unit, kind, direction, bound, stats, r.samples,
                                                 r.ranks)  # fmt: skip
    return out


def pending_summary(
    session: Session, job_id: int, attempt: int, stored: Iterable[tuple[int, int]] = ()
) -> dict[tuple[int, int], MetricSummary]:
    """Live summaries of the cases that have samples in `attempt` but no stored rows (`stored`:
    the keys already stored): the cases still running, or every case of a job ingested without
    the dispatcher."""
    have = {c for c, _ in stored}
    todo = [c for c in sampled_case_ids(session, job_id, attempt) if c not in have]
    return compute_summary(session, job_id, case_ids=todo, attempt=attempt) if todo else {}


def finish_summary(engine: Engine, job_id: int, attempt: int) -> int:
    """The job-end step: store summaries for the cases of `attempt` left without one (computed
    in a read session, outside the write lock; cases that ended have theirs already) and drop
    summaries and case results of earlier attempts (a stale run may have written some since the
    run started). Returns the number of rows written."""
    with Session(engine) as session:
        missing = pending_summary(session, job_id, attempt, stored_summary(session, job_id, attempt))
    with write_tx(engine) as session:
        n = store_summary(session, job_id, missing, case_ids=sorted({c for c, _ in missing}), attempt=attempt)
        drop_earlier_summaries(session, job_id, attempt)
        drop_earlier_case_results(session, job_id, attempt)
    return n


def record_verdict(engine: Engine, job_id: int, *, ran: bool) -> verdict.JobVerdictCounts | None:
    """The job's verdict from its latest attempt's case results (`workers.verdict.job_verdict`),
    stored on the job: `ran` False (the job failed or was cancelled) makes it `errored`, and so
    do cases the job announced but never reported."""
    with write_tx(engine) as session:
        job = session.get(JobRow, job_id)
        if job is None:
            return None
        statuses = [r.status for r in latest_case_results(session, job_id)]
        expected = len(job.cases) if job.cases else (job.progress_total or None)
        judged = verdict.job_verdict(statuses, ran=ran, expected=expected)
        job.verdict, job.case_counts = judged.verdict, dict(judged.counts)
    return judged


def summarize_job(session: Session, job_id: int) -> dict[tuple[int, int], MetricSummary]:
    """(case_id, metric_id) -> summary for every case and metric with samples in the job's latest
    attempt: the rows stored when each case ended (or at the job's end), and a live computation
    only for cases without them (usually the one case a running job is in)."""
    job = session.get(JobRow, job_id)
    if job is None:
        return {}
    attempt = job_attempt(job)
    out = stored_summary(session, job_id, attempt)
    out.update(pending_summary(session, job_id, attempt, out))
    return out


def case_summaries(session: Session, job_id: int) -> list[CaseSummary]:
    """Every case of the job's latest attempt (with a result or samples), its status and
    per-metric summaries; a case with samples but no result yet in that attempt has status None."""
    job = session.get(JobRow, job_id)
    if job is None:
        return []
    results = {r.case_id: r for r in latest_case_results(session, job_id)}
    summaries = summarize_job(session, job_id)
    case_ids = set(results) | {c for c, _ in summaries}
    cases = {c.id: c for c in session.scalars(select(CaseRow).where(CaseRow.id.in_(case_ids)))}
    out: list[CaseSummary] = []
    for cid in sorted(case_ids):
        c = cases[cid]
        r = results.get(cid)
        cs = CaseSummary(
            case_id=cid,
            name=c.name,
            fingerprint=c.fingerprint,
            params=dict(c.params or {}),
            status=r.status if r else None,
            error=r.error if r else None,
            expected_error=c.expected_error,
        )
        for (case_id, _), ms in sorted(summaries.items()):
            if case_id == cid:
                cs.metrics[ms.metric] = ms
        out.append(cs)
    return out


@dataclass(frozen=True)
class SampleView:
    id: int
    attempt: int
    case: str
    fingerprint: str
    metric: str
    rank: int
    idx: int
    value: float


def _samples_query(
    job_id: int,
    case: str | None,
    metric: str | None,
    rank: int | None,
    after_id: int,
    attempt: int | None = None,
) -> Any:
    q = (
        select(
            SampleRow.id,
            SampleRow.attempt,
            CaseRow.name,
            CaseRow.fingerprint,
            MetricRow.name,
            SampleRow.rank,
            SampleRow.idx,
            SampleRow.value,
        )
        .join(CaseRow, CaseRow.id == SampleRow.case_id)
        .join(MetricRow, MetricRow.id == SampleRow.metric_id)
        .where(SampleRow.job_id == job_id, SampleRow.id > after_id)
        .order_by(SampleRow.id)
    )
    if case is not None:
        q = q.where(CaseRow.name == case)
    if metric is not None:
        q = q.where(MetricRow.name == metric)
    if rank is not None:
        q = q.where(SampleRow.rank == rank)
    if attempt is not None:
        q = q.where(SampleRow.attempt == attempt)
    return q


def _view(row: Any) -> SampleView:
    value = row[7]
    return SampleView(*row[:7], math.nan if value is None else value)


def list_samples(
    session: Session,
    job_id: int,
    *,
    case: str | None = None,
    metric: str | None = None,
    rank: int | None = None,
    attempt: int | None = None,
    after_id: int = 0,
    limit: int = 1000,
) -> tuple[list[SampleView], int | None]:
    """Raw samples of a job (optionally of one case/metric/rank/attempt) in id order, one page."""
    q = _samples_query(job_id, case, metric, rank, after_id, attempt).limit(limit + 1)
    rows = session.execute(q).all()
    page = [_view(r) for r in rows[:limit]]
    return page, (page[-1].id if len(rows) > limit else None)


def iter_samples(
    engine: Engine,
    job_id: int,
    *,
    case: str | None = None,
    metric: str | None = None,
    rank: int | None = None,
    attempt: int | None = None,
    chunk: int = 5000,
) -> Iterator[list[SampleView]]:
    """All matching samples in chunks, each chunk its own short read (for streamed downloads)."""
    after = 0
    while True:
        with Session(engine) as session:
            q = _samples_query(job_id, case, metric, rank, after, attempt).limit(chunk)
            rows = session.execute(q).all()
        if not rows:
            return
        views = [_view(r) for r in rows]
        yield views
        after = views[-1].id
        if len(rows) < chunk:
            return


def fingerprint_series(
    session: Session, fingerprint: str, metric: str, *, statuses: Sequence[str] = ("succeeded",)
) -> list[tuple[JobRow, WorstRank]]:
    """Jobs (oldest first) that measured `metric` for the case `fingerprint`, with worst-rank values.

    This is the history of one series across commits (the history page, compare by commit).
    """
    case = session.scalar(select(CaseRow).where(CaseRow.fingerprint == fingerprint))
    if case is None:
        return []
    mdef = session.scalar(select(MetricRow).where(MetricRow.suite == case.suite, MetricRow.name == metric))
    if mdef is None:
        return []
    job_ids = session.scalars(
        select(SampleRow.job_id)
        .where(SampleRow.case_id == case.id, SampleRow.metric_id == mdef.id)
        .distinct()
    ).all()
    jobs = session.scalars(
        select(JobRow).where(JobRow.id.in_(job_ids), JobRow.status.in_(statuses)).order_by(JobRow.id)
    ).unique()
    out = []
    for job in jobs:
        arrays = worst_rank_arrays(session, job.id, case_id=case.id, metric_id=mdef.id)
        out.append((job, arrays.get((case.id, mdef.id), WorstRank(np.empty(0), 0, 0))))
    return out


def list_artifacts(session: Session, job_id: int) -> list[ArtifactRow]:
    q = select(ArtifactRow).where(ArtifactRow.job_id == job_id).order_by(ArtifactRow.id)
    return list(session.scalars(q))


def get_artifact(session: Session, job_id: int, name: str) -> ArtifactRow | None:
    return session.scalar(select(ArtifactRow).where(ArtifactRow.job_id == job_id, ArtifactRow.name == name))


FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def commit_ids(sha: str, *, min_prefix: int = 1) -> Select[Any]:
    """The ids of the commits `sha` names, as a subquery for `Job.commit_id.in_(...)`: a full hex
    sha is one unique-index lookup; anything shorter than `min_prefix` must match whole; else
    every commit whose sha starts with it. Commits are resolved first, so the jobs are then read
    by `job.commit_id`, never by walking every job of a suite."""
    q = select(CommitRow.id)
    if FULL_SHA.fullmatch(sha) or len(sha) < min_prefix:
        return q.where(CommitRow.sha == sha)
    return q.where(CommitRow.sha.startswith(sha, autoescape=True))


def latest_job_for_commit(
    session: Session, sha: str, suite: str, *, device: str | None = None, preset: str | None = None
) -> JobRow | None:
    """The newest succeeded job of `suite` at commit `sha` (prefix allowed): reuse by the gate."""
    q = (
        select(JobRow)
        .where(JobRow.commit_id.in_(commit_ids(sha)), JobRow.suite == suite, JobRow.status == "succeeded")
        .order_by(JobRow.id.desc())
        .limit(1)
    )
    if device:
        q = q.where(JobRow.device == device)
    if preset:
        q = q.where(JobRow.preset == preset)
    return session.scalars(q).unique().first()


# ------------------------------------------------------------------------------------- baselines


def list_baselines(session: Session) -> list[BaselineRow]:
    return list(session.scalars(select(BaselineRow).order_by(BaselineRow.name)).unique())


def get_baseline(session: Session, name: str) -> BaselineRow | None:
    return session.scalars(select(BaselineRow).where(BaselineRow.name == name)).unique().first()


def set_baseline(
    session: Session, name: str, *, commit: str | None = None, job_id: int | None = None, note: str = ""
) -> BaselineRow:
    """Point baseline `name` at a commit or a job (exactly one); creates or moves it."""
    if (commit is None) == (job_id is None):
        raise ValueError("a baseline needs exactly one of commit or job_id")
    row = get_baseline(session, name)
    if row is None:
        row = BaselineRow(name=name)
        session.add(row)
    crow = ensure_commit(session, commit) if commit else None
    row.commit_id = crow.id if crow else None
    row.commit = crow
    row.job_id = job_id
    row.note = note
    session.flush()
    return row
