"""Campaign rows and their jobs: create one with all its jobs in one transaction, read, list.

A campaign's jobs are ordinary queued jobs (`service.persistence.queue.insert_job`), linked to it
under their plan key; nothing about a campaign's progress is stored apart from its jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from service.persistence.commits import ensure_commit
from service.persistence.models import CampaignJobRow, CampaignRow, JobRow
from service.persistence.queue import JobRequest, insert_job, insert_once
from service.persistence.records import CampaignRecord, JobRecord


@dataclass(frozen=True)
class CampaignRequest:
    """A validated campaign: its plan as stored, and one validated job request per plan key."""

    plan_name: str
    plan_version: int
    plan: Mapping[str, Any]
    device: str
    world_sizes: tuple[int, ...]
    commit: str | None
    backends: tuple[str, ...] = ()
    jobs: Sequence[tuple[str, JobRequest]] = field(default_factory=tuple)
    idempotency_key: str | None = None
    backend_source: str | None = None  # where the peers come from (on the jobs that run them too)

    def same_as(self, row: CampaignRow) -> bool:
        return (
            row.plan_name == self.plan_name
            and row.plan_version == self.plan_version
            and row.device == self.device
            and list(row.world_sizes) == list(self.world_sizes)
            and row.commit_sha == self.commit
            and list(row.backends) == list(self.backends)
            and row.backend_source == self.backend_source
        )


def create_campaign(engine: Engine, req: CampaignRequest) -> tuple[CampaignRecord, bool]:
    """Store the campaign and queue its jobs in one write transaction; returns (campaign, created).

    A known idempotency key returns its campaign unchanged, or raises JobConflict when the key
    named a different campaign (plan, device, world sizes, commit, backends or their source differ)."""

    def insert(s: Session) -> CampaignRow:
        row = CampaignRow(
            plan_name=req.plan_name, plan_version=req.plan_version, plan=dict(req.plan),
            device=req.device, world_sizes=list(req.world_sizes), commit=ensure_commit(s, req.commit),
            backends=list(req.backends), backend_source=req.backend_source,
            idempotency_key=req.idempotency_key,
        )
        s.add(row)
        s.flush()
        for position, (key, job_req) in enumerate(req.jobs):
            job = insert_job(s, job_req)
            s.add(CampaignJobRow(campaign_id=row.id, job_id=job.id, position=position, key=key))
        s.flush()
        return row

    return insert_once(
        engine, CampaignRow, req.idempotency_key, same=req.same_as,
        named=lambda row: f"campaign {row.id} (plan {row.plan_name} v{row.plan_version} on {row.device} at "
        f"world sizes {list(row.world_sizes)}) with different settings",
        insert=insert, record=CampaignRecord.of, what="store the campaign",
    )


def get_campaign(session: Session, campaign_id: int) -> CampaignRecord | None:
    row = session.get(CampaignRow, campaign_id)
    return None if row is None else CampaignRecord.of(row)


def campaign_jobs(session: Session, campaign_id: int) -> list[tuple[str, JobRecord]]:
    """(plan key, job) of a campaign in plan order."""
    q = (
        select(CampaignJobRow.key, JobRow)
        .join(JobRow, JobRow.id == CampaignJobRow.job_id)
        .where(CampaignJobRow.campaign_id == campaign_id)
        .order_by(CampaignJobRow.position)
    )
    return [(key, JobRecord.of(job)) for key, job in session.execute(q).unique()]


def jobs_of_campaigns(session: Session, campaign_ids: Sequence[int]) -> dict[int, list[JobRecord]]:
    """The jobs of several campaigns at once (a list page), in plan order."""
    out: dict[int, list[JobRecord]] = {c: [] for c in campaign_ids}
    if not campaign_ids:
        return out
    q = (
        select(CampaignJobRow.campaign_id, JobRow)
        .join(JobRow, JobRow.id == CampaignJobRow.job_id)
        .where(CampaignJobRow.campaign_id.in_(list(campaign_ids)))
        .order_by(CampaignJobRow.campaign_id, CampaignJobRow.position)
    )
    for cid, job in session.execute(q).unique():
        out[cid].append(JobRecord.of(job))
    return out


def list_campaigns(
    session: Session, *, plan: str | None = None, before_id: int | None = None, limit: int = 50
) -> tuple[list[CampaignRecord], int | None]:
    """Newest first. Returns the page and the cursor (an id) for the next page, or None."""
    q = select(CampaignRow).order_by(CampaignRow.id.desc()).limit(limit + 1)
    if plan:
        q = q.where(CampaignRow.plan_name == plan)
    if before_id is not None:
        q = q.where(CampaignRow.id < before_id)
    rows = [CampaignRecord.of(r) for r in session.scalars(q).unique()]
    nxt = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], nxt
