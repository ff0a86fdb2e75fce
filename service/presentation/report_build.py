"""The report of a set of stored jobs (a campaign, or the jobs `gdnval report` names), as plain
data: the environment, each suite's part in the order the jobs come, the comparison with base
jobs, a line for each section that did not run, and the conclusions.

Each suite's part comes from the module named after it in `service.presentation.suite_sections`
(`cp-layer` -> `cp_layer`), or, for a suite without one, from the generic section
(`service.presentation.report_generic`); nothing here names a suite or a metric.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

from service.presentation import report_generic, views
from service.presentation.conventions import memory_tracked
from service.presentation.markdown import VERDICT_MARK
from service.presentation.report_model import (
    Cell,
    Links,
    NotRun,
    Report,
    ReportJob,
    Section,
    SuiteInput,
    SuiteReport,
    Table,
)

SECTIONS_PACKAGE = "service.presentation.suite_sections"
MAX_NAMED_FAILURES = 30  # the conclusions name this many failing cases, then count the rest
SuiteSection = Callable[[SuiteInput], SuiteReport]


def suite_section(suite: str) -> SuiteSection:
    """The report code of `suite`: its module's `report`, or the generic section."""
    module = suite.replace("-", "_")
    name = f"{SECTIONS_PACKAGE}.{module}"
    if not module.isidentifier() or module.startswith("_") or importlib.util.find_spec(name) is None:
        return report_generic.report
    module = importlib.import_module(name)
    found = getattr(module, "report", None)
    if not callable(found):
        raise TypeError(f"{name} has no report(inp) function; expected one returning a SuiteReport")
    return found


def environment(jobs: Sequence[ReportJob], links: Links) -> Section | None:
    if not jobs:
        return None
    rows = []
    for j in jobs:
        d, info = j.data, j.data.info
        sw = ", ".join(f"{k} {info[k]}" for k in ("torch", "triton", "python") if info.get(k))
        rows.append(
            [
                Cell(f"#{d.job_id}", links.job(d.job_id)),
                d.suite,
                d.preset,
                f"{info.get('device_name') or d.device} ({d.device} × {d.world_size})",
                sw or "–",
                Cell((d.commit or info.get("commit") or "unknown")[:12], code=True),
                d.verdict or d.status,
            ]
        )
    blocks: list[str | Table] = [
        Table(["job", "suite", "preset", "device", "software", "commit", "verdict"], rows)
    ]
    found, disagree = backend_rows(jobs)
    if found:
        blocks.append(
            Table(
                ["backend", "distribution", "version", "commit", "jobs"],
                [
                    [b, dist, version, Cell(commit, code=commit != "–"), ", ".join(f"#{i}" for i in ids)]
                    for (b, dist, version, commit), ids in found.items()
                ],
            )
        )
    blocks += disagree
    return Section("environment", "Environment and backends", blocks)


def backend_rows(jobs: Sequence[ReportJob]) -> tuple[dict[tuple[str, str, str, str], list[int]], list[str]]:
    """(backend, distribution, version, commit) -> the jobs that ran it, and one line per job
    whose ranks disagree on a backend's version. A built-in backend is at each job's own commit
    (`views.backend_records`): jobs at different commits ran different code."""
    rows: dict[tuple[str, str, str, str], list[int]] = {}
    lines = []
    for j in jobs:
        d = j.data
        for b in views.backend_records(d.info, d.our_commit):
            key = (b["backend"], b["distribution"], b["version"], b["commit"][:12] or "–")
            if d.job_id not in rows.setdefault(key, []):
                rows[key].append(d.job_id)
        for name, versions in views.rank_backend_versions(d.info).items():
            if len(versions) > 1:
                told = "; ".join(
                    f"{version} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
                    for version, ranks in versions.items()
                )
                lines.append(f"Job #{d.job_id}: its ranks disagree on {name}'s version: {told}.")
    return rows, lines


def header_notes(jobs: Sequence[ReportJob]) -> list[str]:
    """What a reader must know before any number: times from CPU ranks are noise."""
    cpu = [j.job_id for j in jobs if not memory_tracked(j.device)]
    if not cpu:
        return []
    which = "every job" if len(cpu) == len(jobs) else "jobs " + ", ".join(f"#{i}" for i in cpu)
    return [
        f"Times of {which} come from CPU ranks: wall clock of processes sharing one host's cores, "
        "so they are noisy and say nothing about a GPU. A difference is claimed only where its 95% "
        "interval supports it; CPU memory is not tracked."
    ]


