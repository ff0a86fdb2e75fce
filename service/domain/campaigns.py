"""Campaigns: a plan (workers.plans) queued as one stored object, its state read from its jobs.

A submission names a plan, a device, world sizes, a commit and peer backends (and where those come
from: a backend source, installed for the jobs that run them, as a submitted job's label). The plan expands
into job bodies, and each one is validated exactly as a submitted job is
(`service.domain.submission.validate_request`) before anything is queued; then the campaign and
all its jobs are stored in one transaction. Its status and verdict are never stored: they are
derived from its jobs each time (`campaign_state`), so a restart loses nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from service.domain.baselines import compare_jobs
from service.domain.submission import Device, InvalidJob, JobCreate, validate_request
from service.executor_choice import get_executor
from service.persistence import campaigns as store
from service.persistence.campaigns import CampaignRequest
from service.persistence.models import FINAL_STATUSES
from service.persistence.records import CampaignRecord, JobRecord
from workers.backend_source import BACKEND_SOURCE_LABEL
from workers.executors.base import Executor
from workers.plans import PlanError, load_plan
from workers.refs import REF_RULE, REF_SCHEMA, check_commit
from workers.suite import UnknownSuiteInput, check_backend_names

if TYPE_CHECKING:
    from service.domain.compare import Comparison
    from service.settings import Settings

BackendName = Annotated[str, Field(min_length=1, max_length=200)]


class CampaignCreate(BaseModel):
    """POST /api/v1/campaigns. Unknown fields are an error, so a typo never silently runs defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    plan: str = Field(min_length=1, max_length=60, examples=["pr-report-cpu"])
    device: Device = "cpu"
    world_sizes: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        None, min_length=1, max_length=16, description="null = the plan's own world sizes"
    )
    commit: str | None = Field(
        None, description=f"code to test: {REF_RULE}; null = the installed code", json_schema_extra=REF_SCHEMA
    )
    backends: list[BackendName] = Field(
        default_factory=list, max_length=10, description="peer backends timed beside the backend under test"
    )
    backend_source: str | None = Field(
        None, min_length=1, max_length=500,
        description="where the peer backends come from (`git+<repo>@<commit>` or a pip requirement), "
        "installed per node for the jobs that run the peers; null = already installed",
    )
    priority: int = Field(0, ge=-1000, le=1000, description="higher runs first")
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)

    @field_validator("commit")
    @classmethod
    def _commit(cls, value: str | None) -> str | None:
        return None if value is None else check_commit(value)


class InvalidCampaign(ValueError):
    """A campaign the service can never run; the message names the bad value and the choices."""


def campaign_request(body: Any, executor: Executor | None) -> CampaignRequest:
    """The plan expanded for the submission, every job checked as a submitted job is; raises
    `InvalidCampaign` naming the plan entry and the reason when one cannot run."""
    req = body if isinstance(body, CampaignCreate) else CampaignCreate.model_validate(body)
    try:
        check_backend_names(req.backends)
        plan = load_plan(req.plan)
        planned = plan.expand(req.device, req.world_sizes, req.backends)
    except (PlanError, ValueError) as exc:
        raise InvalidCampaign(str(exc)) from exc
    if req.backend_source is not None and not req.backends:
        raise InvalidCampaign(
            f"backend_source {req.backend_source!r} without backends: name the backends it provides "
            "(backends, as peers of the backend under test)"
        )
    jobs = []
    for p in planned:
        body = {**p.job_body(), "commit": req.commit, "priority": req.priority}
        if req.backend_source is not None and p.runs_peers:
            body["labels"] = {**body["labels"], BACKEND_SOURCE_LABEL: req.backend_source}
        job_body = JobCreate.model_validate(body, strict=False)
        try:
            jobs.append((p.key, validate_request(job_body, executor)))
            p.check_cases()
        except (InvalidJob, UnknownSuiteInput, ValueError) as exc:
            raise InvalidCampaign(f"plan {plan.name!r} job {p.key!r} ({p.suite}): {exc}") from exc
    sizes = tuple(dict.fromkeys(req.world_sizes or plan.world_sizes))
    return CampaignRequest(
        plan_name=plan.name, plan_version=plan.version, plan=plan.document(), device=req.device,
        world_sizes=sizes, commit=req.commit, backends=tuple(req.backends),
        backend_source=req.backend_source, jobs=jobs,
        idempotency_key=req.idempotency_key,
    )


