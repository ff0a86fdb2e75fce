"""Reduced cases: the rank-reduced samples a case leaves when it ends, which compare reads instead
of reducing every sample again. One rule: a job's reduced rows, its samples reduced in SQL (a job
stored before those existed) and any mix of the two give the same arrays and the same comparison."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from service.dispatcher import StoreSink
from service.domain.baselines import compare_jobs
from service.persistence import db
from service.persistence import reduced_cases as reduced_store
from service.persistence.compare_reads import reduced_rows
from service.persistence.models import CaseRow, JobRow, MetricRow, ReducedCaseRow
from service.persistence.samples import ReducedRows, higher_metric_ids, worst_rank_rows
from tests.support.api_support import FAKE
from tests.support.paths import RESULTS
from tests.support.run_json import store_run
from workers.suite import Sample

QUICK = RESULTS / "cp_layer_quick_cpu_w2.json"
COLUMNS = ("case_id", "metric_id", "idx", "ranks", "value")


def assert_same_rows(a: ReducedRows, b: ReducedRows) -> None:
    for col in COLUMNS:
        x, y = getattr(a, col), getattr(b, col)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=col == "value"), col


def from_samples(session: Session, job: JobRow) -> ReducedRows:
    """The job's run reduced from its samples in SQL only (what a job without reduced rows reads)."""
    higher = higher_metric_ids(session, job.suite)
    return worst_rank_rows(session, job.id, 1, higher, job.world_size)


def drop_reduced_of(engine, job_id: int, case_ids: list[int] | None = None) -> None:
    with db.write_tx(engine) as s:
        q = delete(ReducedCaseRow).where(ReducedCaseRow.job_id == job_id)
        s.execute(q if case_ids is None else q.where(ReducedCaseRow.case_id.in_(case_ids)))


def _running_job(engine) -> JobRow:
    with Session(engine, expire_on_commit=False) as s, s.begin():
        job = JobRow(suite=FAKE, preset="quick", params={"cases": 2}, device="cpu", world_size=2,
                     status="running", attempts=1)
        s.add(job)
    return job


def test_a_stored_cp_job_loads_the_same_reduced_from_samples_or_mixed(engine, tmp_path: Path) -> None:
    """A real cp-layer run (two CPU ranks, the quick preset) stored through the dispatcher's sink."""
    doc = json.loads(QUICK.read_text())
    base = store_run(engine, QUICK)
    head = store_run(engine, QUICK, commit="b" * 40)
    with Session(engine) as s:
        job = s.get(JobRow, base)
        count = select(func.count()).select_from(ReducedCaseRow).where(ReducedCaseRow.job_id == base)
        # one per case with samples, written as it ended (a case skipped as not applicable has none)
        assert s.scalar(count) == doc["case_counts"]["passed"] == len(doc["cases"]) - 1
        reduced = reduced_store.read_reduced(s, base, 1)
        sql = from_samples(s, job)
        names = {m.id: (m.name, m.direction) for m in s.scalars(select(MetricRow))}
        cases = {c: name for c, name in s.execute(select(CaseRow.id, CaseRow.name))}
        before = compare_jobs(s, base, head).to_dict()
    assert_same_rows(reduced, sql)
    # and both are the raw samples' worst rank per idx (max, or min for higher-is-better)
    expected: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for x in doc["samples"]:
        expected[(x["case"], x["metric"], x["idx"])].append(x["value"])
    got = {(cases[c], names[m][0], i): (v, n) for c, m, i, n, v in
           zip(*(getattr(reduced, col).tolist() for col in COLUMNS), strict=True)}
    worst_of = {name: min if d == "higher" else max for name, d in names.values()}
    assert got == {k: (worst_of[k[1]](v), len(v)) for k, v in expected.items()}

    some = sorted(set(reduced.case_id.tolist()))[::3]
    drop_reduced_of(engine, base, some)  # cases left without reduced rows (e.g. still running)
    drop_reduced_of(engine, head)  # a job stored before reduced cases existed
    with Session(engine) as s:
        assert_same_rows(reduced_rows(s, s.get(JobRow, base), 1), sql)
        assert_same_rows(reduced_rows(s, s.get(JobRow, head), 1), from_samples(s, s.get(JobRow, head)))
        assert compare_jobs(s, base, head).to_dict() == before


def test_samples_after_a_case_end_drop_its_reduced_rows(engine, tmp_path: Path) -> None:
    """A late sample (and NaN on one rank) reaches compare, not the stale reduced row."""
    job = _running_job(engine)
    sink = StoreSink(engine, job, tmp_path / "artifacts")
    late = [Sample("c0", "time_ms", 1.0 + i + r, rank=r, idx=i) for i in range(5) for r in range(2)]
    sink.samples(late)
    sink.case_result("c0", "passed")
    c0 = sink.case_ids["c0"]
    with Session(engine) as s:
        first = reduced_store.read_reduced(s, job.id, 1)
    assert first.value.tolist() == [2.0, 3.0, 4.0, 5.0, 6.0] and set(first.case_id.tolist()) == {c0}
    sink.samples([Sample("c0", "time_ms", float("nan"), rank=1, idx=7), Sample("c0", "time_ms", 9.0, idx=7)])
    with Session(engine) as s:
        assert not len(reduced_store.read_reduced(s, job.id, 1))  # reopened: read from the samples
        live = reduced_rows(s, s.get(JobRow, job.id), 1)
    assert live.idx.tolist() == [0, 1, 2, 3, 4, 7] and np.isnan(live.value[-1])
    sink.case_result("c0", "passed")
    with Session(engine) as s:
        again = reduced_store.read_reduced(s, job.id, 1)
        assert_same_rows(again, live)
        assert_same_rows(again, from_samples(s, s.get(JobRow, job.id)))


@pytest.mark.stores("sqlite")
def test_a_reduced_row_of_the_wrong_size_is_an_error_naming_it(engine, tmp_path: Path) -> None:
    job = _running_job(engine)
    sink = StoreSink(engine, job, tmp_path / "artifacts")
    sink.samples([Sample("c1", "time_ms", 1.0 + i, rank=r, idx=i) for i in range(3) for r in range(2)])
    sink.case_result("c1", "passed")
    with db.write_tx(engine) as s:
        row = s.scalars(select(ReducedCaseRow).where(ReducedCaseRow.job_id == job.id)).one()
        row.data = row.data[:-1]
    bad = f"case {sink.case_ids['c1']} of job {job.id} run 1 holds"
    with Session(engine) as s, pytest.raises(ValueError, match=bad):
        reduced_store.read_reduced(s, job.id, 1)