def comparisons(cmps: Sequence[Any], links: Links) -> list[Section]:
    if not cmps:
        return []
    summary = []
    blocks: list[str | Table] = []
    for c in cmps:
        counts = ", ".join(f"{n} {v}" for v, n in c.counts().items() if n) or "no cases"
        summary.append(
            [
                c.suite,
                Cell(f"#{c.head.job_id}", links.job(c.head.job_id)),
                Cell(f"#{c.base.job_id}", links.job(c.base.job_id)),
                "pass" if c.passed else "FAIL",
                counts,
            ]
        )
        rows = [
            [
                Cell(r["case"], links.case(c.head.job_id, r["fingerprint"])),
                r["metric"],
                VERDICT_MARK.get(r["verdict"], r["verdict"]),
                r["base"],
                r["head"],
                r["ratio"],
                r["ci"],
                r["p"],
                r["reason"] or "–",
            ]
            for r in views.compare_rows(c, "changes")
            if r["verdict"] != "unchanged"
        ]
        if rows:
            blocks += [
                f"{c.suite}: job #{c.head.job_id} against base job #{c.base.job_id}, the metrics that "
                "moved (ratio head/base with its 95% interval and Mann-Whitney p):",
                Table(["case", "metric", "verdict", "base", "head", "ratio", "CI", "p", "why"], rows, keys=2),
            ]
    return [
        Section(
            "base",
            "Against the base",
            [Table(["suite", "head job", "base job", "verdict", "cases"], summary), *blocks],
        )
    ]


def failures(jobs: Sequence[ReportJob]) -> list[str]:
    out = []
    for j in jobs:
        for view in views.case_views(j.data.cases):
            if view.status in ("passed", "expected error", "skipped"):
                continue
            why = (
                ", ".join(view.bad_metrics)
                or ((view.error or "").strip().splitlines() or [view.status])[-1][:160]
            )
            out.append(f"{j.suite} #{j.job_id} {view.name}: {view.status} ({why})")
        if j.data.status != "succeeded" and j.data.error:
            out.append(
                f"{j.suite} #{j.job_id}: job {j.data.status} ({j.data.error.strip().splitlines()[-1][:160]})"
            )
    return out


def not_run_section(found: Sequence[NotRun]) -> Section | None:
    if not found:
        return None
    return Section(
        "not-run",
        "Not run",
        ["Sections these jobs cannot give, and why:", *(f"- {n.title}: {n.why}." for n in found)],
    )


def skipped(jobs: Sequence[ReportJob]) -> list[str]:
    """The cases that did not apply where they were asked to run, with their reason."""
    return [
        f"{j.suite} #{j.job_id} {c.name}: {((c.error or '').strip().splitlines() or ['skipped'])[-1][:160]}"
        for j in jobs
        for c in j.data.cases
        if c.status == "skipped"
    ]


def conclusions(lines: Sequence[str], jobs: Sequence[ReportJob]) -> Section:
    items = list(lines)
    fails = failures(jobs)
    if not fails:
        items.append("Every bound holds; no case errored.")
    else:
        more = f" (the first {MAX_NAMED_FAILURES} named)" if len(fails) > MAX_NAMED_FAILURES else ""
        items.append(f"{len(fails)} case(s) failed a bound or errored{more}:")
        items += [f"Failed: {f}." for f in fails[:MAX_NAMED_FAILURES]]
    if skips := skipped(jobs):
        items.append(f"{len(skips)} case(s) did not apply:")
        items += [f"Skipped: {x}." for x in skips[:MAX_NAMED_FAILURES]]
    return Section(
        "conclusions",
        "Conclusions",
        [
            "Each line follows from the tables above by the rule it states; "
            "a difference is claimed only where its interval supports it.",
            *(f"- {x}" for x in items),
        ],
    )


def build(jobs: Sequence[ReportJob], cmps: Sequence[Any], links: Links, title: str) -> Report:
    """The report of `jobs` (and of each comparison with a base job) in the hand-written report's
    order: the suites' parts as the jobs come (a campaign's jobs come in its plan's order)."""
    parts: list[SuiteReport] = []
    for suite in dict.fromkeys(j.suite for j in jobs):
        parts.append(suite_section(suite)(SuiteInput(suite, jobs, links)))
    sections = [s for s in (environment(jobs, links),) if s is not None]
    for part in parts:
        sections += part.sections
    sections += comparisons(cmps, links)
    if (missing := not_run_section([n for p in parts for n in p.not_run])) is not None:
        sections.append(missing)
    if jobs:
        sections.append(conclusions([line for p in parts for line in p.conclusions], jobs))
    for s in sections:
        s.blocks = [b.without_empty_columns() if isinstance(b, Table) and b.rows else b for b in s.blocks]
    return Report(title, header_notes(jobs), sections, [p for part in parts for p in part.plots])


def commits_of(jobs: Sequence[ReportJob]) -> str:
    commits = sorted({(j.data.commit or j.data.info.get("commit") or "unknown")[:12] for j in jobs})
    return ", ".join(commits) or "no jobs"
