"""The Markdown report of a campaign's jobs (and, with base jobs, their comparison)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from service.domain.report import build_report


def campaign_report_markdown(
    session: Session, job_ids: Sequence[int], *, base_url: str | None = None, base_job_ids: Sequence[int] = ()
) -> str:
    """The report of the jobs `job_ids`, compared with `base_job_ids` when given."""
    return build_report(session, job_ids, base_job_ids, base_url or "")[0]
