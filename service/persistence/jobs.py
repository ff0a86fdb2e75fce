"""Job rows and their events: read one, list with filters, the newest job of a commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from service.persistence.commits import FULL_SHA, commit_ids
from service.persistence.models import (
    CommitRow,
    JobEventRow,
    JobRow,
)
from service.persistence.records import JobRecord


def add_event(
    session: Session, job_id: int, kind: str, message: str = "", data: Mapping[str, Any] | None = None
) -> JobEventRow:
    ev = JobEventRow(job_id=job_id, kind=kind, message=message, data=dict(data) if data else None)
    session.add(ev)
    return ev


def at_commit(sha: str, *, min_prefix: int = 1, backend: bool | None = None) -> ColumnElement[bool]:
    """Jobs whose code under test is at `sha` (the rule of `commit_ids`: a full sha whole, shorter
    than `min_prefix` whole, else a prefix): our commit, or a backend's from another repository.
    `backend`: True only the backend's, False only ours, None either."""
    if FULL_SHA.fullmatch(sha) or len(sha) < min_prefix:
        theirs = JobRow.backend_commit == sha
    else:
        theirs = JobRow.backend_commit.startswith(sha, autoescape=True)
    ours = JobRow.commit_id.in_(commit_ids(sha, min_prefix=min_prefix))
    return theirs if backend else ours if backend is False else or_(ours, theirs)


def ran_commit(sha: str, *, min_prefix: int = 1) -> ColumnElement[bool]:
    """Jobs that ran code at `sha` (`commit_ids`' rule for a prefix): the code under test's
    commit (`at_commit`), or, for a job of the installed code (no commit of ours asked for), the
    commit of our tree its ranks recorded (`info.commit`): a backend's job at that commit of
    ours, or a job submitted without `--commit`."""
    recorded = JobRow.info["commit"].as_string()
    if FULL_SHA.fullmatch(sha) or len(sha) < min_prefix:
        installed_at = recorded == sha
    else:
        installed_at = recorded.startswith(sha, autoescape=True)
    return or_(at_commit(sha, min_prefix=min_prefix), JobRow.commit_id.is_(None) & installed_at)


def get_job(session: Session, job_id: int) -> JobRow | None:
    return session.get(JobRow, job_id)


def job_record(session: Session, job_id: int) -> JobRecord | None:
    """Job `job_id` as a plain record (what the domain reads), or None."""
    job = session.get(JobRow, job_id)
    return None if job is None else JobRecord.of(job)


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
        q = q.where(ran_commit(commit))
    if before_id is not None:
        q = q.where(JobRow.id < before_id)
    if label is not None:
        q = q.where(JobRow.labels[label[0]].as_string() == label[1])
    rows = list(session.scalars(q).unique())
    nxt = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], nxt


def job_by_idempotency_key(session: Session, key: str) -> JobRecord | None:
    job = session.scalars(select(JobRow).where(JobRow.idempotency_key == key)).first()
    return None if job is None else JobRecord.of(job)


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


def job_attempt(job: JobRow) -> int:
    """The job's current (latest) run: what its pages and summaries show."""
    return max(1, job.attempts)


def find_commit_job(
    session: Session,
    sha: str,
    suite: str,
    *,
    preset: str | None = None,
    device: str | None = None,
    world_size: int | None = None,
    params: Mapping[str, Any] | None = None,
    statuses: tuple[str, ...] = ("succeeded",),
    backend: bool | None = None,
) -> JobRecord | None:
    """The job of commit `sha` for `suite`: the one rule the API, the gate and the pages share.

    The newest job at `sha` (a full sha, a prefix of at least 7 characters, or the ref as
    submitted) in one of `statuses`, with the given preset, device, world size and overrides (a
    filter left None matches any); a re-measurement of some cases (the gate's) is never the
    commit's job. `backend`: as `at_commit` (a backend's commit, ours, or either)."""
    q = (
        select(JobRow)
        .where(at_commit(sha, min_prefix=7, backend=backend), JobRow.suite == suite,
               JobRow.status.in_(statuses))
        .order_by(JobRow.id.desc())
    )
    if preset is not None:
        q = q.where(JobRow.preset == preset)
    if device is not None:
        q = q.where(JobRow.device == device)
    if world_size is not None:
        q = q.where(JobRow.world_size == world_size)
    want = dict(params or {})
    for job in session.scalars(q.limit(50)).unique():
        if job.cases:  # a re-measurement of some cases (the gate's), not the commit's job
            continue
        if params is None or dict(job.params or {}) == want:
            return JobRecord.of(job)
    return None


def jobs_at_commits(
    session: Session,
    shas: Sequence[str],
    suite: str,
    *,
    backend_repo: str | None = None,
    device: str | None = None,
    world_size: int | None = None,
) -> list[JobRecord]:
    """The succeeded jobs of `suite` whose code under test is at one of the full `shas`, oldest
    first: with `backend_repo`, the jobs that installed their backend from that repository at
    that commit; else the jobs of our code at that commit that install no backend from elsewhere.
    The shas are matched whole, one indexed lookup per batch."""
    from service.persistence.queue import job_backend_repo  # queue imports this module

    out: list[JobRecord] = []
    for start in range(0, len(shas), 500):
        batch = list(shas[start:start + 500])
        q = select(JobRow).where(JobRow.suite == suite, JobRow.status == "succeeded").order_by(JobRow.id)
        if backend_repo is not None:
            q = q.where(JobRow.backend_commit.in_(batch))
        else:
            q = q.where(JobRow.commit_id.in_(select(CommitRow.id).where(CommitRow.sha.in_(batch))))
        if device is not None:
            q = q.where(JobRow.device == device)
        if world_size is not None:
            q = q.where(JobRow.world_size == world_size)
        out += [JobRecord.of(j) for j in session.scalars(q).unique() if job_backend_repo(j) == backend_repo]
    return sorted(out, key=lambda j: j.id)


def backend_repositories(session: Session) -> list[str]:
    """The repositories the stored jobs installed a backend from (their `backend_source` label)."""
    from workers.backend_source import BACKEND_SOURCE_LABEL, BackendSource, BackendSourceError

    labels = session.scalars(
        select(JobRow.labels[BACKEND_SOURCE_LABEL].as_string()).distinct()
        .where(JobRow.labels[BACKEND_SOURCE_LABEL].as_string().is_not(None))
    ).all()
    repos = set()
    for text in labels:
        try:
            repo = BackendSource.parse(text).repo
        except BackendSourceError:
            continue
        if repo:
            repos.add(repo)
    return sorted(repos)


def setting_jobs(
    session: Session, suite: str, *, preset: str, device: str, world_size: int, params: Mapping[str, Any],
    backend_repo: str | None, limit: int = 200,
) -> list[JobRecord]:
    """The newest succeeded whole jobs (not a re-measurement of some cases) of one setting:
    `suite` with this preset, device, world size and overrides, installing their backend from
    `backend_repo` (None: none from elsewhere); newest first, at most `limit`."""
    from service.persistence.queue import job_backend_repo  # queue imports this module

    q = (select(JobRow).where(JobRow.suite == suite, JobRow.status == "succeeded", JobRow.preset == preset,
                              JobRow.device == device, JobRow.world_size == world_size)
         .order_by(JobRow.id.desc()).limit(limit))
    want = dict(params)
    return [JobRecord.of(j) for j in session.scalars(q).unique()
            if not j.cases and dict(j.params or {}) == want and job_backend_repo(j) == backend_repo]
