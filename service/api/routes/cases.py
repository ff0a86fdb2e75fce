"""`/api/v1/jobs/{id}/cases` and `/samples`: a job's cases with their summaries, and its raw
samples (JSON pages, or streamed CSV / NDJSON)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from service.api.deps import (
    Cursor,
    EngineDep,
    JobId,
    SessionDep,
    cursor_value,
    job_or_404,
    require_read,
)
from service.api.input_rule import INT8_MAX
from service.api.schemas import (
    CaseOut,
    MetricSummaryOut,
    Page,
    SampleOut,
)
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_read)])


@router.get("/jobs/{job_id}/cases", response_model=Page[CaseOut])
def job_cases(job_id: JobId, session: SessionDep) -> Page[CaseOut]:
    """Every case with its result and per-metric summary (worst rank first, then statistics)."""
    job_or_404(session, job_id)
    out = [
        CaseOut(
            case_id=c.case_id,
            name=c.name,
            fingerprint=c.fingerprint,
            params=c.params,
            status=c.status,
            error=c.error,
            expected_error=c.expected_error,
            source_job_id=c.source_job_id,
            metrics={
                k: MetricSummaryOut.model_validate(m, from_attributes=True) for k, m in c.metrics.items()
            },
        )
        for c in summary_store.case_summaries(session, job_id)
    ]
    return Page[CaseOut](items=out, next=None)


def _fmt(v: float) -> str:
    return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))


@router.get(
    "/jobs/{job_id}/samples",
    response_model=Page[SampleOut],
    responses={200: {"content": {"text/csv": {}, "application/x-ndjson": {}}}},
)
def job_samples(
    job_id: JobId,
    session: SessionDep,
    engine: EngineDep,
    case: Annotated[str | None, Query(max_length=300)] = None,
    metric: Annotated[str | None, Query(max_length=200)] = None,
    rank: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
    attempt: Annotated[int | None, Query(ge=1, le=1000)] = None,
    format: Literal["json", "csv", "ndjson"] = "json",
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    cursor: Cursor = None,
) -> Any:
    """Raw samples. `json` is paginated; `csv` and `ndjson` stream every matching sample."""
    job_or_404(session, job_id)
    if format == "json":
        rows, nxt = sample_store.list_samples(
            session, job_id, case=case, metric=metric, rank=rank, attempt=attempt,
            after_id=cursor_value(cursor, maximum=INT8_MAX) or 0, limit=limit,
        )
        return Page[SampleOut](
            items=[SampleOut.model_validate(r, from_attributes=True) for r in rows],
            next=None if nxt is None else str(nxt),
        )
    chunks = sample_store.iter_samples(
        engine, job_id, case=case, metric=metric, rank=rank, attempt=attempt
    )
    fields = ("id", "attempt", "case", "fingerprint", "metric", "rank", "idx", "value")

    def csv_lines() -> Iterator[str]:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(fields)
        for chunk in chunks:
            for r in chunk:
                writer.writerow(
                    (r.id, r.attempt, r.case, r.fingerprint, r.metric, r.rank, r.idx, _fmt(r.value))
                )
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
        yield buf.getvalue()

    def ndjson_lines() -> Iterator[str]:
        for chunk in chunks:
            yield "".join(
                json.dumps({
                    "id": r.id, "attempt": r.attempt, "case": r.case, "fingerprint": r.fingerprint,
                    "metric": r.metric, "rank": r.rank, "idx": r.idx,
                    "value": r.value if math.isfinite(r.value) else None,
                }) + "\n"
                for r in chunk
            )

    name = f"job-{job_id}-samples.{format}"
    headers = {"Content-Disposition": f'attachment; filename="{name}"'}
    if format == "csv":
        return StreamingResponse(csv_lines(), media_type="text/csv; charset=utf-8", headers=headers)
    return StreamingResponse(ndjson_lines(), media_type="application/x-ndjson", headers=headers)
