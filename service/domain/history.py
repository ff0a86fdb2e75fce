"""History: a repository's commits in first-parent order, one point per commit, each judged
against the commit measured before it by the compare engine.

A commit's point pools every succeeded job of the chosen setting (suite, preset, device, world
size, parameters) at that commit, re-measurements of some cases included, as one side
(`baselines.load_pooled_side`, as the gate pools its rounds). Each measured commit is compared
with the previous measured one by `service.domain.compare.compare` on those pooled sides, so a
point's verdict is exactly what `/compare` and the gate say of the same jobs: nothing here
judges a number. A commit without jobs of the setting is listed, not measured, and the next
measured commit is compared with the last measured one (its point names that commit).

Jobs of several settings at the same commits are never pooled together: the setting with the
most measured commits is shown unless one is asked for, and the others are listed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from service.domain.baselines import load_pooled_side
from service.domain.commit_range import RangeError, backend_repository, first_parent, service_repository
from service.domain.compare import SEVERITY, Comparison, MetricResult, compare
from service.persistence.jobs import backend_repositories, jobs_at_commits
from service.persistence.records import JobRecord
from workers.stats import MetricStats


@dataclass(frozen=True)
class Setting:
    """What a job measured, apart from its commit: only jobs of one setting are pooled."""

    suite: str
    preset: str
    device: str
    world_size: int
    params_json: str  # the parameter overrides, canonical JSON

    @property
    def params(self) -> dict[str, Any]:
        return dict(json.loads(self.params_json))

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.params_json.encode()).hexdigest()[:8]
        return f"{self.preset}:{self.device}x{self.world_size}:{digest}"

    @classmethod
    def of(cls, job: JobRecord) -> Setting:
        params = json.dumps(dict(job.params or {}), sort_keys=True, default=str)
        return cls(job.suite, job.preset, job.device, job.world_size, params)


@dataclass
class Point:
    """One measured commit of one (case, metric): its statistics over the commit's pooled jobs
    and the compare engine's verdict against `against`, the commit measured before (None for
    the first)."""

    commit: str
    jobs: list[int]
    stats: MetricStats | None
    verdict: str | None = None
    reason: str = ""
    against: str | None = None


@dataclass
class Series:
    fingerprint: str
    case: str
    metric: str
    kind: str
    unit: str
    direction: str
    bound: float | None
    backend: str | None
    points: list[Point] = field(default_factory=list)


@dataclass
class CommitStep:
    """One commit of the range: its jobs of the setting and, when measured after another
    commit, the most severe verdict of the shown series against that commit."""

    commit: str
    jobs: list[int]
    against: str | None = None
    verdict: str | None = None


@dataclass
class History:
    repository: str
    suite: str
    setting: Setting | None
    settings: list[tuple[Setting, int]]  # every setting of the range, with its measured commits
    commits: list[CommitStep]
    series: list[Series]

    @property
    def changed(self) -> list[CommitStep]:
        """The commits whose comparison with the one before moved (any verdict but unchanged)."""
        return [c for c in self.commits if c.verdict not in (None, "unchanged")]


@dataclass(frozen=True)
class SeriesFilter:
    """Which series to show: `case` a fingerprint or part of a case name, `metric` a metric's
    name, `backend` the backend a case runs (its `backend` parameter), `kind` a metric kind."""

    case: str | None = None
    metric: str | None = None
    backend: str | None = None
    kind: str | None = None

    def keeps_case(self, fingerprint: str, name: str, params: Mapping[str, Any]) -> bool:
        if self.case and self.case != fingerprint and self.case not in name:
            return False
        return not (self.backend and params.get("backend") != self.backend)

    def keeps(self, fingerprint: str, name: str, params: Mapping[str, Any], m: MetricResult) -> bool:
        if not self.keeps_case(fingerprint, name, params):
            return False
        if self.metric and m.metric != self.metric:
            return False
        return not (self.kind and m.kind != self.kind)


def choose_setting(
    jobs: Sequence[JobRecord], key: str | None
) -> tuple[Setting | None, list[tuple[Setting, int]]]:
    """The setting to show (`key`'s, else the one with the most commits, the newest job breaking
    a tie) and every setting with its number of measured commits, most first."""
    commits: dict[Setting, set[str]] = {}
    newest: dict[Setting, int] = {}
    for job in jobs:
        s = Setting.of(job)
        commits.setdefault(s, set()).add(job.code_commit or "")
        newest[s] = max(newest.get(s, 0), job.id)
    ranked = sorted(commits, key=lambda s: (-len(commits[s]), -newest[s]))
    listed = [(s, len(commits[s])) for s in ranked]
    if key is not None:
        return next((s for s in ranked if s.key == key), None), listed
    return (ranked[0] if ranked else None), listed


def commit_history(
    session: Session, suite: str, shas: Sequence[str], jobs: Sequence[JobRecord], *,
    setting: str | None = None, keep: SeriesFilter | None = None,
) -> History:
    """The history of the commits `shas` (oldest first) from `jobs` (the succeeded jobs of
    `suite` at those commits): one point per measured commit and series, each compared with the
    commit measured before it."""
    keep = keep or SeriesFilter()
    chosen, settings = choose_setting(jobs, setting)
    by_commit: dict[str, list[JobRecord]] = {}
    for job in jobs:
        if chosen is not None and Setting.of(job) == chosen:
            by_commit.setdefault(job.code_commit or "", []).append(job)
    steps = [CommitStep(sha, [j.id for j in _pool_order(by_commit.get(sha, []))]) for sha in shas]
    series: dict[tuple[str, str], Series] = {}
    previous: tuple[str, Any] | None = None
    for step in steps:
        if not step.jobs:
            continue
        side = load_pooled_side(session, step.jobs)
        if previous is None:
            _add(series, compare(side, side), step, None, keep)  # its statistics, nothing to judge against
        else:
            step.against = previous[0]
            seen = _add(series, compare(previous[1], side), step, previous[0], keep)
            step.verdict = min(seen, key=SEVERITY.__getitem__) if seen else "unchanged"
        previous = (step.commit, side)
    ordered = sorted(series.values(), key=lambda s: (s.case, s.metric))
    return History("", suite, chosen, settings, steps, ordered)


def _pool_order(jobs: Sequence[JobRecord]) -> list[JobRecord]:
    """Whole jobs first (a pooled side takes its cases from the first), then re-measurements of
    some cases; oldest first within each."""
    return sorted(jobs, key=lambda j: (bool(j.cases), j.id))


def _add(series: dict[tuple[str, str], Series], cmp: Comparison, step: CommitStep, against: str | None,
         keep: SeriesFilter) -> list[str]:
    """Add `step`'s point to every kept series; returns the verdicts it saw (of the kept metrics,
    and of kept cases that compared no metric: errored, incomparable, added, removed)."""
    seen: list[str] = []
    for c in cmp.cases:
        kept = [m for m in c.metrics if keep.keeps(c.fingerprint, c.name, c.params, m)]
        if not c.metrics and keep.keeps_case(c.fingerprint, c.name, c.params):
            seen.append(c.verdict)
        for m in kept:
            s = series.get((c.fingerprint, m.metric))
            if s is None:
                s = series[(c.fingerprint, m.metric)] = Series(
                    c.fingerprint, c.name, m.metric, m.kind, m.unit, m.direction, m.bound,
                    c.params.get("backend"))
            point = Point(step.commit, step.jobs, m.head)
            if against is not None:
                point.verdict, point.reason, point.against = m.verdict, m.reason, against
                seen.append(m.verdict)
            s.points.append(point)
    return seen


def repository_history(
    session: Session, suite: str, *, backend_repo: str | None = None, tip: str = "HEAD", last: int = 50,
    device: str | None = None, world_size: int | None = None, setting: str | None = None,
    keep: SeriesFilter | None = None,
) -> History:
    """The history of the `last` first-parent commits up to `tip` of the project's repository
    (the service's, GDNVAL_REPO) or of `backend_repo` (a repository the stored jobs installed a
    backend from). Raises RangeError naming what is missing or unreadable."""
    if backend_repo is not None:
        known = backend_repositories(session)
        if backend_repo not in known:
            raise RangeError(f"no stored job installed a backend from {backend_repo!r}; known: {known}")
        repo: Any = backend_repository(backend_repo)
    else:
        repo = service_repository()
        if repo is None:
            raise RangeError("the project's history orders commits by its repository, and the service has "
                             "none: start it with GDNVAL_REPO set, or ask for a backend_repo")
    shas = first_parent(repo, tip, limit=last)
    jobs = jobs_at_commits(session, shas, suite, backend_repo=backend_repo, device=device,
                           world_size=world_size)
    history = commit_history(session, suite, shas, jobs, setting=setting, keep=keep)
    history.repository = backend_repo or str(repo)
    return history
