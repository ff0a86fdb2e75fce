"""`POST /api/v1/gate`: one step of the gate (`service.domain.gate.evaluate_gate`): finds or
submits the jobs and answers the state; call again with the same body (same `run_id`) until
`phase` is `done`. Writes jobs, so it needs the bearer token when one is configured."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request

from service.api.deps import require_read, require_write
from service.domain.gate import GateInputError, GateRequest, default_submit, evaluate_gate, gate_markdown

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["gate"])


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


@router.post("/gate", dependencies=[Depends(require_write)])
def gate_step(body: GateRequest, request: Request) -> dict[str, Any]:
    """Advance the gate; `exit_code` is set once `phase` is `done` (0 pass, 1 fail, 2 could not run)."""
    state = request.app.state
    dispatcher = getattr(state, "dispatcher", None)
    if state.executor is None:
        return {
            "phase": "done", "exit_code": 2, "verdict": "error", "head": body.head, "base": None,
            "base_source": "", "jobs": [], "confirmations": [], "comparisons": [],
            "reason": f"could not run: the service has no executor ({state.executor_error})",
            "markdown": f"## gdnval gate: ⚠️ COULD NOT RUN (exit 2)\n\n- the service has no executor "
                        f"({state.executor_error})\n",
        }  # fmt: skip
    wake = dispatcher.wake if dispatcher is not None else None
    submit = default_submit(state.engine, state.settings, state.executor, wake)
    try:
        result = evaluate_gate(state.engine, body, submit)
    except GateInputError as exc:
        raise HTTPException(422, str(exc)) from exc
    if result.markdown is not None:
        result.markdown = gate_markdown(result, _base_url(request))
    return result.to_dict()
