"""A run outside the service (`gdnval run`) as a stored job, and back.

`RunDocument` is the `gdnval-run/1` document `gdnval run --json` writes. `store_run` keeps one
as a job of the store, in the service's own shape (job row, cases, case results, samples, then
each case's summary and reduced samples and the job's verdict, by the functions the dispatcher's
path uses), so the pages, compare, history and the gate read it like any job: `gdnval run`
stores its job this way, `POST /api/v1/runs` stores a pushed one, and `gdnval compare` of two
`--json` files stores them in a scratch store. `export_run` turns a stored job back into the
document that pushes it. A run is keyed by its `run_id`: pushing it twice stores it once.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, model_validator
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from service.persistence import cases as case_store
from service.persistence import queue
from service.persistence import samples as sample_store
from service.persistence.commits import ensure_commit
from service.persistence.compare_reads import metric_of
from service.persistence.db import write_tx
from service.persistence.jobs import add_event
from service.persistence.models import (
    CASE_STATUSES,
    CaseResultRow,
    CaseRow,
    JobEventRow,
    JobRow,
    MetricRow,
    SampleRow,
    utcnow,
)
from service.persistence.records import JobRecord
from service.persistence.summaries import finish_summary, record_verdict
from workers.backend_source import BACKEND_SOURCE_LABEL
from workers.registry import get_suite
from workers.suite import Case, Direction, Metric, MetricKind, UnknownSuiteInput

RUN_FORMAT = "gdnval-run/1"
ORIGIN_LABEL = "origin"  # a job stored from a run outside the service carries origin=gdnval run
RUN_ORIGIN = "gdnval run"
MAX_RUN_SAMPLES = 2_000_000


class RunCase(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=300)
    status: str = Field(description="a case status, or 'not run'")
    error: str | None = None
    expected_error: str | None = Field(None, max_length=200)
    params: dict[str, JsonValue] = Field(default_factory=dict)
    fingerprint: str = Field(min_length=1, max_length=64)


class RunSample(BaseModel):
    model_config = ConfigDict(extra="ignore")

    case: str
    metric: str = Field(min_length=1, max_length=200)
    rank: int = Field(ge=0)
    idx: int = Field(ge=0, lt=2**31)
    value: float | None = Field(description="null: not finite (the document's `nonfinite` names it)")


class RunMetric(BaseModel):
    """A metric definition of the run's own code (`info.metrics`, as `workers.suite.Metric`)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=200)
    unit: str = Field("", max_length=50)
    kind: MetricKind
    direction: Direction = "lower"
    bound: float | None = None
    description: str = ""
    min_effect: float | None = Field(None, gt=0)
    repeated: bool = True

    def metric(self) -> Metric:
        return Metric(**self.model_dump())


class RunDocument(BaseModel):
    """What a run measured and how it ended (the fields `gdnval run --json` writes; the derived
    ones, summary and case counts, are recomputed when stored)."""

    model_config = ConfigDict(extra="ignore")

    format: Literal["gdnval-run/1"]
    run_id: str = Field("", max_length=64, pattern=r"^[0-9A-Za-z_.:-]*$",
                        description="the run's own id: a run pushed twice is stored once (empty: not keyed)")
    suite: str = Field(min_length=1, max_length=100)
    preset: str = Field(min_length=1, max_length=50)
    overrides: dict[str, JsonValue] = Field(default_factory=dict)
    device: Literal["cuda", "npu", "cpu"]
    world_size: int = Field(ge=1, le=4096)
    commit: str | None = Field(None, max_length=255, description="the commit of our code the ranks ran")
    snapshot: bool = Field(False, description="the ranks ran `commit`'s snapshot (else the installed code)")
    backend_source: str | None = Field(None, max_length=1000)
    status: Literal["succeeded", "failed", "cancelled"]
    error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    info: dict[str, JsonValue] = Field(default_factory=dict)
    cases: list[RunCase]
    samples: list[RunSample] = Field(max_length=MAX_RUN_SAMPLES)
    logs: list[str] = Field(default_factory=list)

    def definitions(self) -> list[Metric]:
        """The run's own metric definitions (`info.metrics`; checked when the document is)."""
        return [m.metric() for m in _DEFINITIONS.validate_python(self.info.get("metrics") or [])]

    @model_validator(mode="after")
    def _consistent(self) -> RunDocument:
        try:
            get_suite(self.suite)
        except UnknownSuiteInput as exc:
            raise ValueError(str(exc)) from exc
        names = {c.name for c in self.cases}
        if len(names) != len(self.cases):
            raise ValueError(f"run {self.run_id or '(no id)'}: a case name is listed twice")
        bad = [c.status for c in self.cases if c.status not in (*CASE_STATUSES, "not run")]
        if bad:
            raise ValueError(f"case status {bad[0]!r}; expected one of {[*CASE_STATUSES, 'not run']}")
        self.definitions()  # raises naming a malformed definition
        stray = sorted({s.case for s in self.samples} - names)
        if stray:
            raise ValueError(f"samples of case(s) {stray[:5]} that the document does not list")
        for c in self.cases:
            case = Case(self.suite, c.name, c.params, c.expected_error)
            fp = case.fingerprint(self.device, self.world_size)
            if fp != c.fingerprint:
                raise ValueError(f"case {c.name!r}: fingerprint {c.fingerprint!r} is not its parameters' "
                                 f"({fp!r}); the document was edited or comes from another definition")
        return self


