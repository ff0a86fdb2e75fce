"""`/api/v1/baselines`: named bases of the gate and the compare page."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException

from service.api.deps import (
    EngineDep,
    Name,
    SessionDep,
    require_read,
    require_write,
)
from service.api.schemas import (
    BaselineOut,
    BaselineSet,
    Page,
)
from service.persistence import baselines as baseline_store
from service.persistence import db
from service.persistence import jobs as job_store
from service.persistence.records import BaselineRecord

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)])


def _baseline_out(b: BaselineRecord) -> BaselineOut:
    return BaselineOut(
        name=b.name, commit=b.commit, job_id=b.job_id, note=b.note,
        updated_at=b.updated_at,
    )


@router.get("/baselines", response_model=Page[BaselineOut])
def list_baselines(session: SessionDep) -> Page[BaselineOut]:
    items = [_baseline_out(b) for b in baseline_store.list_baselines(session)]
    return Page[BaselineOut](items=items, next=None)


@router.get("/baselines/{name}", response_model=BaselineOut)
def get_baseline(name: Name, session: SessionDep) -> BaselineOut:
    b = baseline_store.get_baseline(session, name)
    if b is None:
        raise HTTPException(404, f"no baseline {name!r}")
    return _baseline_out(b)


@router.put("/baselines/{name}", response_model=BaselineOut, dependencies=[Depends(require_write)])
def set_baseline(name: Name, body: BaselineSet, engine: EngineDep) -> BaselineOut:
    """Point a named baseline at a commit or at one job (exactly one of the two)."""
    if (body.commit is None) == (body.job_id is None):
        raise HTTPException(422, "give exactly one of 'commit' (a sha or ref) or 'job_id'")
    with db.write_tx(engine) as s:
        if body.job_id is not None and job_store.get_job(s, body.job_id) is None:
            raise HTTPException(422, f"job_id {body.job_id} does not exist")
        b = baseline_store.set_baseline(s, name, commit=body.commit, job_id=body.job_id, note=body.note)
        return _baseline_out(b)
