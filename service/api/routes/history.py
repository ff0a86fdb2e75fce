"""`GET /api/v1/history`: a repository's commits in first-parent order, one point per measured
commit and series (case x metric), each judged against the commit measured before it by the
compare engine (`service.domain.history`)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, Field

from service.api.deps import SessionDep, require_read
from service.domain.commit_range import RangeError
from service.domain.history import History, SeriesFilter, Setting, repository_history
from workers.refs import InvalidCommitRef

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)], tags=["history"])


def _num(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


class PointOut(BaseModel):
    commit: str
    jobs: list[int] = Field(description="the commit's jobs of the setting, pooled")
    count: int
    median: float | None
    min: float | None
    p90: float | None
    max: float | None
    worst: float | None
    verdict: str | None = Field(description="the compare engine's verdict against `against`; null: the first")
    reason: str
    against: str | None = Field(description="the commit measured before this one")


class SeriesOut(BaseModel):
    fingerprint: str
    case: str
    metric: str
    kind: str
    unit: str
    direction: str
    bound: float | None
    backend: str | None
    points: list[PointOut]


class CommitOut(BaseModel):
    commit: str
    jobs: list[int] = Field(description="empty: no job of the setting at this commit")
    against: str | None
    verdict: str | None = Field(description="the most severe verdict of the series shown against `against`")


class SettingOut(BaseModel):
    key: str
    preset: str
    device: str
    world_size: int
    params: dict[str, Any]
    commits: int = Field(description="measured commits of the range in this setting")


class HistoryOut(BaseModel):
    repository: str
    suite: str
    setting: SettingOut | None = Field(description="the setting whose jobs are pooled; null: no job")
    settings: list[SettingOut]
    commits: list[CommitOut] = Field(description="oldest first, first parents only")
    series: list[SeriesOut]

    @classmethod
    def of(cls, h: History) -> HistoryOut:
        counts = {s.key: n for s, n in h.settings}
        return cls(
            repository=h.repository, suite=h.suite,
            setting=_setting(h.setting, counts) if h.setting else None,
            settings=[_setting(s, n) for s, n in h.settings],
            commits=[CommitOut(commit=c.commit, jobs=c.jobs, against=c.against, verdict=c.verdict)
                     for c in h.commits],
            series=[SeriesOut(fingerprint=s.fingerprint, case=s.case, metric=s.metric, kind=s.kind,
                              unit=s.unit, direction=s.direction, bound=_num(s.bound), backend=s.backend,
                              points=[_point(p) for p in s.points]) for s in h.series],
        )


def _setting(s: Setting, counts: dict[str, int] | int) -> SettingOut:
    n = counts if isinstance(counts, int) else counts.get(s.key, 0)
    return SettingOut(key=s.key, preset=s.preset, device=s.device, world_size=s.world_size,
                      params=dict(s.params), commits=n)


def _point(p: Any) -> PointOut:
    st = p.stats
    return PointOut(commit=p.commit, jobs=p.jobs, count=st.count if st else 0,
                    median=_num(st.median) if st else None, min=_num(st.min) if st else None,
                    p90=_num(st.p90) if st else None, max=_num(st.max) if st else None,
                    worst=_num(st.worst) if st else None, verdict=p.verdict, reason=p.reason,
                    against=p.against)


@router.get("/history", response_model=HistoryOut)
def history(
    session: SessionDep,
    suite: Annotated[str, Query(min_length=1, max_length=100)],
    backend_repo: Annotated[str | None, Query(max_length=1000, description=(
        "a backend's repository, as its jobs installed it; default: the project's (GDNVAL_REPO)"))] = None,
    tip: Annotated[str, Query(max_length=200, description="the newest commit (a ref or sha)")] = "HEAD",
    last: Annotated[int, Query(ge=1, le=500, description="first-parent commits up to `tip`")] = 50,
    setting: Annotated[str | None, Query(max_length=100, description="a setting's key (settings)")] = None,
    device: Literal["cuda", "npu", "cpu"] | None = None,
    world_size: Annotated[int | None, Query(ge=1, le=4096)] = None,
    case: Annotated[str | None, Query(max_length=300, description="fingerprint, or part of a name")] = None,
    metric: Annotated[str | None, Query(max_length=200)] = None,
    backend: Annotated[str | None, Query(max_length=200, description="the backend a case runs")] = None,
    kind: Literal["time", "memory", "accuracy", "trajectory", "check"] | None = None,
) -> HistoryOut:
    """One point per commit (first parents, oldest first) and series, pooled over the commit's
    jobs; `verdict` is the compare engine's against the commit measured before."""
    keep = SeriesFilter(case=case, metric=metric, backend=backend, kind=kind)
    try:
        found = repository_history(session, suite, backend_repo=backend_repo, tip=tip, last=last,
                                   device=device, world_size=world_size, setting=setting, keep=keep)
    except (RangeError, InvalidCommitRef) as exc:
        raise HTTPException(422, str(exc)) from exc
    return HistoryOut.of(found)