_DEFINITIONS = TypeAdapter(list[RunMetric])


def store_run(engine: Engine, doc: RunDocument) -> tuple[JobRecord, bool]:
    """Store `doc` as a job (the one already stored under its run id, unchanged, when there is
    one); returns (the job, whether it was stored now). The job is inserted running, owned by
    this process, and ends with the document's status once everything is in, so a store that
    fails half-way leaves a job the service's orphan rule settles, never one that looks done."""
    owner = queue.dispatcher_id()
    key = f"run:{doc.run_id}" if doc.run_id else None
    with write_tx(engine) as s:
        if key is not None:
            known = s.scalars(select(JobRow).where(JobRow.idempotency_key == key)).first()
            if known is not None:
                return JobRecord.of(known), False
        job_id = _insert_job(s, doc, key, owner)
    suite = get_suite(doc.suite)
    defined = doc.definitions()
    with write_tx(engine) as s:
        metric_ids = sample_store.ensure_metrics(s, suite.name, suite.metrics)
        metric_ids.update(sample_store.ensure_metrics(s, suite.name, defined))  # the run's own definitions
        cases = [Case(doc.suite, c.name, c.params, c.expected_error) for c in doc.cases]
        case_ids = case_store.ensure_cases(s, cases, doc.device, doc.world_size)
        for name in sorted({x.metric for x in doc.samples} - set(metric_ids)):
            row = MetricRow(suite=suite.name, name=name)
            s.add(row)
            s.flush()
            metric_ids[name] = row.id
            add_event(s, job_id, "log", f"metric {name!r} is not declared by the suite; stored anyway")
        for c in doc.cases:
            if c.status in CASE_STATUSES:
                case_store.set_case_result(s, job_id, case_ids[c.name], c.status, c.error, attempt=1)
        for line in doc.logs:
            add_event(s, job_id, "log", line[:10_000])
    rows = [(job_id, 1, case_ids[x.case], metric_ids[x.metric], x.rank, x.idx,
             math.nan if x.value is None else x.value) for x in doc.samples]
    sample_store.insert_sample_rows(engine, rows)
    finish_summary(engine, job_id, 1)
    record_verdict(engine, job_id, ran=doc.status == "succeeded")
    queue.finish(engine, job_id, owner, doc.status, doc.error)
    with Session(engine) as s:
        job = s.get(JobRow, job_id)
        assert job is not None  # inserted above; nothing deletes jobs
        return JobRecord.of(job), True


