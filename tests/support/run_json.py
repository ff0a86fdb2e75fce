"""Store a `gdnval run --json` document (format gdnval-run/1) as a job, through the same sink
the dispatcher writes with (`service.dispatcher.StoreSink`): the report and page tests then read
a job that a real suite produced, without re-running it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from service.dispatcher import StoreSink
from service.persistence import commits, summaries
from service.persistence.db import write_tx
from service.persistence.models import JobRow
from workers.suite import Sample


def store_run(engine: Engine, path: Path, artifacts: Path, *, commit: str | None = None) -> int:
    """The run in `path` as a finished job of the store; returns its id."""
    doc: dict[str, Any] = json.loads(path.read_text())
    if doc.get("format") != "gdnval-run/1":
        raise ValueError(f"{path}: format {doc.get('format')!r}, expected 'gdnval-run/1'")
    with write_tx(engine) as s:
        row = commits.ensure_commit(s, commit or doc.get("commit"))
        job = JobRow(suite=doc["suite"], preset=doc["preset"], params=doc.get("overrides") or {},
                  device=doc["device"], world_size=doc["world_size"], status="running", attempts=1,
                  commit=row, info=doc.get("info") or {}, progress_total=len(doc["cases"]))
        s.add(job)
        s.flush()
        s.expunge(job)
    sink = StoreSink(engine, job, artifacts)
    nan = float("nan")
    sink.samples([Sample(x["case"], x["metric"], nan if x["value"] is None else x["value"], rank=x["rank"],
                         idx=x["idx"]) for x in doc["samples"]])
    for c in doc["cases"]:
        if c["status"] != "not run":
            sink.case_result(c["name"], c["status"], c.get("error"))
    summaries.finish_summary(engine, job.id, 1)
    with write_tx(engine) as s:
        s.get(JobRow, job.id).status = doc["status"]
    summaries.record_verdict(engine, job.id, ran=doc["status"] == "succeeded")
    return job.id
