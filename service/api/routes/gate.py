"""Gate, compare and report endpoints under /api/v1 (mounted by `service.app.create_app`).

- `POST /api/v1/gate`: one step of the gate (`service.domain.gate.evaluate_gate`): finds or submits the
  jobs and answers the state; call again with the same body (same `run_id`) until `phase` is
  `done`. Writes jobs, so it needs the bearer token when one is configured.
- `GET /api/v1/compare?base=JOB&head=JOB` (or `base_commit=`/`head_commit=` with `suite=`): the
  compare engine's result as JSON.
- `GET /api/v1/jobs/{id}/report?base=JOB`: the Markdown test report.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import PlainTextResponse
from sqlalchemy.orm import Session

from service.api.routes.jobs import MAX_ID, get_session, require_read, require_write
from service.domain.gate import GateInputError, GateRequest, default_submit, evaluate_gate

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["gate"])
SessionDep = Annotated[Session, Depends(get_session)]
JobQuery = Annotated[int, Query(ge=1, le=MAX_ID, description="job id")]
JobPath = Annotated[int, Path(ge=1, le=MAX_ID, description="job id")]


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
        from service.domain.gate import gate_markdown

        result.markdown = gate_markdown(result, _base_url(request))
    return result.to_dict()


@router.get("/compare")
def compare_endpoint(
    session: SessionDep,
    base: JobQuery | None = None,
    head: JobQuery | None = None,
    base_commit: Annotated[str | None, Query(max_length=255, description="instead of base: a commit")] = None,
    head_commit: Annotated[str | None, Query(max_length=255, description="instead of head: a commit")] = None,
    suite: Annotated[str | None, Query(max_length=100, description="with commits: the suite")] = None,
    preset: Annotated[str | None, Query(max_length=50)] = None,
    device: Annotated[str | None, Query(max_length=10)] = None,
) -> dict[str, Any]:
    """Compare two jobs of one suite case by case and metric by metric; a side given as a commit
    is that commit's newest succeeded job of `suite` (same preset/device when given)."""
    from service.domain.baselines import NotFound, compare_jobs, find_commit_job

    def side(job: int | None, commit: str | None, name: str) -> int:
        if (job is None) == (commit is None):
            raise HTTPException(422, f"give exactly one of {name} (a job id) or {name}_commit")
        if job is not None:
            return job
        if not suite:
            raise HTTPException(422, f"{name}_commit={commit!r} needs suite=NAME to pick the job")
        found = find_commit_job(session, commit or "", suite, preset=preset, device=device)
        if found is None:
            raise HTTPException(404, f"no succeeded job of suite {suite!r} at commit {commit!r}")
        return found.id

    base_id, head_id = side(base, base_commit, "base"), side(head, head_commit, "head")
    try:
        return compare_jobs(session, base_id, head_id).to_dict()
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc


@router.get(
    "/jobs/{job_id}/report",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/markdown": {"schema": {"type": "string"}}}}},
)
def report_endpoint(
    job_id: JobPath,
    request: Request,
    session: SessionDep,
    base: Annotated[
        list[Annotated[int, Query(ge=1, le=MAX_ID)]] | None,
        Query(max_length=20, description="base job(s), one per suite"),
    ] = None,
) -> PlainTextResponse:
    """The Markdown test report of a job, compared with `base` when given."""
    from service.domain.baselines import NotFound
    from service.domain.report import build_report

    try:
        text, _ = build_report(session, [job_id], base or [], _base_url(request))
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")