def _insert_job(s: Session, doc: RunDocument, key: str | None, owner: str) -> int:
    labels = {ORIGIN_LABEL: RUN_ORIGIN}
    if doc.backend_source:
        labels[BACKEND_SOURCE_LABEL] = doc.backend_source
    info = {k: v for k, v in doc.info.items() if k != "metrics"}
    now = utcnow()
    job = JobRow(
        backend_commit=queue.label_backend_commit(labels) or _provenance_commit(info, doc.backend_source),
        suite=doc.suite, preset=doc.preset, params=dict(doc.overrides),
        commit=ensure_commit(s, doc.commit) if doc.snapshot else None,
        device=doc.device, world_size=doc.world_size, labels=labels, idempotency_key=key,
        status="running", claimed_by=owner, attempts=1, heartbeat_at=now,
        started_at=doc.started_at or now, info=info,
        progress_done=sum(c.status != "not run" for c in doc.cases), progress_total=len(doc.cases),
    )
    s.add(job)
    s.flush()
    add_event(s, job.id, "status", "running", {"owner": owner, "origin": RUN_ORIGIN})
    return int(job.id)


def _provenance_commit(info: dict[str, Any], backend_source: str | None) -> str | None:
    """A backend source named by a branch or tag: the commit its ranks installed (provenance)."""
    if not backend_source:
        return None
    for b in info.get("backends") or ():
        if isinstance(b, dict) and b.get("distribution") not in (None, "gdnval") and b.get("commit"):
            return str(b["commit"])[:255]
    return None


def export_run(session: Session, job_id: int) -> dict[str, Any] | None:
    """The `gdnval-run/1` document of stored job `job_id` (its latest run: cases, results, raw
    samples, logs, and the metric definitions of its samples), None when there is no such job. A
    job stored from a run keeps its run id; any other gets `job-<id>`."""
    job = session.get(JobRow, job_id)
    if job is None:
        return None
    attempt = max(1, job.attempts or 0)
    results = {r.case_id: r for r in session.scalars(
        select(CaseResultRow).where(CaseResultRow.job_id == job_id, CaseResultRow.attempt == attempt))}
    rows = session.execute(
        select(SampleRow.case_id, SampleRow.metric_id, SampleRow.rank, SampleRow.idx, SampleRow.value)
        .where(SampleRow.job_id == job_id, SampleRow.attempt == attempt)
        .order_by(SampleRow.id)
    ).all()
    case_rows = {c.id: c for c in session.scalars(
        select(CaseRow).where(CaseRow.id.in_({r[0] for r in rows} | set(results))))}
    metrics = {m.id: m for m in session.scalars(
        select(MetricRow).where(MetricRow.id.in_({r[1] for r in rows})))}
    suite = get_suite(job.suite)
    matrix = [Case(c.suite, c.name, dict(c.params), c.expected_error)
              for c in suite.cases(suite.resolve_params(job.preset, job.params, device=job.device))]
    listed = {c.name: c for c in matrix}
    for row in case_rows.values():  # a case the matrix no longer names keeps its stored identity
        listed.setdefault(row.name, Case(job.suite, row.name, dict(row.params), row.expected_error))
    status = {case_rows[cid].name: r for cid, r in results.items()}
    cases = [{"name": c.name, "status": status[c.name].status if c.name in status else "not run",
              "error": status[c.name].error if c.name in status else None,
              "expected_error": c.expected_error, "params": dict(c.params),
              "fingerprint": c.fingerprint(job.device, job.world_size)} for c in listed.values()]
    logs = session.scalars(select(JobEventRow.message).where(JobEventRow.job_id == job_id,
                                                             JobEventRow.kind == "log")
                           .order_by(JobEventRow.id)).all()
    key = job.idempotency_key or ""
    return {
        "format": RUN_FORMAT, "run_id": key[4:] if key.startswith("run:") else f"job-{job.id}",
        "suite": job.suite, "preset": job.preset, "overrides": dict(job.params or {}), "device": job.device,
        "world_size": job.world_size, "commit": job.commit_sha or (job.info or {}).get("commit"),
        "snapshot": job.commit_sha is not None, "backend_source": queue.job_backend_source(job),
        "status": job.status, "error": job.error,
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "info": {**(job.info or {}), "metrics": [metric_of(m).to_dict() for m in metrics.values()]},
        "cases": cases,
        "samples": [{"case": case_rows[c].name, "metric": metrics[m].name, "rank": r, "idx": i,
                     "value": v if v is not None and math.isfinite(v) else None} for c, m, r, i, v in rows],
        "logs": list(logs),
    }
