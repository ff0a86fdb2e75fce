"""The bisection's decisions, as a pure function of what each gated commit turned out to be.

A find gates commits of a first-parent range against its good commit, each with the gate's
own judgment: exit 0 makes a commit good, 1 bad, 2 (could not be built, run or decided)
skipped, as `git bisect skip` does. `next_step` says what to gate next: first the bad end
(is it bad at all?), then the commit nearest the middle of what is still open, skipping skipped
ones; once good and bad meet, the boundary's two commits are measured anew against each other
(`confirm`), and only a boundary that reproduces names a first bad commit. Without skips a find
gates at most ceil(log2 N) + 1 commits of a range of N, plus the boundary's re-measurement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from service.domain import exit_codes

Outcome = Literal["good", "bad", "skip"]
StepKind = Literal["verify", "bisect", "confirm"]
OUTCOME_OF_EXIT: dict[int, Outcome] = {exit_codes.PASSED: "good", exit_codes.FAILED: "bad",
                                       exit_codes.COULD_NOT_RUN: "skip"}


@dataclass(frozen=True)
class Next:
    """What the find does next: gate `commit` (against `base`: the good commit, or for the
    confirmation the last good one), or it is done with `code`, `verdict` and `reason`."""

    kind: StepKind | Literal["done"]
    commit: str | None = None
    base: str | None = None
    code: int | None = None
    verdict: Literal["pass", "fail", "error"] | None = None
    reason: str = ""
    first_bad: str | None = None
    last_good: str | None = None


def measured_bound(commits: int) -> int:
    """The most commits a find of `commits` commits after its good one measures without skips:
    the good and bad ends, ceil(log2 N) midpoints at most (the boundary's two are among them)."""
    return math.ceil(math.log2(max(commits, 1))) + 2


def next_step(good: str, commits: Sequence[str], outcomes: Mapping[str, Outcome],
              confirmed: Outcome | None = None) -> Next:
    """The next step of the find of `commits` (after `good` up to the bad commit, oldest first)
    given the outcomes so far (`confirmed`: the boundary's re-measurement's)."""
    bad = commits[-1]
    if bad not in outcomes:
        return Next("verify", bad, good)
    if outcomes[bad] == "good":
        return Next("done", code=exit_codes.PASSED, verdict="pass",
                    reason=f"no regression: {bad[:12]} passes the gate against {good[:12]}")
    if outcomes[bad] == "skip":
        return Next("done", code=exit_codes.COULD_NOT_RUN, verdict="error",
                    reason=f"could not decide: the gate of the bad commit {bad[:12]} against {good[:12]} "
                           "could not run or decide")
    hi = min(i for i, c in enumerate(commits) if outcomes.get(c) == "bad")
    lo = max((i for i in range(hi) if outcomes.get(commits[i]) == "good"), default=-1)
    open_ = [i for i in range(lo + 1, hi) if commits[i] not in outcomes]
    if open_:
        middle = (lo + hi) / 2
        pick = min(open_, key=lambda i: (abs(i - middle), i))
        return Next("bisect", commits[pick], good)
    last_good = commits[lo] if lo >= 0 else good
    first_bad = commits[hi]
    skipped = [commits[i] for i in range(lo + 1, hi)]
    if skipped:
        names = ", ".join(c[:12] for c in [*skipped, first_bad])
        return Next("done", code=exit_codes.COULD_NOT_RUN, verdict="error", last_good=last_good,
                    reason=f"could not decide: the first bad commit is one of {names} (the commits "
                           f"before {first_bad[:12]} could not be built, run or decided)")
    if confirmed is None:
        return Next("confirm", first_bad, last_good)
    if confirmed == "bad":
        return Next("done", code=exit_codes.FAILED, verdict="fail", first_bad=first_bad, last_good=last_good,
                    reason=f"first bad commit {first_bad[:12]} (last good {last_good[:12]}), confirmed by "
                           "measuring both anew")
    why = ("passed when both were measured anew: the change did not reproduce" if confirmed == "good"
           else "could not be decided when both were measured anew")
    return Next("done", code=exit_codes.COULD_NOT_RUN, verdict="error", last_good=last_good,
                reason=f"could not decide: the boundary {first_bad[:12]} against {last_good[:12]} {why}")
