"""`GET /api/v1/compare?base=JOB&head=JOB` (or `base_commit=`/`head_commit=` with `suite=`): the
compare engine's result as JSON."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query

from service.api.deps import JobQuery, SessionDep, require_read
from service.domain.baselines import NotFound, compare_jobs, find_commit_job

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["gate"])


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
