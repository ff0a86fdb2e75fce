"""The gate's report as Markdown: its decision, the jobs it ran or reused, the confirmation
re-runs, then each suite's comparison. The state machine (`service.domain.gate`) decides; this
module only renders what it decided."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.domain.gate import GateJob, GateState
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
    for cmp in state.comparisons:
        lines.append(comparison_markdown(cmp, base_url))
    return "\n".join(lines).rstrip() + "\n"


def gate_answer(state: GateState, base_url: str = "") -> dict[str, object]:
    """The gate step's answer: the state, and its Markdown report once the gate is done."""
    return {**state.to_dict(), "markdown": gate_markdown(state, base_url) if state.phase == "done" else None}