def submit_campaign(
    engine: Engine, settings: Settings, body: Any, executor: Executor | None = None
) -> tuple[CampaignRecord, bool]:
    """Validate and queue a campaign; returns (campaign, created)."""
    if executor is None:
        executor = get_executor(settings)
    return store.create_campaign(engine, campaign_request(body, executor))


@dataclass(frozen=True)
class CampaignState:
    """What a campaign's jobs say: `status` (queued, running, succeeded, failed, cancelled) and
    `verdict` (passed only when every job ended with verdict passed; failed when a job's code
    failed a bound; errored when a job errored or did not run; None while jobs are pending)."""

    status: str
    verdict: str | None
    jobs: dict[str, int] = field(default_factory=dict)  # by job status
    verdicts: dict[str, int] = field(default_factory=dict)  # by job verdict, of ended jobs
    done: int = 0
    total: int = 0


def campaign_state(jobs: Sequence[JobRecord]) -> CampaignState:
    statuses = Counter(j.status for j in jobs)
    verdicts = Counter(j.verdict or "none" for j in jobs if j.status in FINAL_STATUSES)
    done = sum(n for s, n in statuses.items() if s in FINAL_STATUSES)
    total = len(jobs)
    if done < total:
        status = "queued" if statuses.get("queued", 0) == total else "running"
        verdict = None
    else:
        status = next((s for s in ("failed", "cancelled") if statuses.get(s)), "succeeded")
        if all(j.verdict == "passed" for j in jobs):
            verdict = "passed"
        elif any(j.verdict == "failed" for j in jobs):
            verdict = "failed"
        else:
            verdict = "errored"
    return CampaignState(status, verdict, dict(statuses), dict(verdicts), done, total)


def campaign_or_none(
    session: Session, campaign_id: int
) -> tuple[CampaignRecord, list[tuple[str, JobRecord]]] | None:
    """The campaign and its (plan key, job) pairs in plan order, or None."""
    row = store.get_campaign(session, campaign_id)
    if row is None:
        return None
    return row, store.campaign_jobs(session, campaign_id)


@dataclass
class CampaignComparison:
    """Two campaigns compared job by job: jobs matched by plan key (entry and world size)."""

    base: int
    head: int
    pairs: list[tuple[str, int, int, Comparison]]
    only_base: list[str]
    only_head: list[str]

    @property
    def passed(self) -> bool:
        return all(c.passed for *_, c in self.pairs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base, "head": self.head, "passed": self.passed,
            "jobs": [{"key": k, "base_job": b, "head_job": h, "passed": c.passed, "comparison": c.to_dict()}
                     for k, b, h, c in self.pairs],
            "only_base": self.only_base, "only_head": self.only_head,
        }


def compare_campaigns(session: Session, base_id: int, head_id: int) -> CampaignComparison:
    """Compare every job of `head_id` with the job of `base_id` under the same plan key (one suite
    at one world size), through the job comparison (`compare_jobs`); keys present on one side
    only are listed. Raises LookupError for an unknown campaign, ValueError for two plans."""
    sides = {}
    for cid in (base_id, head_id):
        found = campaign_or_none(session, cid)
        if found is None:
            raise LookupError(f"no campaign {cid}")
        sides[cid] = found
    (base_row, base_jobs), (head_row, head_jobs) = sides[base_id], sides[head_id]
    if base_row.plan_name != head_row.plan_name:
        raise ValueError(
            f"campaign {base_id} ran plan {base_row.plan_name!r} but campaign {head_id} ran "
            f"{head_row.plan_name!r}; expected two campaigns of one plan"
        )
    base_by_key = dict(base_jobs)
    head_keys = {k for k, _ in head_jobs}
    pairs = [
        (key, base_by_key[key].id, job.id, compare_jobs(session, base_by_key[key].id, job.id))
        for key, job in head_jobs
        if key in base_by_key
    ]
    return CampaignComparison(
        base=base_id, head=head_id, pairs=pairs,
        only_base=[k for k, _ in base_jobs if k not in head_keys],
        only_head=[k for k, _ in head_jobs if k not in base_by_key],
    )
