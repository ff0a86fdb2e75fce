"""The records the store answers the domain: every field read from its row as stored, and the
idempotent insert behind jobs and campaigns answering records on a repeated key."""

from __future__ import annotations

from dataclasses import fields

import pytest
from sqlalchemy.orm import Session

from service.persistence import baselines, campaigns, queue
from service.persistence import jobs as job_store
from service.persistence.models import CampaignRow, JobRow
from service.persistence.records import BaselineRecord, CampaignRecord, JobRecord

pytestmark = pytest.mark.stores("sqlite")
SHA = "ab" * 20


def test_a_job_record_reads_every_field_from_its_row(engine) -> None:
    labels = {"backend_source": f"git+https://example.invalid/b.git@{'cd' * 20}"}
    req = queue.JobRequest(suite="s", preset="quick", params={"n": 2}, commit=SHA, world_size=2,
                           priority=3, labels=labels, idempotency_key="k", cases=("a", "b"))
    made, created = queue.submit(engine, req)
    assert created and isinstance(made, JobRecord)
    again, created_again = queue.submit(engine, req)
    assert not created_again and again == made  # the key's job, as a record
    with pytest.raises(queue.JobConflict, match=r"already names job \d+ \(s/quick on cpux2\)"):
        queue.submit(engine, queue.JobRequest(suite="s", idempotency_key="k"))
    with Session(engine) as s:
        row = s.get(JobRow, made.id)
        record = job_store.job_record(s, made.id)
        assert record is not None and job_store.job_record(s, made.id + 1) is None
        assert {f.name: getattr(record, f.name) for f in fields(record)} == {
            f.name: getattr(row, f.name) for f in fields(record)
        }
        assert record.commit_sha == SHA and record.code_commit == "cd" * 20 == row.code_commit
        assert record.params == {"n": 2} and record.cases == ["a", "b"] and record.status == "queued"
        assert job_store.job_by_idempotency_key(s, "k") == record


def test_campaign_and_baseline_records(engine) -> None:
    req = campaigns.CampaignRequest("plan", 1, {"name": "plan"}, "cpu", (1, 2), SHA, ("fla",),
                                    [("a@1", queue.JobRequest(suite="s"))], idempotency_key="c")
    made, created = campaigns.create_campaign(engine, req)
    again, created_again = campaigns.create_campaign(engine, req)
    assert created and not created_again and isinstance(made, CampaignRecord) and again == made
    with Session(engine) as s:
        row = s.get(CampaignRow, made.id)
        assert made == CampaignRecord.of(row) and made.commit_sha == SHA and made.world_sizes == [1, 2]
        assert campaigns.get_campaign(s, made.id) == made
        [(key, job)] = campaigns.campaign_jobs(s, made.id)
        assert key == "a@1" and isinstance(job, JobRecord) and job.suite == "s"
        moved = baselines.set_baseline(s, "main", commit=SHA, note="n")
        s.commit()
        assert isinstance(moved, BaselineRecord)
        assert (moved.commit, moved.job_id, moved.note) == (SHA, None, "n")
        assert baselines.get_baseline(s, "main") == moved and baselines.list_baselines(s) == [moved]
