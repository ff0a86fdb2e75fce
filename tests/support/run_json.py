"""Store a `gdnval run --json` document (format gdnval-run/1) as a job, the way `gdnval run`
keeps its runs (`service.persistence.runs.store_run`): the report and page tests then read a job
that a real suite produced, without re-running it. Unkeyed, so one document can be stored twice
(a base and a head)."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import Engine

from service.persistence.runs import RunDocument
from service.persistence.runs import store_run as store_document


def store_run(engine: Engine, path: Path, *, commit: str | None = None) -> int:
    """The run in `path` as a finished job of the store, at `commit` (else the run's own) as
    the commit of our code it ran; returns its id."""
    doc = RunDocument.model_validate(json.loads(path.read_text()))
    doc = doc.model_copy(update={"run_id": "", "snapshot": True, "commit": commit or doc.commit})
    job, _ = store_document(engine, doc)
    return job.id
