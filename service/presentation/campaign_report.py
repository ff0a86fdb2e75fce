"""The campaign report: the stored jobs of one campaign as the Markdown a PR author pastes.

Loading (the jobs, their case summaries and artifact names, comparisons with base jobs) is here;
the sections are plain data built by `service.presentation.campaign_sections`, and `render`
turns them into Markdown. Links point at a public base URL (the `base_url` argument, else the
`GDNVAL_PUBLIC_URL` setting); without one, or with a loopback one, the report has no links.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from service.domain.baselines import compare_jobs
from service.persistence import artifacts as artifact_store
from service.presentation.campaign_sections import CampaignJob, Links, Section, Table, build_sections
from service.presentation.report import load_job_data

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


def load_jobs(session: Session, job_ids: Sequence[int]) -> list[CampaignJob]:
    """The jobs with their case summaries and artifact names, in the order given."""
    return [
        CampaignJob(load_job_data(session, j), [a.name for a in artifact_store.list_artifacts(session, j)])
        for j in dict.fromkeys(job_ids)
    ]


def _load(
    session: Session, job_ids: Sequence[int], base_job_ids: Sequence[int]
) -> tuple[list[CampaignJob], list[Comparison]]:
    """The jobs, and each base job compared with the head job of the same suite and world size."""
    jobs = load_jobs(session, job_ids)
    cmps = []
    for b in dict.fromkeys(base_job_ids):
        base = load_job_data(session, b)
        same = [j.data for j in jobs if (j.data.suite, j.data.world_size) == (base.suite, base.world_size)]
        head = same[0] if same else None
        if head is None:
            raise ValueError(
                f"base job {b} ran {base.suite} at world size {base.world_size}; expected a suite "
                f"and world size of the reported jobs {[(j.data.suite, j.data.world_size) for j in jobs]}"
            )
        cmps.append(compare_jobs(session, b, head.job_id))
    return jobs, cmps


def campaign_report_sections(
    session: Session, job_ids: Sequence[int], *, base_url: str | None = None, base_job_ids: Sequence[int] = ()
) -> list[Section]:
    """The report's sections as plain data, for a page to draw."""
    jobs, cmps = _load(session, job_ids, base_job_ids)
    return build_sections(jobs, cmps, public_links(base_url))


def _cell(text: str) -> str:
    return text.replace("\n", " ").strip() or "–"


def render(sections: Sequence[Section], title: str) -> str:
    """Markdown: the title, then each section's heading, paragraphs and tables."""
    lines = [f"# {title}", ""]
    for s in sections:
        lines += [f"## {s.title}", ""]
        for block in s.blocks:
            if isinstance(block, Table):
                lines.append("| " + " | ".join(block.header) + " |")
                lines.append("|" + "|".join("---" for _ in block.header) + "|")
                lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in block.rows]
                lines.append("")
            elif block.startswith("- "):
                lines.append(block)
            else:
                if lines[-1].startswith("- "):
                    lines.append("")
                lines += [block, ""]
        if lines[-1] != "":
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def campaign_report_markdown(
    session: Session, job_ids: Sequence[int], *, base_url: str | None = None, base_job_ids: Sequence[int] = ()
) -> str:
    """The Markdown report of a set of stored jobs (one campaign), compared with base jobs when given."""
    jobs, cmps = _load(session, job_ids, base_job_ids)
    sections = build_sections(jobs, cmps, public_links(base_url))
    commits = sorted({(j.data.commit or j.data.info.get("commit") or "unknown")[:12] for j in jobs})
    return render(sections, f"gdnval campaign report @ {', '.join(commits) or 'no jobs'}")
