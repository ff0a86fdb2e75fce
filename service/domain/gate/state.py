"""Where a gate stands: the jobs it ran or reused, what each job pair measured, what was
decided (pooled over re-measurement rounds), the confirmation pairs and the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from service.domain.compare import Comparison, to_jsonable
from service.domain.gate.decision import Confirmation, findings

Role = Literal["head", "base", "confirm-base", "confirm", "round-base", "round-head"]


@dataclass
class GateJob:
    role: Role
    suite: str
    job_id: int
    status: str
    commit: str | None
    progress_done: int = 0
    progress_total: int = 0
    message: str = ""
    error: str | None = None
    reused: bool = False  # an existing job (earlier gate or run), not submitted by this gate
    takes_from: int | None = None  # the job whose reference backends' cases it takes (same code)


@dataclass
class GateState:
    phase: Literal["waiting", "done"]
    exit_code: int | None
    verdict: Literal["pass", "fail", "error"] | None
    reason: str
    head: str
    base: str | None
    base_source: str
    jobs: list[GateJob] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)  # the decisions (pooled over rounds)
    measured: list[Comparison] = field(default_factory=list)  # each first job pair, as it measured
    confirmations: list[Confirmation] = field(default_factory=list)
    rounds: int = 0  # re-measurement rounds run (of the first pairs and of confirmation pairs)
    undecided: list[str] = field(default_factory=list)  # suite/case names left undecided
    gate_id: int | None = None  # the stored gate (its page is /gates/ID)

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable verdict (strict JSON: non-finite numbers become strings)."""
        return {
            "phase": self.phase,
            "exit_code": self.exit_code,
            "verdict": self.verdict,
            "reason": self.reason,
            "head": self.head,
            "base": self.base,
            "base_source": self.base_source,
            "jobs": to_jsonable(self.jobs),
            "confirmations": [c.to_dict() for c in self.confirmations],
            "rounds": self.rounds,
            "undecided": list(self.undecided),
            "comparisons": [c.to_dict() for c in self.comparisons],
            # the first pairs as measured, where pooled rounds replaced them (same objects otherwise)
            "measured": [c.to_dict() for c in self.measured if all(c is not d for d in self.comparisons)],
            "findings": findings(self.comparisons),
            "gate_id": self.gate_id,
        }
