"""The job page's first facts: where a run was placed sits beside the device it ran on."""

from __future__ import annotations

from datetime import UTC, datetime

from service.persistence.models import JobRow
from service.web.routes.job import _job_facts


def test_placement_and_distinct_nodes_are_shown_with_the_device() -> None:
    job = JobRow(id=7, suite="cp-layer", preset="quick", device="cuda", world_size=4, status="succeeded",
                 info={"device_name": "NVIDIA H200", "placement": "STRICT_SPREAD", "distinct_nodes": 4,
                       "python": "3.11.7", "snapshot": {"commit": "abc"}})
    facts = _job_facts(job, datetime.now(UTC))
    assert facts["info_items"] == [("device_name", "NVIDIA H200"), ("placement", "STRICT_SPREAD"),
                                   ("distinct_nodes", "4"), ("python", "3.11.7")]
    assert facts["info_more"] == [("snapshot", '{"commit": "abc"}')]
