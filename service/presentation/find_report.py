"""The find's report as Markdown: its verdict, the first bad commit and what moved there, the
commits it measured, and its steps with their gates. `service.domain.find` decides; this module
only renders what it decided."""

from __future__ import annotations

from typing import Any

from service.domain.find import FindState
from service.presentation.markdown import case_url, link, md_escape, short_sha, table

TITLE = {"fail": "❌ FIRST BAD COMMIT FOUND", "pass": "✅ NO REGRESSION", "error": "⚠️ COULD NOT DECIDE"}
OUTCOME_WORD = {"good": "good", "bad": "bad", "skip": "skipped (could not run or decide)", None: "running"}
STEP_WORD = {"verify": "is the bad end bad?", "bisect": "bisect", "confirm": "boundary, measured anew"}


def find_markdown(state: FindState, base_url: str = "") -> str:
    """The find's report: verdict, first bad commit and what moved, measured commits, steps."""
    lines = [f"## gdnval find: {TITLE.get(state.verdict or '', '…')} (exit {state.exit_code})", ""]
    if state.find_id is not None:
        lines.append(f"- find: {link(f'#{state.find_id}', f'{base_url}/finds/{state.find_id}')}")
    lines += [
        f"- good: `{state.good}`; bad: `{state.bad}` ({len(state.commits)} commit(s) after the good one, "
        "first parents)",
    ]
    if state.first_bad:
        lines.append(f"- first bad commit: `{state.first_bad}` (last good `{state.last_good}`)")
    lines += [
        f"- {md_escape(state.reason)}",
        f"- measured {len(state.measured)} commit(s) (at most {state.bound} without skipped ones): "
        + (", ".join(f"`{short_sha(c)}`" for c in state.measured) or "none, every job reused"),
        "",
    ]
    if state.findings:
        lines += ["### What moved", ""]
        lines.append(table(["suite", "case", "metric", "verdict", "change"], [
            [f["suite"], link(f["case"], case_url(base_url, f["head_job"], f["fingerprint"])),
             md_escape(f["metric"] or "(case)"), f["verdict"], md_escape(f.get("summary") or f["reason"])]
            for f in state.findings]))
        lines.append("")
    if state.steps:
        lines += ["### Steps", ""]
        lines.append(table(["#", "step", "commit", "gate", "outcome", "why"], [
            [str(st.position + 1), STEP_WORD.get(st.kind, st.kind), f"`{short_sha(st.commit)}`",
             link(f"#{st.gate_id}", f"{base_url}/gates/{st.gate_id}"),
             OUTCOME_WORD.get(st.outcome, str(st.outcome)), md_escape(st.reason)]
            for st in state.steps]))
    return "\n".join(lines).rstrip() + "\n"


def find_answer(state: FindState, base_url: str = "") -> dict[str, Any]:
    """The find step's answer: the state, and its Markdown report once the find is done."""
    return {**state.to_dict(), "markdown": find_markdown(state, base_url) if state.phase == "done" else None}
