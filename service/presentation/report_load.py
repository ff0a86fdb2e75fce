"""From the store to the report's jobs: each job's record, case summaries and artifact names, and
its samples reduced to the worst rank per repetition (`service.domain.baselines.load_side`, then
`service.domain.compare.series_of`), which every comparison in the report is judged on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from service.domain.baselines import NotFound, load_side
from service.domain.compare import series_of
from service.persistence import artifacts as artifact_store
from service.persistence import jobs as job_store
from service.persistence import summaries as summary_store
from service.presentation.report_model import JobData, ReportJob

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def load_job_data(session: Session, job_id: int) -> JobData:
    job = job_store.job_record(session, job_id)
    if job is None:
        raise NotFound(f"no job {job_id} in the store")
    return JobData(
        job.id,
        job.suite,
        job.preset,
        job.status,
        job.code_commit,
        job.device,
        job.world_size,
        job.error,
        dict(job.info or {}),
        summary_store.case_summaries(session, job_id),
        job.started_at,
        job.finished_at,
        job.verdict,
        job.commit_sha,
    )


def load_report_job(session: Session, job_id: int) -> ReportJob:
    data = load_job_data(session, job_id)
    side = load_side(session, job_id)
    reduced = series_of(side.samples, side.metrics)
    series = {key: reduced.get(g) for g, key in enumerate(reduced.keys)}
    artifacts = [a.name for a in artifact_store.list_artifacts(session, job_id)]
    return ReportJob(data, artifacts, series)


def load_report_jobs(session: Session, job_ids: Sequence[int]) -> list[ReportJob]:
    """The jobs, each once, in the order given."""
    return [load_report_job(session, j) for j in dict.fromkeys(job_ids)]
