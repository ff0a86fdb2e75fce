"""Cases a run of a job does not measure: those an earlier run of it finished, and those it
takes from another job that ran the same code.

A case is finished when its result is stored (every rank reported its end, so all its samples
are in). A re-run of an interrupted job takes those cases over instead of running them again:
their result, samples, summaries and reduced rows move to the new attempt (the rows readers
show), and a job event (data `kept`: case name -> attempt) says which attempt ran each kept case.

A job labelled `take_cases_from` (a job id) and `take_backends` (backend names, comma-separated)
copies the rows of its cases of those backends from that job instead (`take_cases`): the gate of
a backend's own repository sets them on its head job when the base job ran our reference
backends byte for byte as the head would (`service.domain.same_code`). The copies carry the
measuring job's id (`case_result.source_job_id`); a case the source cannot give (missing, not
passed, another setting) is measured, and a job event says why. The executor skips every
kept or taken case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, insert, literal, select, update
from sqlalchemy.orm import Session

from service.persistence.jobs import add_event, job_attempt
from service.persistence.models import (
    CaseResultRow,
    CaseRow,
    JobEventRow,
    JobRow,
    ReducedCaseRow,
    SampleRow,
    SummaryRow,
)
from workers.suite import Case

KEPT = "kept"  # the key of a resume's event data: case name -> the attempt that ran it
TAKEN = "taken"  # the key of a take's event data: case name -> the job that measured it
TAKE_FROM_LABEL = "take_cases_from"  # the job whose cases of `take_backends` a job copies
TAKE_BACKENDS_LABEL = "take_backends"
TAKEABLE_STATUSES = ("passed", "expected_error")  # a failed, errored or skipped case is measured again
_PER_CASE_ROWS = (CaseResultRow, SampleRow, SummaryRow, ReducedCaseRow)


def carry_finished_cases(session: Session, job_id: int, attempt: int) -> dict[str, int]:
    """Move the cases finished by runs before `attempt` to `attempt`; returns case name -> the
    attempt that produced it (empty for a first run or when no case had finished)."""
    r = CaseResultRow
    produced = dict(
        session.execute(
            select(r.case_id, func.max(r.attempt))
            .where(r.job_id == job_id, r.attempt < attempt)
            .group_by(r.case_id)
        ).all()
    )
    if not produced:
        return {}
    by_attempt: dict[int, list[int]] = {}
    for case_id, att in produced.items():
        by_attempt.setdefault(att, []).append(case_id)
    for att, case_ids in sorted(by_attempt.items()):
        for model in _PER_CASE_ROWS:
            session.execute(
                update(model)
                .where(model.job_id == job_id, model.attempt == att, model.case_id.in_(sorted(case_ids)))
                .values(attempt=attempt)
                .execution_options(synchronize_session=False)
            )
    named = select(CaseRow.id, CaseRow.name).where(CaseRow.id.in_(sorted(produced)))
    names = dict(session.execute(named).all())
    earlier = kept_before(session, job_id)  # a case kept once already names its real producer
    kept = {names[c]: earlier.get(names[c], att) for c, att in sorted(produced.items())}
    add_event(
        session, job_id, "log",
        f"attempt {attempt} keeps {len(kept)} case(s) finished by earlier attempts and skips them",
        {KEPT: kept},
    )
    return kept


def kept_before(session: Session, job_id: int) -> dict[str, int]:
    """What the job's latest earlier resume recorded: case name -> the attempt that ran it."""
    e = JobEventRow
    rows = session.scalars(select(e.data).where(e.job_id == job_id, e.kind == "log").order_by(e.id.desc()))
    for data in rows:
        if isinstance(data, dict) and isinstance(data.get(KEPT), dict):
            return {str(k): int(v) for k, v in data[KEPT].items()}
    return {}


def take_labels(source_job_id: int, backends: Sequence[str]) -> dict[str, str]:
    """The labels that make a job take its cases of `backends` from job `source_job_id`."""
    return {TAKE_FROM_LABEL: str(source_job_id), TAKE_BACKENDS_LABEL: ",".join(backends)}


def _take_request(labels: Mapping[str, Any] | None) -> tuple[int | None, list[str], str | None]:
    """(source job id, backends, why the labels cannot be followed) from a job's labels."""
    labels = labels or {}
    raw = labels.get(TAKE_FROM_LABEL)
    if raw is None:
        return None, [], None
    backends = [b for b in str(labels.get(TAKE_BACKENDS_LABEL) or "").split(",") if b]
    if not str(raw).isdigit() or not backends:
        return None, [], (f"labels {TAKE_FROM_LABEL}={raw!r} {TAKE_BACKENDS_LABEL}="
                          f"{labels.get(TAKE_BACKENDS_LABEL)!r}: expected a job id and backend names")
    return int(raw), backends, None


