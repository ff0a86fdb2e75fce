"""The Markdown test report, in the shape of the user's hand-written one, and the gate's report.

Sections (one per suite of workers/suites): environment (device, driver, torch/Triton, commit), verdicts,
capability checks, the GDN accuracy matrix per tensor (relative-L2, max abs, max rel, finite),
speed with speed-ups (Triton vs eager), memory, CP tables (P2P vs Ulysses), trajectory
summaries, and, with a base, the comparison. Every number links to its case on the job page
(`/jobs/{id}#case-{fingerprint}`, the web page's anchor), so a reader can open the samples.

The tables use the web page's view models (`service.presentation.views`): the same worst-rank numbers,
the same bound judgements, the same baseline pairing for speed-ups, in both places.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from service.domain.baselines import NotFound, compare_jobs, job_repetitions
from service.domain.compare import Comparison
from service.persistence import jobs as job_store
from service.persistence import summaries as summary_store
from service.presentation import report_tables as tables
from service.presentation import views
from service.presentation.conventions import memory_tracked
from service.presentation.markdown import (
    case_url,
    comparison_markdown,
    job_url,
    link,
    md_escape,
    short_sha,
    table,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from service.presentation.report_tables import Pivot

# ---------------------------------------------------------------------------------- job reports


@dataclass
class JobData:
    """What the report needs of one job (read from the store by `load_job_data`)."""

    job_id: int
    suite: str
    preset: str
    status: str
    commit: str | None
    device: str
    world_size: int
    error: str | None
    info: Mapping[str, Any]
    cases: list[Any]  # summary_store.CaseSummary (fits service.presentation.views.CaseStats)
    started: Any = None
    finished: Any = None
    verdict: str | None = None  # the stored job verdict (workers.verdict.job_verdict)
    values_of: views.ValuesOf | None = None  # the repetitions, for the intervals of gains and speed-ups


def load_job_data(session: Session, job_id: int) -> JobData:
    job = job_store.job_record(session, job_id)
    if job is None:
        raise NotFound(f"no job {job_id} in the store")
    return JobData(
        job.id, job.suite, job.preset, job.status, job.code_commit, job.device, job.world_size, job.error,
        dict(job.info or {}), summary_store.case_summaries(session, job_id), job.started_at, job.finished_at,
        job.verdict, job_repetitions(session, job_id),
    )


def _cell(cell: Any, url: str | None) -> str:
    """A judged cell from the view models: the number linked, its ✓/✗ mark after it."""
    text = link(cell.text, url) if cell.text not in ("", "–") else (cell.text or "–")
    return f"{text} {cell.mark}".strip() if cell.mark else text


def _env_rows(jobs: Sequence[JobData], base_url: str) -> list[list[str]]:
    def one(key: str, j: JobData) -> str:
        v = j.info.get(key)
        return md_escape(v) if v not in (None, "") else "–"

    rows = []
    for j in jobs:
        rows.append([
            link(f"#{j.job_id}", job_url(base_url, j.job_id)), md_escape(j.suite), md_escape(j.preset),
            f"`{short_sha(j.commit or j.info.get('commit'))}`",
            f"{one('device_name', j)} ({j.device} × {j.world_size})", one("driver", j),
            one("torch", j), one("triton", j), one("python", j), md_escape(j.status),
        ])
    return rows


def _backend_rows(jobs: Sequence[JobData], base_url: str) -> list[list[str]]:
    """Where each job's backends came from (distribution, version, commit, or why it did not
    load), so the report names which code ran."""
    return [[link(f"#{j.job_id}", job_url(base_url, j.job_id)), f"`{md_escape(b['backend'])}`",
             md_escape(b["distribution"]), md_escape(b["version"]),
             f"`{short_sha(b['commit'])}`" if b["commit"] else "–"]
            for j in jobs for b in views.backend_records(j.info)]


CPU_TIMES_NOTE = ("> Times come from CPU ranks: a shared CPU's wall clock moves by tens of percent between "
                  "processes, so a time difference is stated only where its interval supports it (on a CPU, "
                  "a doubling or halving); `~` marks the rest.")
CP_MODES = frozenset({"ulysses", "p2p", "p2p_emulated", "all_gather"})


def _is_cp(case: Any) -> bool:
    """A context-parallel case: a CP mode among its parameters (P2P vs Ulysses tables)."""
    params = case.params or {}
    return any(isinstance(v, str) and v in CP_MODES for v in params.values()) or "cp_mode" in params


def job_report_markdown(
    jobs: Sequence[JobData],
    comparisons: Sequence[Comparison] = (),
    base_url: str = "",
    title: str | None = None,
) -> str:
    """The test report for one or more jobs (one per suite), with optional comparisons."""
    commits = sorted({short_sha(j.commit or j.info.get("commit")) for j in jobs})
    suites = ", ".join(j.suite for j in jobs)
    lines = [f"# {title or 'gdnval test report'}: {suites} @ {', '.join(commits)}", ""]
    if any(j.device == "cpu" for j in jobs):
        lines += [CPU_TIMES_NOTE, ""]
    lines += ["## Environment", ""]
    lines.append(table(["job", "suite", "preset", "commit", "device", "driver", "torch", "Triton", "Python",
                        "status"], _env_rows(jobs, base_url)))
    lines.append("")
    backend_rows = _backend_rows(jobs, base_url)
    if backend_rows:
        lines += ["### Backends under test", ""]
        lines.append(table(["job", "backend", "distribution", "version", "commit"], backend_rows))
        lines.append("")

    # verdicts first: what a reader wants to know
    lines += ["## Verdicts", ""]
    vrows = []
    for j in jobs:
        counts: dict[str, int] = {}
        for cv in views.case_views(j.cases):
            counts[cv.status] = counts.get(cv.status, 0) + 1
        verdict, _ = views.job_verdict(j.status, j.verdict, _status_counts(j))
        case_text = ", ".join(f"{n} {w}" for w, n in sorted(counts.items())) or "no cases"
        vrows.append([link(f"#{j.job_id}", job_url(base_url, j.job_id)), md_escape(j.suite),
                      md_escape(verdict), md_escape(case_text),
                      md_escape(_first_line(j.error)) if j.error else ""])
    lines.append(table(["job", "suite", "verdict", "cases", "job error"], vrows))
    for cmp in comparisons:
        lines.append("")
        lines.append(f"Against base job #{cmp.base.job_id} ({short_sha(cmp.base.commit)}): "
                     + ("**pass**" if cmp.passed else "**FAIL**") + " — "
                     + ", ".join(f"{n} {v}" for v, n in cmp.counts().items() if n))
    lines.append("")

    # the pivoted tables, section by section (the per-metric detail stays on the job page)
    sections: tuple[tuple[str, Any, str], ...] = (
        ("Capability checks", lambda j: tables.check_pivot(j.cases), "_No check metrics._"),
        ("GDN accuracy matrix", lambda j: tables.accuracy_pivot(j.cases), "_No accuracy metrics._"),
        ("Backends side by side", lambda j: tables.backend_pivot([c for c in j.cases if not _is_cp(c)],
                                                                 values_of=j.values_of, device=j.device), ""),
        ("Speed and memory", lambda j: tables.timing_pivot([c for c in j.cases if not _is_cp(c)],
                                                           tracked=memory_tracked(j.device),
                                                           values_of=j.values_of, device=j.device),
         "_No single-device timings._"),
        ("CP tables", lambda j: tables.timing_pivot([c for c in j.cases if _is_cp(c)],
                                                    tracked=memory_tracked(j.device),
                                                    values_of=j.values_of, device=j.device),
         "_No CP timings._"),
        ("Trajectories", lambda j: tables.trajectory_pivot(j.cases), "_No trajectories._"),
    )
    for heading, build, empty in sections:
        built = [(j, build(j)) for j in jobs]
        if not empty and not any(p for _, p in built):
            continue  # a section shown only when it has rows
        lines += [f"## {heading}", ""]
        if not any(p for _, p in built):
            lines += [empty, ""]
            continue
        for j, p in built:
            if not p and not empty:
                continue
            if len(jobs) > 1:
                job_link = link(f"#{j.job_id}", job_url(base_url, j.job_id))
                lines += [f"### {md_escape(j.suite)} (job {job_link})", ""]
            if heading == "Capability checks" and p.counts.get("checks") and not p.counts.get("failing"):
                recorded = p.counts.get("recorded", 0)
                more = f" ({recorded} more values recorded without a bound)" if recorded else ""
                page = link("job page", job_url(base_url, j.job_id))
                lines.append(f"All {p.counts['checks']} bounded checks of {len(p.rows)} case(s) hold{more}; "
                             f"the values are on the {page}.")
            else:
                lines.append(pivot_markdown(p, j.job_id, base_url) if p else empty)
            lines.append("")

    # case outcomes that need attention: the others passed (or raised their expected error)
    attention = []
    total = 0
    for j in jobs:
        for cv in views.case_views(j.cases):
            total += 1
            if cv.status in ("passed", "expected error"):
                continue
            url = case_url(base_url, j.job_id, cv.fingerprint)
            note = md_escape(_first_line(cv.error)) if cv.error else (", ".join(cv.bad_metrics) or "")
            if cv.expected_error:
                note = (note + f" (expects {cv.expected_error})").strip()
            attention.append([link(cv.name, url), md_escape(j.suite), md_escape(cv.status), note])
    lines += ["## Case outcomes", ""]
    if attention:
        lines.append(table(["case", "suite", "outcome", "note"], attention))
    else:
        lines.append(f"All {total} cases passed or raised their expected error." if total else "_No cases._")
    lines.append("")

    for cmp in comparisons:
        lines += ["## Comparison with the base", ""]
        lines.append(comparison_markdown(cmp, base_url))
    return "\n".join(lines).rstrip() + "\n"


def pivot_markdown(p: Pivot, job_id: int, base_url: str) -> str:
    """A pivot as a Markdown table: the first dimension of each row links to its case on the
    job page (one link per row), the cells carry their ✗ marks; the notes follow in italics."""
    header = [label for _, label in p.dims] + [label for _, label in p.columns]
    rows = []
    for r in p.rows:
        dims = [md_escape(r.dims[k]) for k, _ in p.dims]
        dims[0] = link(r.dims[p.dims[0][0]], case_url(base_url, job_id, r.fingerprint))
        rows.append(dims + [_cell(r.cells[k], None) if k in r.cells else "–" for k, _ in p.columns])
    out = table(header, rows)
    if p.notes:
        out += "\n\n" + " ".join(f"_{md_escape(n)}._" for n in p.notes)
    return out


def _status_counts(j: JobData) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in j.cases:
        key = c.status or "none"
        out[key] = out.get(key, 0) + 1
    return out


def _first_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def build_report(
    session: Session, job_ids: Sequence[int], base_ids: Sequence[int] = (), base_url: str = ""
) -> tuple[str, list[Comparison]]:
    """Markdown report of stored jobs; with base jobs, each head job is compared with the base
    job of the same suite. Returns (markdown, comparisons)."""
    jobs = [load_job_data(session, j) for j in job_ids]
    bases = [load_job_data(session, b) for b in base_ids]
    by_suite = {b.suite: b for b in bases}
    comparisons: list[Comparison] = []
    for j in jobs:
        b = by_suite.get(j.suite)
        if b is not None:
            comparisons.append(compare_jobs(session, b.job_id, j.job_id))
    unmatched = [b for b in bases if b.suite not in {j.suite for j in jobs}]
    if unmatched:
        raise ValueError(
            f"base job(s) {[b.job_id for b in unmatched]} ran suite(s) {[b.suite for b in unmatched]}, "
            f"expected one of the reported suites {[j.suite for j in jobs]}"
        )
    return job_report_markdown(jobs, comparisons, base_url), comparisons
