"""Markdown building blocks shared by the job report and the gate's report: cells, links to a
case on the job page, verdict marks, and one comparison as a table."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from service.domain.compare import Comparison, MetricResult
from service.presentation.numbers import fmt

VERDICT_MARK = {
    "regressed": "🔴 regressed",
    "failed": "🔴 failed",
    "worsened": "🟠 worsened",
    "errored": "🔴 errored",
    "inconclusive": "⚪ inconclusive",
    "improved": "🟢 improved",
    "unchanged": "unchanged",
    "added": "➕ added",
    "removed": "➖ removed",
    "skipped": "skipped",
    "changed": "🔵 changed (recorded)",
    "incomparable": "⚠️ not comparable",
}


def md_escape(text: Any) -> str:
    """A table cell: pipes escaped, newlines flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def link(text: str, url: str | None) -> str:
    return f"[{md_escape(text)}]({url})" if url else md_escape(text)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = list(rows)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def case_url(base_url: str, job_id: int | None, fingerprint: str) -> str | None:
    if job_id is None:
        return None
    return f"{base_url.rstrip('/')}/jobs/{job_id}#case-{fingerprint}"


# ------------------------------------------------------------------------------------ comparisons


def _stat(m: MetricResult, side: str) -> float | None:
    s = getattr(m, side)
    if s is None:
        return None
    return s.median if m.kind == "time" else s.worst


def comparison_markdown(
    cmp: Comparison, base_url: str = "", *, all_rows: bool = False, level: int = 3
) -> str:
    """A comparison as Markdown: verdict counts, then one row per metric that is not unchanged
    (every row with `all_rows`), and one row per case without metrics (errored/added/removed)."""
    h = "#" * level
    counts = ", ".join(f"{n} {v}" for v, n in cmp.counts().items() if n)
    def jobs(ids: tuple[int, ...], one: int | None) -> str:
        return ", ".join(link(f"#{j}", job_url(base_url, j)) for j in (ids or (one,)))

    if cmp.pooled:
        title = (f"{h} {cmp.suite}: decided over pooled jobs {jobs(cmp.head_jobs, cmp.head.job_id)} "
                 f"(head {short_sha(cmp.head.commit)}) vs {jobs(cmp.base_jobs, cmp.base.job_id)} "
                 f"(base {short_sha(cmp.base.commit)})")
    else:
        title = (f"{h} {cmp.suite}: job {jobs((), cmp.head.job_id)} (head {short_sha(cmp.head.commit)}) "
                 f"vs job {jobs((), cmp.base.job_id)} (base {short_sha(cmp.base.commit)})")
    lines = [title, "", f"Cases: {counts or 'none'}. " + ("**PASS**" if cmp.passed else "**FAIL**"), ""]
    rows = []
    for c in cmp.cases:
        hurl = case_url(base_url, cmp.head.job_id, c.fingerprint)
        burl = case_url(base_url, cmp.base.job_id, c.fingerprint)
        shown = [m for m in c.metrics if all_rows or m.verdict != "unchanged"]
        if not c.metrics or (not shown and c.verdict != "unchanged"):
            rows.append([link(c.name, hurl if c.head_status else burl), "(case)", VERDICT_MARK[c.verdict],
                         "–", "–", "–", "–", "–", md_escape(c.reason)])
        for m in shown:
            b, hv = _stat(m, "base"), _stat(m, "head")
            has_ci = m.ci_low is not None and m.ci_high is not None
            ci = f"[{m.ci_low:.3f}, {m.ci_high:.3f}]" if has_ci else "–"
            ratio = f"{m.ratio:.3f}" if m.ratio is not None and math.isfinite(m.ratio) else "–"
            p = f"{m.p_value:.2g}" if m.p_value is not None else "–"
            rows.append([
                link(c.name, hurl), md_escape(m.metric), VERDICT_MARK[m.verdict],
                link(fmt(b, m.unit), burl) if b is not None else "–",
                link(fmt(hv, m.unit), hurl) if hv is not None else "–",
                ratio, ci, p, md_escape(m.reason),
            ])
    if rows:
        lines.append(table(["case", "metric", "verdict", "base", "head", "ratio", "CI", "p", "why"], rows))
    else:
        lines.append("Every metric of every case is unchanged.")
    return "\n".join(lines) + "\n"


def short_sha(sha: str | None) -> str:
    return sha[:12] if sha else "unknown"


def job_url(base_url: str, job_id: int | None) -> str | None:
    return f"{base_url.rstrip('/')}/jobs/{job_id}" if job_id is not None else None
