"""The per-commit gate: run or reuse jobs for head and base, compare, and decide.

`evaluate_gate` is one idempotent step of a state machine kept entirely in the store: it
checks the whole request first (every suite, preset, parameter, device and world size, and the
refs, before any job is queued), resolves the base, finds or submits each (suite, role) job
under an idempotency key derived from the gate run's id, and answers `waiting` until every job
is final, then `done` with the verdict. The API's `POST /api/v1/gate` is exactly one step; the
CLI calls it until `done`, drawing a progress bar from the jobs it lists. Nothing but jobs is
stored, so a gate survives a server restart and two gates of one commit share their jobs.

The package: `request` (what is asked, checked before anything is queued), `decision` (pure
functions: findings, confirmations, undecided cases, the verdict), `state` (where a gate stands)
and `runner` (the part that queues jobs and opens sessions).

Exit codes (`service.domain.exit_codes`): 0 pass, 1 regression or failure (a failing metric, or
a case that errors at head but not at base), 2 could not decide or could not run (a job failed,
the base cannot be found, the jobs are not comparable, a case errors on both sides, or a time
change stays undecided).
On exit 2 the jobs this gate queued and that are still pending are cancelled.

Enough evidence, or say so: a time metric whose change exceeds its minimum effect but is not
significant (`inconclusive`) is measured again — `max_rounds` rounds of just those cases, a base
job then a head job each round (interleaved, so drift on a shared device cancels), pooled with
what was measured before — until decided; still undecided -> exit 2 naming the cases.

`confirm` (on by default for cpu, where timings shift from one process to the next): the cases
with time regressions are measured again by a fresh base job and then a fresh head job, and that
pair's verdict of each regressed metric decides it (`confirmation_outcome`): regressed (or
failed) confirms it; unchanged or improved clears it (shown as `changed`, never failing);
anything else neither confirms nor clears it. A pair that is beyond the minimum effect but not
significant gets the same rounds as above (of the pair, pooled with it, never with the first run);
still undecided, or not measured by the pair at all, the metric is `inconclusive` -> exit 2
naming the case, never a pass.

The preset: `preset`, or each suite's `gate_presets[device]` (`gate` on cuda/npu, `gate-cpu` on
cpu). The default suites: every registered suite whose preset has a case that runs on the device
at the world size (`submission.runs_here`); with `backend` (a gate of that backend's own
repository), the suites that call it with the parameters that make them do so
(service.domain.backend_gate), a suite that would not being refused. A base equal to the head
needs `reuse` false.

Improvements are findings too: a gate whose only changes are improvements passes and names them.
The decision over pooled rounds is kept apart from what each job pair measured (`GateState.measured`),
so every table says which jobs its numbers come from.
"""


from service.domain.gate.decision import (
    CLEARS,
    EXIT_FAIL,
    EXIT_INFRA,
    EXIT_PASS,
    Confirmation,
    ConfirmOutcome,
    Decision,
    confirmation_outcome,
    decide,
    findings,
)
from service.domain.gate.request import (
    GateInputError,
    GateRequest,
    params_for,
    preset_for,
    suites_for,
    validate_gate,
)
from service.domain.gate.runner import CannotRun, SubmitFn, default_submit, evaluate_gate, record_gate
from service.domain.gate.state import GateJob, GateState, Role

__all__ = [
    "CLEARS", "EXIT_FAIL", "EXIT_INFRA", "EXIT_PASS", "CannotRun", "ConfirmOutcome", "Confirmation",
    "Decision", "GateInputError", "GateJob", "GateRequest", "GateState", "Role", "SubmitFn",
    "confirmation_outcome", "decide", "default_submit", "evaluate_gate", "findings", "params_for",
    "preset_for", "record_gate", "suites_for", "validate_gate",
]
