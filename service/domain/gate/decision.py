"""The gate's decisions, as pure functions of comparisons: what a confirmation pair makes of a
regression, which cases are still undecided, what the findings are (regressions, improvements,
other changes) and the verdict with its exit code. Nothing here runs a job or opens a session
(`service.domain.gate.runner` does); every verdict about a metric is the judgment's
(`service.domain.compare.judgment`), read here, never re-derived."""

from __future__ import annotations

import math
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from service.domain import exit_codes
from service.domain.compare import (
    FAILING,
    SEVERITY,
    VERDICTS,
    CaseResult,
    Comparison,
    MetricResult,
    to_jsonable,
)
from workers.verdict import ALPHA, min_two_sided_p

EXIT_PASS, EXIT_FAIL, EXIT_INFRA = exit_codes.PASSED, exit_codes.FAILED, exit_codes.COULD_NOT_RUN
GateVerdict = Literal["pass", "fail", "error"]
ConfirmOutcome = Literal["confirmed", "cleared", "undecided"]
# The confirmation pair's verdicts that clear a time regression: within the minimum effect, or better.
CLEARS: frozenset[str] = frozenset({"unchanged", "improved"})
# What a finding is, from its metric verdict: a regression fails the gate, an improvement is named.
Change = Literal["regression", "improvement", "undecided", "recorded"]
CHANGE_OF: dict[str, Change] = {
    **dict.fromkeys(("failed", "regressed", "worsened", "errored"), "regression"),
    "improved": "improvement",
    "inconclusive": "undecided",
}


def confirmation_outcome(rerun_verdict: str) -> ConfirmOutcome:
    """What a confirmation pair's verdict of a regressed time metric makes of the regression. Only
    evidence decides: a failing verdict (regressed, or its bound / a non-finite value) confirms it,
    one within the minimum effect or better clears it; `inconclusive` (beyond the minimum effect,
    not significant after the pair's rounds) and verdicts that judged nothing (changed, removed:
    not measured by the pair, ...) leave it undecided, which is exit 2 and never a pass."""
    if rerun_verdict not in VERDICTS:
        raise ValueError(f"re-run verdict {rerun_verdict!r} is not a verdict; expected one of {VERDICTS}")
    if rerun_verdict in FAILING:
        return "confirmed"
    return "cleared" if rerun_verdict in CLEARS else "undecided"


@dataclass
class Confirmation:
    """A time regression of the first head run and what the re-run (its confirmation pair, pooled
    with that pair's rounds if it had any) said about it."""

    suite: str
    case: str
    fingerprint: str
    metric: str
    first_reason: str
    rerun_job: int
    rerun_verdict: str
    rerun_reason: str

    @property
    def outcome(self) -> ConfirmOutcome:
        return confirmation_outcome(self.rerun_verdict)

    @property
    def confirmed(self) -> bool:
        return self.outcome == "confirmed"

    def to_dict(self) -> dict[str, Any]:
        return {**to_jsonable(self), "confirmed": self.confirmed, "outcome": self.outcome}


def unconfirm(case: CaseResult, metric: MetricResult, conf: Confirmation) -> None:
    """A regression its confirmation pair did not confirm, with both reasons: cleared, it is
    `changed` (shown, never failing, never re-measured); undecided, it is `inconclusive`, which
    the gate's undecided path reports (exit 2 naming the case)."""
    cleared = conf.outcome == "cleared"
    metric.verdict = "changed" if cleared else "inconclusive"
    metric.reason = (
        f"{'not confirmed' if cleared else 'neither confirmed nor cleared'}: first run {conf.first_reason}; "
        f"re-run job {conf.rerun_job} {conf.rerun_verdict}: {conf.rerun_reason}"
    )
    if case.verdict == "regressed":
        worst = min(case.metrics, key=lambda m: SEVERITY[m.verdict])
        case.verdict = worst.verdict
        case.reason = f"{worst.metric}: {worst.reason}"


def errored_both(c: CaseResult) -> bool:
    return c.base_status == "error" and c.head_status == "error"


def undecided(
    comparisons: Sequence[Comparison],
    reachable: tuple[int, int] | None = None,
    only: Container[tuple[str, str, str]] | None = None,
) -> list[tuple[str, str]]:
    """(suite, case name) of every case with a time change beyond its minimum effect that is not
    significant yet; with `reachable` (rounds done, rounds allowed), only those that more rounds
    could still make significant; with `only`, only these (suite, fingerprint, metric)."""
    return [
        (cmp.suite, c.name)
        for cmp in comparisons
        for c in cmp.cases
        if any(m.verdict == "inconclusive" and m.kind == "time"
               and (only is None or (cmp.suite, c.fingerprint, m.metric) in only)
               and (reachable is None or can_reach_significance(m, *reachable)) for m in c.metrics)
    ]


def can_reach_significance(m: MetricResult, done: int, allowed: int) -> bool:
    """Whether pooling `allowed - done` more rounds (each as many values per side as the first
    job) can give the Mann-Whitney U test a p-value under `ALPHA` at all. A metric with one value
    per case and job (a throughput derived once per case) cannot within a few rounds: measuring
    it again only costs time."""
    per_job = [(s.count if s is not None else 0) / (done + 1) for s in (m.base, m.head)]
    n_base, n_head = (int(c * (allowed + 1)) for c in per_job)
    return min_two_sided_p(n_base, n_head) < ALPHA


def settled_by_failure(comparisons: Sequence[Comparison]) -> bool:
    """Whether the gate already fails whatever more rounds show: a case fails on something no
    re-measurement can clear (a bound, an accuracy change, an error at head only)."""
    for cmp in comparisons:
        for c in cmp.failing_cases():
            if errored_both(c):
                continue
            if c.head_status in ("error", "failed") or any(
                m.verdict in FAILING and m.kind != "time" for m in c.metrics
            ):
                return True
    return False