def _other_setting(source: JobRow | None, job: JobRow) -> str | None:
    """Why job `source` cannot give its cases to `job` as a whole, or None."""
    if source is None:
        return "it does not exist"
    if source.status != "succeeded":
        return f"it is {source.status}, not succeeded"
    mine = (job.suite, job.preset, dict(job.params or {}), job.device, job.world_size)
    theirs = (source.suite, source.preset, dict(source.params or {}), source.device, source.world_size)
    return None if mine == theirs else f"it ran another setting {theirs[:2]}, expected {mine[:2]}"


def take_cases(session: Session, job: JobRow, attempt: int, cases: Sequence[Case]) -> dict[str, int]:
    """Copy the rows of the cases of `job` (its matrix: `cases`) that its take labels name from
    the source job's latest run into run `attempt`, each marked with the job that measured it.
    Cases this run holds already (kept from an earlier run) are left as they are. Returns case
    name -> the measuring job for each taken case; the job's events say what was taken and why
    any named case is measured instead."""
    source_id, backends, bad = _take_request(job.labels)
    if source_id is None:
        if bad:
            add_event(session, job.id, "log", f"measures every case: {bad}")
        return {}
    r = CaseResultRow
    have = dict(session.execute(
        select(CaseRow.name, r.source_job_id).join(r, r.case_id == CaseRow.id)
        .where(r.job_id == job.id, r.attempt == attempt)).all())
    wanted = [c for c in cases if c.params.get("backend") in backends and c.name not in have]
    taken: dict[str, int] = {n: src for n, src in have.items() if src is not None}  # a retried start's
    if not wanted:
        return taken
    what = f"case(s) of {', '.join(backends)}"
    source = session.get(JobRow, source_id)
    why_not = _other_setting(source, job)
    if why_not is not None or source is None:
        add_event(session, job.id, "log", f"measures its {what} itself, not taken from job {source_id}: "
                                           f"{why_not}")
        return taken
    src_attempt = job_attempt(source)
    found = {name: r for name, r in session.execute(
        select(CaseRow.name, CaseResultRow).join(CaseResultRow, CaseResultRow.case_id == CaseRow.id)
        .where(CaseResultRow.job_id == source_id, CaseResultRow.attempt == src_attempt,
               CaseRow.name.in_([c.name for c in wanted]))).all()}
    measured: dict[str, str] = {}
    for case in wanted:
        r = found.get(case.name)
        if r is None:
            measured[case.name] = f"job {source_id} has no result for it"
        elif r.status not in TAKEABLE_STATUSES:
            measured[case.name] = f"{r.status} in job {source_id}"
        else:
            taken[case.name] = r.source_job_id or source_id
            _copy_case(session, source_id, src_attempt, job.id, attempt, r, taken[case.name])
    new = {n: src for n, src in taken.items() if n not in have}
    if new:
        add_event(session, job.id, "log",
                  f"takes {len(new)} {what} from job {source_id} (the same code, measured there; not "
                  f"run again): {', '.join(new)}", {TAKEN: new})
    if measured:
        why = "; ".join(f"{n}: {w}" for n, w in measured.items())
        add_event(session, job.id, "log", f"measures {len(measured)} {what} itself: {why}")
    return taken


def _copy_case(session: Session, source_id: int, src_attempt: int, job_id: int, attempt: int,
               result: CaseResultRow, measured_by: int) -> None:
    """One case's result, samples, summaries and reduced rows of the source's run, as this run's."""
    session.add(CaseResultRow(job_id=job_id, attempt=attempt, case_id=result.case_id, status=result.status,
                              error=result.error, source_job_id=measured_by))
    for model in (SampleRow, SummaryRow, ReducedCaseRow):
        cols = [c.name for c in model.__table__.columns if c.name not in ("id", "job_id", "attempt")]
        picked = select(*(model.__table__.c[c] for c in cols), literal(job_id), literal(attempt)).where(
            model.job_id == source_id, model.attempt == src_attempt, model.case_id == result.case_id)
        session.execute(insert(model).from_select([*cols, "job_id", "attempt"], picked))

