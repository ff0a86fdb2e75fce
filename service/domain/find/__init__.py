"""`find`: the first commit of a first-parent range that regressed, by bisection with the gate.

The range runs from a good commit to a bad one. Every step is a gate (`service.domain.gate`,
the same suites, presets, parameters and judgment as `gdnval gate`) of one commit against the
good one, reusing every stored job of that setting; its exit code makes the commit good (0),
bad (1) or skipped (2: it could not be built, run or decided). The bad end is gated first; then
the commit nearest the middle of what is still open; once good and bad meet, the boundary's two
commits are measured anew against each other and the first bad commit is named only if that
reproduces it, with the metrics that moved. A find is stored like a gate (its request, steps,
verdict) and each step's gate is a stored gate with its jobs.

The package: `bisect` (the pure decision of what to gate next) and `runner` (the state machine
that runs the step gates and stores the find). Exit codes (`service.domain.exit_codes`): 1 a first
bad commit found, 0 no regression between the two, 2 could not decide.
"""

from service.domain.find.bisect import OUTCOME_OF_EXIT, Next, Outcome, StepKind, measured_bound, next_step
from service.domain.find.runner import FindInputError, FindRequest, FindState, commit_range, evaluate_find

__all__ = [
    "OUTCOME_OF_EXIT", "FindInputError", "FindRequest", "FindState", "Next", "Outcome", "StepKind",
    "commit_range", "evaluate_find", "measured_bound", "next_step",
]
