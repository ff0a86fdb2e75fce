"""A backend gate whose head and base differ only in the backend's commit: the head's job takes
the base job's `eager` cases (our code, byte-identical on both sides) instead of measuring them.

Through the CLI (`gdnval gate --backend-repo REPO --head C --base C`, the command of
docs/howto-backend.md) against a real server (SQLite, the local executor) on the real commits of
the backend-gate repository and store (tests/support/backend_repo.py, shared with
tests/e2e/test_backend_gate.py; plain-torch `extgdn`: c1 chunk 4, c7 chunk 64 (c2's code with a
comment: a head job of these tests' own), c3 = c2 with 1.5x the work, c4 = c2 with its output
x (1 + 2e-3), c6 = c4 with a comment). gdn-op only: its eager case is the one that is taken.

- the head job measured no eager case: the executor's per-case progress names none, its eager
  case result names the base job as the job that measured it, and its samples are the base's;
- the verdicts are those of measuring again: c7 against c1 passes with and without taking
  (`--fresh` measures both anew), c3 against c7 fails on the backend's time, c4 against c7 fails
  on `o_rel_l2` beyond ten times eager's error, the reason naming the job that measured eager;
- a base job without its eager case: the head measures it, and its log says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.support.backend_repo import BACKEND, CASE, gate, serve_backend_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]
EAGER = CASE.replace(BACKEND, "eager")


@pytest.fixture(scope="module")
def server(backend_store: SimpleNamespace) -> Iterator[SimpleNamespace]:
    with serve_backend_store(backend_store) as served:
        yield served


def fresh_gate(server: SimpleNamespace, head: str, base: str) -> SimpleNamespace:
    """`gdnval gate --backend-repo REPO --head H --base B --suite gdn-op --fresh`: both measured anew."""
    return gate(server, head, base, "gdn-op", fresh=True)


def job_of(g: SimpleNamespace, role: str) -> int:
    return next(j["job_id"] for j in g.gate["jobs"] if j["role"] == role and j["suite"] == "gdn-op")


def cases(server: SimpleNamespace, job_id: int) -> dict[str, dict[str, Any]]:
    items = httpx.get(f"{server.url}/api/v1/jobs/{job_id}/cases", timeout=60).json()["items"]
    return {c["name"]: c for c in items}


def events(server: SimpleNamespace, job_id: int, kind: str) -> list[dict[str, Any]]:
    url = f"{server.url}/api/v1/jobs/{job_id}/events"
    return httpx.get(url, params={"kind": kind, "limit": 1000}, timeout=60).json()["items"]


def ran(server: SimpleNamespace, job_id: int) -> set[str]:
    """The cases the job's ranks ran: the executor reports each one's end as progress 'case: ...'."""
    return {e["message"].split(":")[0] for e in events(server, job_id, "progress") if ": " in e["message"]}


def run_s(server: SimpleNamespace, job_id: int) -> float:
    """Seconds from the job's start to its end."""
    from datetime import datetime

    job = httpx.get(f"{server.url}/api/v1/jobs/{job_id}", timeout=60).json()
    ended, started = datetime.fromisoformat(job["finished_at"]), datetime.fromisoformat(job["started_at"])
    return (ended - started).total_seconds()


def samples(server: SimpleNamespace, job_id: int, case: str) -> list[tuple[str, int, int, float]]:
    url = f"{server.url}/api/v1/jobs/{job_id}/samples"
    rows = httpx.get(url, params={"case": case, "limit": 10000}, timeout=60).json()["items"]
    return sorted((r["metric"], r["rank"], r["idx"], r["value"]) for r in rows)


