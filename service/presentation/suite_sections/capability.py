"""`capability`: each case's outcome (a fail-fast case names the error it raised) and its checks."""

from __future__ import annotations

from service.presentation import views
from service.presentation.report_model import Cell, Section, SuiteInput, SuiteReport, Table


def report(inp: SuiteInput) -> SuiteReport:
    rows = []
    for j in inp.mine:
        for c, view in zip(j.data.cases, views.case_views(j.data.cases), strict=True):
            bounded = [m for m in c.metrics.values() if m.bound is not None]
            failing = [m.metric for m in bounded if views.judge(m.worst, m).state == "bad"]
            outcome = view.status
            if c.expected_error and view.status == "expected error":
                outcome = f"raised {c.expected_error}"
            rows.append(
                [
                    Cell(c.name, inp.links.case(j.job_id, c.fingerprint)),
                    outcome,
                    f"{len(bounded) - len(failing)}/{len(bounded)}" if bounded else "–",
                    ", ".join(failing) or "–",
                ]
            )
    out = SuiteReport()
    if rows:
        table = Table(["case", "outcome", "bounded checks holding", "failing"], rows)
        out.sections.append(Section("capability", "Capability and fail-fast", [table]))
    return out
