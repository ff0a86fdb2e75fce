"""What an e2e test may accept from a gate of unchanged code."""

from __future__ import annotations

from typing import Any


def passed_or_undecided(code: int, gate: dict[str, Any]) -> bool:
    """Exit 0, or exit 2 only because a time regression's confirmation pair neither confirmed nor
    cleared it (and none was confirmed): the gate's answer for unchanged code on a machine too
    noisy to decide, never a failure. `gate`: the gate's JSON (`gdnval gate --json`, or its stored
    row from `GET /api/v1/gates/ID`; both carry confirmations, undecided and reason)."""
    if code == 0:
        return True
    outcomes = {c.get("outcome") for c in gate.get("confirmations", [])}
    return (code == 2 and "undecided" in outcomes and "confirmed" not in outcomes
            and bool(gate.get("undecided"))
            and "neither confirmed nor cleared" in gate.get("reason", ""))
