"""`POST /api/v1/runs`: a finished run made outside the service (`gdnval push`, a
`gdnval run --json` document) stored as a job, in the shape of the service's own jobs
(`service.persistence.runs.store_run`). Writes, so it needs the bearer token when one is set."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from service.api.deps import EngineDep, require_read, require_write
from service.api.schemas import JobOut
from service.persistence.runs import RunDocument, store_run

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["jobs"])


@router.post("/runs", status_code=201, response_model=JobOut, dependencies=[Depends(require_write)],
             responses={200: {"description": "the run was stored before (same run_id): that job"}})
def store_pushed_run(body: RunDocument, response: Response, engine: EngineDep) -> JobOut:
    """Store a run's document as a finished job; a run id stored before answers 200 with its job."""
    job, created = store_run(engine, body)
    if not created:
        response.status_code = 200
    response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    return JobOut.of(job)
