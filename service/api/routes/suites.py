"""`/api/v1/suites`: the suite catalogue."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path

from service.api.deps import (
    require_read,
)
from service.api.schemas import (
    Page,
    SuiteOut,
)
from workers.registry import get_suite, suite_names
from workers.suite import UnknownSuiteInput

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)])


@router.get("/suites", response_model=Page[SuiteOut])
def list_suites() -> Page[SuiteOut]:
    """The suite catalogue: presets with their resolved params and cases, params schema, metrics."""
    items: list[SuiteOut] = []
    for n in suite_names():
        try:
            items.append(SuiteOut.model_validate(get_suite(n).describe()))
        except Exception as exc:  # one broken suite module must not hide the others
            items.append(SuiteOut(name=n, error=f"{type(exc).__name__}: {exc}"))
    return Page[SuiteOut](items=items, next=None)


@router.get("/suites/{name}", response_model=SuiteOut)
def get_suite_entry(name: Annotated[str, Path(max_length=100)]) -> SuiteOut:
    try:
        return SuiteOut.model_validate(get_suite(name).describe())
    except UnknownSuiteInput as exc:
        raise HTTPException(404, str(exc)) from exc
    except Exception as exc:
        raise HTTPException(503, f"suite {name!r} cannot be loaded: {type(exc).__name__}: {exc}") from exc