def incomparable(comparisons: Sequence[Comparison]) -> str | None:
    """Why the pairs cannot be compared at all (other hardware, another definition), or None."""
    bad = [cmp for cmp in comparisons if any(c.verdict == "incomparable" for c in cmp.cases)]
    if not bad:
        return None
    return "could not decide: " + "; ".join(f"{cmp.suite}: {cmp.cases[0].reason}" for cmp in bad)


def _change_text(m: MetricResult) -> str:
    """'−45.2 % (CI [0.50, 0.58])' for a time, else the judgment's reason."""
    if m.kind == "time" and m.ratio is not None and math.isfinite(m.ratio):
        ci = (f", CI [{m.ci_low:.3f}, {m.ci_high:.3f}]" if m.ci_low is not None and m.ci_high is not None
              else "")
        return f"{m.ratio - 1:+.1%}{ci}"
    return m.reason


def findings(comparisons: Sequence[Comparison]) -> list[dict[str, Any]]:
    """Every judged metric that did not stay unchanged, per case, with what it is (`change`:
    regression, improvement, undecided, recorded) and why; regressions first, then improvements.
    Diagnostics are never findings (they are recorded on the jobs and compare pages). A case
    without metrics that did not stay unchanged is one finding of its own."""
    out: list[dict[str, Any]] = []
    for cmp in comparisons:
        pooled = {"base_jobs": list(cmp.base_jobs or [cmp.base.job_id]),
                  "head_jobs": list(cmp.head_jobs or [cmp.head.job_id])}
        for c in cmp.cases:
            where = {"suite": cmp.suite, "case": c.name, "fingerprint": c.fingerprint,
                     "case_verdict": c.verdict, "head_job": cmp.head.job_id, "base_job": cmp.base.job_id,
                     **pooled}
            metrics = [m for m in c.metrics if m.verdict != "unchanged" and not m.diagnostic]
            said = f" ({c.head_error.strip().splitlines()[0][:300]})" if c.head_status == "failed" and \
                c.head_error else ""  # the suite's own words for a failed case (a broken contract)
            for m in metrics:
                out.append({**where, "metric": m.metric, "kind": m.kind, "verdict": m.verdict,
                            "change": CHANGE_OF.get(m.verdict, "recorded"),
                            "reason": m.reason + (said if m.verdict == "failed" else ""),
                            "summary": _change_text(m) + (said if m.verdict == "failed" else "")})
            if not c.metrics and c.verdict not in ("unchanged", "improved"):
                out.append({**where, "metric": None, "kind": None, "verdict": c.verdict,
                            "change": CHANGE_OF.get(c.verdict, "recorded"), "reason": c.reason,
                            "summary": c.reason})
    order = {"regression": 0, "undecided": 1, "improvement": 2, "recorded": 3}
    return sorted(out, key=lambda f: order[f["change"]])


def stored_finding(f: dict[str, Any]) -> dict[str, Any]:
    """A stored finding with `change` and `summary`, which findings stored before them lack."""
    return {"change": CHANGE_OF.get(str(f.get("verdict")), "recorded"), "summary": f.get("reason", ""), **f}


def improvements(comparisons: Sequence[Comparison]) -> list[str]:
    """'suite/case metric −45.2 % (CI …)' for every improved judged metric."""
    return [f"{f['suite']}/{f['case']} {f['metric']} {f['summary']}"
            for f in findings(comparisons) if f["change"] == "improvement"]


@dataclass(frozen=True)
class Decision:
    """The gate's verdict once every job is final: exit code, verdict, reason, undecided cases."""

    code: int
    verdict: GateVerdict
    reason: str
    undecided: list[str] = field(default_factory=list)


def decide(
    comparisons: Sequence[Comparison], confirmations: Sequence[Confirmation], rounds: int
) -> Decision:
    """Fail on a failing case (not one erroring on both sides); could not decide on a case that
    errors on both sides or a time change still undecided after `rounds` rounds; else pass,
    naming the improvements."""
    failing = [(cmp, c) for cmp in comparisons for c in cmp.failing_cases() if not errored_both(c)]
    if failing:
        names = ", ".join(f"{cmp.suite}/{c.name} ({c.verdict})" for cmp, c in failing[:10])
        more = f" and {len(failing) - 10} more" if len(failing) > 10 else ""
        return Decision(EXIT_FAIL, "fail", f"{len(failing)} failing case(s): {names}{more}")
    both = [f"{cmp.suite}/{c.name}" for cmp in comparisons for c in cmp.cases if errored_both(c)]
    if both:
        why = f"could not decide: case(s) error on both sides: {', '.join(both[:10])}"
        return Decision(EXIT_INFRA, "error", why)
    left = [f"{suite}/{case}" for suite, case in undecided(comparisons)]
    if left:
        pending = [f"{c.suite}/{c.case}" for c in confirmations if c.outcome == "undecided"]
        unconfirmed = (f"; regressions their confirmation pair neither confirmed nor cleared in "
                       f"{', '.join(dict.fromkeys(pending[:10]))}" if pending else "")
        return Decision(
            EXIT_INFRA, "error",
            f"could not decide after {rounds} re-measurement round(s): time changes beyond the minimum "
            f"effect but not significant in {', '.join(left[:10])}{unconfirmed}",
            left,
        )
    better = improvements(comparisons)
    more = f" and {len(better) - 10} more" if len(better) > 10 else ""
    named = f"; improved: {'; '.join(better[:10])}{more}" if better else ""
    return Decision(EXIT_PASS, "pass", "no regression, every bound holds" + named)
