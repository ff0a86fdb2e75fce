"""The reports of stored jobs: a campaign's (`campaign_report_markdown`) and any set of jobs'
(`service.presentation.report.build_report`), through one builder (`report_build`) and one
Markdown renderer (`report_markdown`); the report page draws the same `Report`.

Links point only at a public base URL: the `base_url` argument, else the `GDNVAL_PUBLIC_URL`
setting; without one, or with a loopback one (a reader of the pull request cannot open it), the
report has no links.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from service.domain.baselines import compare_jobs
from service.presentation import report_build
from service.presentation.report_load import load_job_data, load_report_jobs
from service.presentation.report_markdown import render
from service.presentation.report_model import Links, Report

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from service.domain.compare import Comparison


def public_links(base_url: str | None) -> Links:
    """Links from `base_url`, else from the configured public URL; none for a loopback host."""
    from service.settings import Settings, is_loopback_url

    url = base_url if base_url is not None else Settings().public_url
    if not url or is_loopback_url(url):
        return Links(None)
    return Links(url.rstrip("/"))


def _campaign_bases(
    session: Session, head_ids: Sequence[int], base_job_ids: Sequence[int]
) -> list[Comparison]:
    """Each base job compared with the head job of the same suite and world size."""
    heads = [load_job_data(session, j) for j in dict.fromkeys(head_ids)]
    cmps = []
    for b in dict.fromkeys(base_job_ids):
        base = load_job_data(session, b)
        same = [h for h in heads if (h.suite, h.world_size) == (base.suite, base.world_size)]
        if not same:
            raise ValueError(
                f"base job {b} ran {base.suite} at world size {base.world_size}; expected a suite "
                f"and world size of the reported jobs {[(h.suite, h.world_size) for h in heads]}"
            )
        cmps.append(compare_jobs(session, b, same[0].job_id))
    return cmps


def campaign_report(
    session: Session, job_ids: Sequence[int], *, links: Links, base_job_ids: Sequence[int] = ()
) -> Report:
    """The report of a campaign's stored jobs, compared with base jobs when given."""
    jobs = load_report_jobs(session, job_ids)
    cmps = _campaign_bases(session, job_ids, base_job_ids)
    return report_build.build(jobs, cmps, links, f"gdnval campaign report @ {report_build.commits_of(jobs)}")


def campaign_report_markdown(
    session: Session, job_ids: Sequence[int], *, base_url: str | None = None, base_job_ids: Sequence[int] = ()
) -> str:
    """The Markdown report of a set of stored jobs (one campaign), compared with base jobs when given."""
    return render(campaign_report(session, job_ids, links=public_links(base_url), base_job_ids=base_job_ids))
