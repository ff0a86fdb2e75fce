"""`gdnval report J1 J2 [--base B]`: the report of any set of stored jobs, built and rendered as
a campaign's is (`service.presentation.campaign_report`): each job's suite section, and with
base jobs (one per suite) the comparison of each head job with the base job of its suite."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from service.domain.baselines import compare_jobs
from service.presentation import report_build
from service.presentation.campaign_report import public_links
from service.presentation.report_load import load_job_data, load_report_jobs
from service.presentation.report_markdown import render

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from service.domain.compare import Comparison


def build_report(
    session: Session, job_ids: Sequence[int], base_ids: Sequence[int] = (), base_url: str | None = None
) -> tuple[str, list[Comparison]]:
    """Markdown report of stored jobs; with base jobs, each head job is compared with the base job
    of the same suite. Links only under a public `base_url` (else the configured public URL; a
    loopback one gives none). Returns (markdown, comparisons)."""
    jobs = load_report_jobs(session, job_ids)
    bases = [load_job_data(session, b) for b in base_ids]
    by_suite = {b.suite: b for b in bases}
    unmatched = [b for b in bases if b.suite not in {j.suite for j in jobs}]
    if unmatched:
        raise ValueError(
            f"base job(s) {[b.job_id for b in unmatched]} ran suite(s) {[b.suite for b in unmatched]}, "
            f"expected one of the reported suites {[j.suite for j in jobs]}"
        )
    cmps = [compare_jobs(session, by_suite[j.suite].job_id, j.job_id) for j in jobs if j.suite in by_suite]
    suites = ", ".join(dict.fromkeys(j.suite for j in jobs))
    title = f"gdnval test report: {suites} @ {report_build.commits_of(jobs)}"
    return render(report_build.build(jobs, cmps, public_links(base_url), title)), cmps