def test_the_head_takes_eager_from_the_base_and_the_verdicts_stand(server: SimpleNamespace) -> None:
    shas, walls = server.shas, {}
    faster = gate(server, shas["c7"], shas["c1"], "gdn-op")
    walls["c7 vs c1, eager taken"] = faster.wall
    assert faster.code == 0, faster.stdout
    head, base = job_of(faster, "head"), job_of(faster, "base")
    assert ran(server, base) == {EAGER, CASE}
    assert ran(server, head) == {CASE}, events(server, head, "progress")  # the eager case never ran here
    mine = cases(server, head)
    assert mine[EAGER]["source_job_id"] == base and mine[EAGER]["status"] == "passed"
    assert mine[CASE]["source_job_id"] is None
    assert samples(server, head, EAGER) == samples(server, base, EAGER) != []  # the base's, copied
    took = [e for e in events(server, head, "log") if e["data"] and "taken" in e["data"]]
    assert took and took[0]["data"]["taken"] == {EAGER: base}, events(server, head, "log")
    assert f"reference cases taken from job #{base}" in faster.stdout
    page = httpx.get(f"{server.url}/jobs/{head}", timeout=60).text
    assert f'data-taken-from="{base}"' in page and f"measured by job {base}" in page

    slower = gate(server, shas["c3"], shas["c7"], "gdn-op")  # c7's job is the base: eager from c1's
    walls["c3 vs c7, eager taken"] = slower.wall
    assert slower.code == 1, slower.stdout
    assert any(f["case"] == CASE and f["metric"] in ("fwd_rel", "fwd_bwd_rel")
               for f in slower.gate["findings"] if f["change"] == "regression"), slower.stdout
    assert job_of(slower, "base") == head
    assert cases(server, job_of(slower, "head"))[EAGER]["source_job_id"] == base  # who measured it

    scaled = gate(server, shas["c4"], shas["c7"], "gdn-op")
    assert scaled.code == 1, scaled.stdout
    worsened = {(f["case"], f["metric"]): f for f in scaled.gate["findings"] if f["verdict"] == "worsened"}
    reason = worsened[(CASE, "o_rel_l2")]["reason"]  # judged against eager's error, taken from c1's job
    assert "eager reference" in reason and f"measured by job {base}" in reason, reason

    again = fresh_gate(server, shas["c7"], shas["c1"])  # the same gate measuring both sides anew
    walls["c7 vs c1 --fresh, eager measured twice"] = again.wall
    assert again.code == 0, again.stdout
    fresh_head = job_of(again, "head")  # the gate's own head job (a round's jobs have roles of their own)
    assert not next(j for j in again.gate["jobs"] if j["role"] == "head")["reused"]
    assert ran(server, fresh_head) == {EAGER, CASE}  # --fresh: nothing taken
    assert cases(server, fresh_head)[EAGER]["source_job_id"] is None
    runs = {"c7's job, eager taken": run_s(server, head),
            "c7's job, eager measured": run_s(server, fresh_head)}

    again_slower = fresh_gate(server, shas["c3"], shas["c7"])
    assert again_slower.code == 1, again_slower.stdout  # the same verdict as with eager taken
    print("gate wall times (s):", {k: round(v, 1) for k, v in walls.items()})
    print("head job run times (s):", {k: round(v, 1) for k, v in runs.items()})


def test_a_base_without_its_eager_case_has_the_head_measure_it_saying_why(server: SimpleNamespace) -> None:
    from sqlalchemy import create_engine, text

    shas = server.shas
    first = gate(server, shas["c7"], shas["c1"], "gdn-op")  # c7's job (from the test above, or now)
    assert first.code == 0, first.stdout
    listed = httpx.get(f"{server.url}/api/v1/jobs", params={"commit": shas["c7"][:12], "suite": "gdn-op"},
                       timeout=60).json()["items"]
    c7_jobs = ",".join(str(j["id"]) for j in listed)
    engine = create_engine(f"sqlite:///{server.db}")
    with engine.begin() as con:  # the base's eager case lost from the store
        case_id = con.execute(text("SELECT id FROM \"case\" WHERE name = :n"), {"n": EAGER}).scalar_one()
        for table in ("case_result", "sample", "summary", "reduced_case"):
            lost = f"DELETE FROM {table} WHERE case_id = :c AND job_id IN ({c7_jobs})"
            con.execute(text(lost), {"c": case_id})
    engine.dispose()

    scaled = gate(server, shas["c6"], shas["c7"], "gdn-op")
    assert scaled.code == 1, scaled.stdout
    head, base = job_of(scaled, "head"), job_of(scaled, "base")
    assert ran(server, head) == {EAGER, CASE}  # measured here
    assert cases(server, head)[EAGER]["source_job_id"] is None
    said = [e["message"] for e in events(server, head, "log")]
    assert f"measures 1 case(s) of eager itself: {EAGER}: job {base} has no result for it" in said, said
    worsened = {(f["case"], f["metric"]): f for f in scaled.gate["findings"] if f["verdict"] == "worsened"}
    reason = worsened[(CASE, "o_rel_l2")]["reason"]
    assert "eager reference" in reason and "measured by job" not in reason, reason

