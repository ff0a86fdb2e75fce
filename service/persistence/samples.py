"""Samples: the hot bulk insert (one transaction per batch), reads by job or by series, and the
worst rank per idx computed in SQL (max over ranks for lower-is-better metrics, min otherwise)."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
from sqlalchemy import Engine, Text, cast, func, insert, literal, select
from sqlalchemy import case as sa_case
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from service.persistence.db import immediate
from service.persistence.jobs import job_attempt
from service.persistence.models import (
    CaseRow,
    JobRow,
    MetricRow,
    SampleRow,
)
from workers.suite import Metric

SAMPLE_BATCH = 20_000  # rows per executemany; bounds memory, keeps each batch one transaction


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
        row.diagnostic = m.diagnostic
    session.flush()
    return {name: row.id for name, row in existing.items()}


def metric_by_name(session: Session, suite: str, name: str) -> MetricRow | None:
    return session.scalar(select(MetricRow).where(MetricRow.suite == suite, MetricRow.name == name))


def metrics_of_kinds(session: Session, suite: str, kinds: Sequence[str]) -> list[Any]:
    """(id, name, direction, kind, unit, bound) of the suite's metrics of these kinds."""
    m = MetricRow
    q = select(m.id, m.name, m.direction, m.kind, m.unit, m.bound).where(m.suite == suite, m.kind.in_(kinds))
    return list(session.execute(q).all())


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


def count_attempt_samples(session: Session, job_id: int, attempt: int) -> int:
    """How many samples run `attempt` of the job has stored (an index-only count)."""
    s = SampleRow
    return int(session.scalar(select(func.count()).where(s.job_id == job_id, s.attempt == attempt)) or 0)


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

    One SQL pass over the job's covering index reduces ranks per idx (`worst_rank_per_idx`) and, on
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
    higher = higher_metric_ids(session, job.suite)
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
    """The rank reduction of `workers.stats.worst_rank` in SQL, one row per (case, metric, idx)
    over the covering job index: case_id, metric_id, idx, n (rows: the ranks reporting) and w
    (`worst_of_group`)."""
    s = SampleRow
    n = func.count()  # count(*) reads no column: 48 vs 71 ms for count(id) over 100k SQLite rows
    return (
        select(
            s.case_id.label("case_id"),
            s.metric_id.label("metric_id"),
            s.idx.label("idx"),
            n.label("n"),
            worst_of_group(higher).label("w"),
        )
        .where(*where)
        .group_by(s.case_id, s.metric_id, s.idx)
    )


def worst_of_group(higher: Sequence[int]) -> Any:
    """SQL for the worst value of a group of sample rows, as `workers.stats.worst_rank` takes it:
    max, or min for the `higher` metric ids; a non-finite value wins: NULL (NaN) for a NaN or for
    +inf beside -inf, else the infinity."""
    s = SampleRow
    hi, lo = func.max(s.value), func.min(s.value)
    worst = hi
    if higher:
        worst = sa_case((s.metric_id.in_(list(higher)), lo), else_=hi)
    # beyond the largest finite double: an infinity, or on PostgreSQL a NaN (its largest float8;
    # SQLite stores a NaN as NULL); no non-finite literal, so that the SQL renders with literal binds
    big = sys.float_info.max
    pos, neg = hi > big, lo < -big
    return sa_case(
        (func.count(s.value) < func.count(), None),
        (pos & ~(-hi < 0), None),  # NaN: -NaN is not below zero, -inf is
        (pos & neg, None),
        (pos, hi),
        (neg, lo),
        else_=worst,
    )


def higher_metric_ids(session: Session, suite: str) -> list[int]:
    """The ids of the suite's higher-is-better metrics, whose worst rank is the min. Metric rows
    are per suite (undeclared ones too, see StoreSink), so no scan of the samples is needed."""
    m = MetricRow
    return list(session.scalars(select(m.id).where(m.suite == suite, m.direction == "higher")))


@dataclass(frozen=True)
class ReducedRows:
    """One row per (case, metric, idx) after the worst-rank reduction, as parallel arrays in
    (case_id, metric_id, idx) order: what the compare engine reads of a job's run."""

    case_id: np.ndarray  # int64
    metric_id: np.ndarray  # int64
    idx: np.ndarray  # int64
    ranks: np.ndarray  # int64: the ranks reporting that idx
    value: np.ndarray  # float64: the worst rank's value, NaN when any rank's is

    def __len__(self) -> int:
        return len(self.value)

    @classmethod
    def empty(cls) -> ReducedRows:
        ints = np.zeros(0, dtype=np.int64)
        return cls(ints, ints, ints, ints, np.zeros(0, dtype=np.float64))

    @classmethod
    def concat(cls, parts: Sequence[ReducedRows]) -> ReducedRows:
        """The rows of every part, back in (case_id, metric_id, idx) order."""
        parts = [p for p in parts if len(p)]
        if len(parts) <= 1:
            return parts[0] if parts else cls.empty()
        cols = [np.concatenate([getattr(p, f) for p in parts]) for f in ("case_id", "metric_id", "idx",
                                                                         "ranks", "value")]
        order = np.lexsort((cols[2], cols[1], cols[0]))
        return cls(*(c[order] for c in cols))


def worst_rank_rows(
    session: Session,
    job_id: int,
    attempt: int,
    higher: Sequence[int],
    world_size: int,
    case_ids: Sequence[int] | None = None,
) -> ReducedRows:
    """The run's samples (of every case, or of `case_ids`) reduced over ranks in SQL
    (`worst_rank_per_idx`, over the covering job index) and read through the driver's own
    cursor into numpy in one call: SQLAlchemy's row objects would cost more than the query."""
    s = SampleRow
    where: list[Any] = [s.job_id == job_id, s.attempt == attempt]
    if case_ids is not None:
        if not case_ids:
            return ReducedRows.empty()
        where.append(s.case_id.in_(sorted(set(case_ids))))
    if world_size == 1:  # one rank: the rows are the reduction already
        q: Any = select(s.case_id, s.metric_id, s.idx, literal(1), s.value).where(*where)
        q = q.order_by(s.case_id, s.metric_id, s.idx)
    else:
        q = worst_rank_per_idx(where, higher).order_by(s.case_id, s.metric_id, s.idx)
    conn = session.connection()
    compiled = q.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    positional = compiled.positiontup
    cursor = conn.connection.cursor()
    try:  # the DBAPI cursor, inside the session's transaction
        cursor.execute(str(compiled), [params[k] for k in positional] if positional else params)
        rows = cursor.fetchall()
    finally:
        cursor.close()
    if not rows:
        return ReducedRows.empty()
    arr = np.array(rows, dtype=np.float64)  # case_id, metric_id, idx, n, w (None -> NaN)
    ints = arr[:, :4].T.astype(np.int64)  # (4, n): each column contiguous
    return ReducedRows(ints[0], ints[1], ints[2], ints[3], np.ascontiguousarray(arr[:, 4]))


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
