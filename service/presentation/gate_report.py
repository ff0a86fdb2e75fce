"""The gate's report as Markdown: its decision, the jobs it ran or reused, the confirmation
re-runs, then each suite's comparison. The state machine (`service.domain.gate`) decides; this
module only renders what it decided."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.domain.gate import GateJob, GateState, findings
from service.presentation.markdown import (
    case_url,
    comparison_markdown,
    job_url,
    link,
    md_escape,
    short_sha,
    table,
)

VERDICT_WORD = {"pass": "✅ PASS", "fail": "❌ FAIL", "error": "⚠️ COULD NOT RUN"}
# Whether a confirmation pair counted a time regression, per `confirmation_outcome`.
COUNTED_WORD = {"confirmed": "yes (confirmed)", "cleared": "no (not reproduced)",
                "undecided": "undecided (neither confirmed nor cleared)"}


def counted_word(conf: Mapping[str, Any]) -> str:
    """The counted column of a stored confirmation; one stored without `outcome` (before a pair
    could leave a regression undecided) by its `confirmed`."""
    outcome = conf.get("outcome") or ("confirmed" if conf.get("confirmed") else "cleared")
    return COUNTED_WORD.get(str(outcome), str(outcome))


def _job_note(j: GateJob) -> str:
    if j.reused:
        return "reused"
    if j.takes_from is not None:
        return f"reference cases taken from job #{j.takes_from}"
    return ("error: " + md_escape(j.error))[:200] if j.error else ""


def gate_markdown(state: GateState, base_url: str = "") -> str:
    """The gate's report: decision, jobs, confirmations, then each suite's comparison."""
    word = VERDICT_WORD.get(state.verdict or "", "…")
    lines = [
        f"## gdnval gate: {word} (exit {state.exit_code})",
        "",
        f"- head: `{state.head}`",
        f"- base: `{state.base or 'unknown'}` ({state.base_source or 'unresolved'})",
        f"- {md_escape(state.reason)}",
        "",
    ]
    if state.gate_id is not None:
        lines[2:2] = [f"- gate: {link(f'#{state.gate_id}', f'{base_url}/gates/{state.gate_id}')}"]
    if state.jobs:
        lines += ["### Jobs", ""]
        lines.append(table(
            ["role", "suite", "job", "commit", "status", "note"],
            [[j.role, j.suite, link(f"#{j.job_id}", job_url(base_url, j.job_id)), f"`{short_sha(j.commit)}`",
              j.status, _job_note(j)]
             for j in state.jobs],
        ))
        lines.append("")
    if state.confirmations:
        lines += ["### Confirmation re-runs", ""]
        lines.append(table(
            ["suite", "case", "metric", "first run", "re-run", "counted"],
            [[c.suite, link(c.case, case_url(base_url, c.rerun_job, c.fingerprint)), c.metric,
              md_escape(c.first_reason),
              f"job {c.rerun_job}: {c.rerun_verdict} ({md_escape(c.rerun_reason)})",
              COUNTED_WORD[c.outcome]]
             for c in state.confirmations],
        ))
        lines.append("")
    lines += _findings_markdown(findings(state.comparisons), base_url)
    decided = {(c.suite, c.base.job_id, c.head.job_id): c for c in state.comparisons}
    for measured in state.measured or state.comparisons:
        pooled = decided.get((measured.suite, measured.base.job_id, measured.head.job_id))
        if pooled is not None and pooled.pooled:
            lines.append(f"*As measured by the first pair of jobs ({measured.suite}); the decision below "
                         f"pools {state.rounds} re-measurement round(s).*\n")
        lines.append(comparison_markdown(measured, base_url))
        if pooled is not None and pooled is not measured and pooled.pooled:
            lines.append(comparison_markdown(pooled, base_url))
    return "\n".join(lines).rstrip() + "\n"


CHANGE_TITLE = {"regression": "Regressions", "undecided": "Undecided", "improvement": "Improvements",
                "recorded": "Other changes (recorded, not judged)"}


def _findings_markdown(found: list[dict[str, Any]], base_url: str) -> list[str]:
    """The findings by what they are: regressions, undecided, improvements, other changes."""
    lines: list[str] = []
    for change, title in CHANGE_TITLE.items():
        rows = [[f["suite"], link(f["case"], case_url(base_url, f["head_job"], f["fingerprint"])),
                 md_escape(f["metric"] or "(case)"), f["verdict"], md_escape(f["summary"])]
                for f in found if f["change"] == change]
        if rows:
            lines += [f"### {title}", "", table(["suite", "case", "metric", "verdict", "change"], rows), ""]
    return lines


def gate_answer(state: GateState, base_url: str = "") -> dict[str, object]:
    """The gate step's answer: the state, and its Markdown report once the gate is done."""
    return {**state.to_dict(), "markdown": gate_markdown(state, base_url) if state.phase == "done" else None}
