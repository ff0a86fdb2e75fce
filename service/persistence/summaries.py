"""Per-case metric summaries: the worst rank first, then statistics in numpy over the rows SQL
already grouped; stored once a job's cases are done, and the job's verdict from them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session

from service.persistence.cases import drop_earlier_case_results, latest_case_results
from service.persistence.db import write_tx
from service.persistence.jobs import job_attempt
from service.persistence.models import (
    CaseRow,
    JobRow,
    MetricRow,
    SampleRow,
    SummaryRow,
)
from service.persistence.reduced_cases import drop_earlier_reduced, drop_reduced, store_reduced_cases
from service.persistence.samples import worst_rank_arrays
from workers import verdict
from workers.stats import CaseStats, MetricStats, summarise, worst_value


def _judged(stats: MetricStats) -> MetricStats:
    """The record with its bound's judgement (`workers.verdict.judge`) filled in."""
    judged = verdict.judge(stats.kind, stats.direction, stats.bound, stats, diagnostic=stats.diagnostic)
    return replace(stats, passes=judged.ok)


CaseSummary = CaseStats  # the store's cases are the one case record (`workers.stats.CaseStats`)


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def stored_stats(
    count: int, median: float | None, p90: float | None, lo: float | None, hi: float | None,
    mean: float | None, nonfinite: int | None, direction: str, **about: Any,
) -> MetricStats:
    """A stored summary row's statistics (NULL: NaN) as the record; `about`: its other fields."""
    bad = nonfinite or 0
    lo_, hi_ = _nan(lo), _nan(hi)
    return MetricStats(direction=direction, count=count, median=_nan(median), p90=_nan(p90), min=lo_,
                       max=hi_, mean=_nan(mean), nonfinite=bad, worst=worst_value(direction, lo_, hi_, bad),
                       **about)


def compute_summary(
    session: Session, job_id: int, *, case_ids: Sequence[int] | None = None, attempt: int | None = None
) -> dict[tuple[int, int], MetricStats]:
    """Summaries computed from the raw samples of the job's latest attempt (or `attempt`), of
    every case or only of `case_ids`: for cases still running, and to store when a case ends."""
    arrays = worst_rank_arrays(session, job_id, case_ids=case_ids, attempt=attempt)
    if not arrays:
        return {}
    metric_ids = {m for _, m in arrays}
    metrics = {m.id: m for m in session.scalars(select(MetricRow).where(MetricRow.id.in_(metric_ids)))}
    out: dict[tuple[int, int], MetricStats] = {}
    for key, wr in arrays.items():
        m = metrics[key[1]]
        out[key] = _judged(summarise(wr.values, m.direction, metric=m.name, unit=m.unit, kind=m.kind,
                                     bound=m.bound, samples=wr.samples, ranks=wr.ranks,
                                     diagnostic=verdict.is_diagnostic(m.kind, m.bound, m.diagnostic)))
    return out


def store_summary(
    session: Session,
    job_id: int,
    summary: dict[tuple[int, int], MetricStats] | None = None,
    *,
    case_ids: Sequence[int] | None = None,
    attempt: int | None = None,
) -> int:
    """Store the summaries of the job's latest attempt (or `attempt`), computed here unless given,
    and the same cases' rank-reduced samples (`reduced_cases`: what compare reads).

    Without `case_ids`: the whole job's rows of that attempt are replaced, and rows of earlier
    attempts dropped. With `case_ids` (a case that just ended): only those cases' rows are
    replaced; `summary` then holds those cases only. Returns the number of summary rows written."""
    if attempt is None:
        job = session.get(JobRow, job_id)
        attempt = job_attempt(job) if job is not None else 1
    if summary is None:
        summary = compute_summary(session, job_id, case_ids=case_ids, attempt=attempt)
    r = SummaryRow
    if case_ids is None:
        session.execute(delete(r).where(r.job_id == job_id, r.attempt <= attempt))
        drop_earlier_reduced(session, job_id, attempt)
    else:
        wanted = set(case_ids)
        if any(c not in wanted for c, _ in summary):
            raise ValueError("the summary holds cases that are not in case_ids")
        if wanted:
            session.execute(
                delete(r).where(r.job_id == job_id, r.attempt == attempt, r.case_id.in_(sorted(wanted)))
            )
    _add_rows(session, job_id, attempt, summary)
    store_reduced_cases(session, job_id, attempt, None if case_ids is None else sorted(set(case_ids)))
    return len(summary)


def _add_rows(
    session: Session, job_id: int, attempt: int, summary: dict[tuple[int, int], MetricStats]
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
            diagnostic=ms.diagnostic,
            nonfinite=ms.nonfinite,
        )
        for (c, m), ms in summary.items()
    )
    session.flush()


def drop_case_summaries(session: Session, job_id: int, attempt: int, case_ids: Iterable[int]) -> None:
    """Forget stored summaries (and reduced rows) of cases that got new samples after they ended
    (shown live again)."""
    ids = sorted(set(case_ids))
    if ids:
        r = SummaryRow
        session.execute(delete(r).where(r.job_id == job_id, r.attempt == attempt, r.case_id.in_(ids)))
        drop_reduced(session, job_id, attempt, ids)


def drop_earlier_summaries(session: Session, job_id: int, attempt: int) -> None:
    """Rows (summaries and reduced) of the job's runs before `attempt`: never shown again once a
    new run started."""
    session.execute(delete(SummaryRow).where(SummaryRow.job_id == job_id, SummaryRow.attempt < attempt))
    drop_earlier_reduced(session, job_id, attempt)


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


def stored_summary(session: Session, job_id: int, attempt: int) -> dict[tuple[int, int], MetricStats]:
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
        declared = r.diagnostic if r.diagnostic is not None else m.diagnostic
        diagnostic = verdict.is_diagnostic(kind, bound, declared)
        out[(r.case_id, r.metric_id)] = _judged(stored_stats(
            r.count, r.median, r.p90, r.min, r.max, r.mean, r.nonfinite, direction, metric=m.name,
            unit=m.unit, kind=kind, bound=bound, samples=r.samples, ranks=r.ranks, diagnostic=diagnostic,
        ))
    return out


def pending_summary(
    session: Session, job_id: int, attempt: int, stored: Iterable[tuple[int, int]] = ()
) -> dict[tuple[int, int], MetricStats]:
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
        return None if job is None else judge_job(session, job, ran=ran)


def judge_job(session: Session, job: JobRow, *, ran: bool) -> verdict.JobVerdictCounts:
    """Store the verdict and case counts of `job`'s latest attempt on it, inside the caller's
    transaction (`record_verdict`, and a job failed because its runs were interrupted)."""
    statuses = [r.status for r in latest_case_results(session, job.id)]
    expected = len(job.cases) if job.cases else (job.progress_total or None)
    judged = verdict.job_verdict(statuses, ran=ran, expected=expected)
    job.verdict, job.case_counts = judged.verdict, dict(judged.counts)
    return judged


def summarize_job(session: Session, job_id: int) -> dict[tuple[int, int], MetricStats]:
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
            source_job_id=r.source_job_id if r else None,
        )
        for (case_id, _), ms in sorted(summaries.items()):
            if case_id == cid:
                cs.metrics[ms.metric] = ms
        out.append(cs)
    return out
