"""`/api/v1/jobs/{id}/artifacts`: the files a job produced."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Response
from fastapi.responses import FileResponse

from service.api.deps import (
    JobId,
    SessionDep,
    job_or_404,
    require_read,
)
from service.api.schemas import (
    ArtifactOut,
    Page,
)
from service.persistence import artifacts as artifact_store
from service.persistence.artifacts import MAX_NAME, artifact_url

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)])


@router.get("/jobs/{job_id}/artifacts", response_model=Page[ArtifactOut])
def job_artifacts(job_id: JobId, session: SessionDep) -> Page[ArtifactOut]:
    job_or_404(session, job_id)
    items = [
        ArtifactOut(
            name=a.name,
            media_type=a.media_type,
            size=a.size,
            created_at=a.created_at,
            url=artifact_url(job_id, a.name),
        )
        for a in artifact_store.list_artifacts(session, job_id)
    ]
    return Page[ArtifactOut](items=items, next=None)


@router.get("/jobs/{job_id}/artifacts/{name:path}", response_class=Response)
def job_artifact(
    job_id: JobId,
    name: Annotated[str, Path(min_length=1, max_length=MAX_NAME, description="full name, `/` kept")],
    session: SessionDep,
) -> Response:
    """One artifact's bytes by its full name as listed (`rank0/trace.json`)."""
    job_or_404(session, job_id)
    art = artifact_store.get_artifact(session, job_id, name)
    if art is None:
        raise HTTPException(404, f"job {job_id} has no artifact {name!r}")
    if art.path:
        from pathlib import Path as FsPath

        if not FsPath(art.path).is_file():
            raise HTTPException(404, f"artifact {name!r} of job {job_id} is recorded but its file is gone")
        return FileResponse(art.path, media_type=art.media_type, filename=FsPath(art.path).name)
    return Response(art.blob or b"", media_type=art.media_type)
