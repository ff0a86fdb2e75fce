"""Campaigns in the store (both stores) and through the API: created with all their jobs in one
transaction, idempotent, their status and verdict read from their jobs; refusals are problems."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, update
from sqlalchemy.orm import Session

from service.app import create_app
from service.domain.campaigns import campaign_request, campaign_state, compare_campaigns
from service.persistence import campaigns as store
from service.persistence.models import JobRow
from service.persistence.queue import JobConflict
from service.settings import Settings
from workers.backend_source import BACKEND_SOURCE_LABEL
from workers.plans import load_plan

BODY: dict[str, Any] = {"plan": "pr-report-cpu", "device": "cpu", "world_sizes": [4, 8]}


def _set_jobs(engine: Any, ids: list[int], status: str, verdict: str | None) -> None:
    with Session(engine) as s, s.begin():
        s.execute(update(JobRow).where(JobRow.id.in_(ids)).values(status=status, verdict=verdict))


def test_campaign_is_stored_with_its_queued_jobs_and_state_from_them(engine: Any) -> None:
    req = campaign_request({**BODY, "idempotency_key": "k1"}, None)
    row, created = store.create_campaign(engine, req)
    assert created
    again, created_again = store.create_campaign(engine, req)
    assert not created_again and again.id == row.id
    with pytest.raises(JobConflict, match="already names campaign"):
        other = campaign_request({**BODY, "world_sizes": [4], "idempotency_key": "k1"}, None)
        store.create_campaign(engine, other)
    with Session(engine) as s:
        got = store.get_campaign(s, row.id)
        assert got is not None and got.plan_name == "pr-report-cpu" and got.world_sizes == [4, 8]
        assert got.plan["version"] == got.plan_version == load_plan("pr-report-cpu").version
        jobs = store.campaign_jobs(s, row.id)
        assert [k for k, _ in jobs] == [k for k, _ in req.jobs]
        assert {j.status for _, j in jobs} == {"queued"}
        # the jobs are ordinary queued jobs, one per key, and nothing else was queued
        assert len(s.scalars(select(JobRow)).all()) == len(jobs) == 12
        state = campaign_state([j for _, j in jobs])
        assert (state.status, state.verdict, state.done, state.total) == ("queued", None, 0, 12)
        ids = [j.id for _, j in jobs]
    _set_jobs(engine, ids[:3], "succeeded", "passed")
    _set_jobs(engine, ids[3:4], "running", None)
    with Session(engine) as s:
        state = campaign_state([j for _, j in store.campaign_jobs(s, row.id)])
        assert (state.status, state.verdict, state.done) == ("running", None, 3)
        assert state.jobs == {"succeeded": 3, "running": 1, "queued": 8}
    _set_jobs(engine, ids, "succeeded", "passed")
    with Session(engine) as s:
        state = campaign_state([j for _, j in store.campaign_jobs(s, row.id)])
        assert (state.status, state.verdict) == ("succeeded", "passed")
    _set_jobs(engine, ids[5:6], "succeeded", "failed")
    _set_jobs(engine, ids[6:7], "failed", "errored")
    with Session(engine) as s:
        state = campaign_state([j for _, j in store.campaign_jobs(s, row.id)])
        assert (state.status, state.verdict) == ("failed", "failed")
        assert state.verdicts == {"passed": 10, "failed": 1, "errored": 1}


def test_list_campaigns_pages_newest_first(engine: Any) -> None:
    made = [store.create_campaign(engine, campaign_request({**BODY, "world_sizes": [n]}, None))[0].id
            for n in (4, 8, 4)]
    with Session(engine) as s:
        first, nxt = store.list_campaigns(s, limit=2)
        assert [c.id for c in first] == made[::-1][:2] and nxt == made[1]
        rest, end = store.list_campaigns(s, before_id=nxt, limit=2)
        assert [c.id for c in rest] == [made[0]] and end is None
        assert store.list_campaigns(s, plan="pr-report")[0] == []
        by = store.jobs_of_campaigns(s, made)
        assert [len(by[c]) for c in made] == [7, 7, 7]  # two fixed jobs + five entries at one size


def test_compare_campaigns_matches_jobs_by_plan_key(engine: Any) -> None:
    a = store.create_campaign(engine, campaign_request({**BODY, "world_sizes": [4]}, None))[0]
    b = store.create_campaign(engine, campaign_request(BODY, None))[0]
    with Session(engine) as s:
        # jobs without samples compare to empty comparisons; the pairing is what is checked
        cmp = compare_campaigns(s, a.id, b.id)
        assert [k for k, *_ in cmp.pairs] == [k for k, _ in store.campaign_jobs(s, a.id)]
        assert cmp.only_base == [] and len(cmp.only_head) == 5
        assert all(k.endswith("@8") for k in cmp.only_head)
        with pytest.raises(LookupError, match="no campaign 999"):
            compare_campaigns(s, a.id, 999)


@pytest.fixture
def client(db_url: str) -> Any:
    settings = Settings(db_url=db_url, dispatch=False, executor="local", api_token="tok")
    with TestClient(create_app(settings)) as c:
        yield c


AUTH = {"Authorization": "Bearer tok"}


@pytest.mark.stores("sqlite")
def test_api_refuses_what_no_campaign_can_run(client: TestClient) -> None:
    def problem(body: dict[str, Any]) -> str:
        r = client.post("/api/v1/campaigns", json=body, headers=AUTH)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        return str(r.json()["detail"])

    plans = "expected one of ['pr-report', 'pr-report-1gpu', 'pr-report-cpu']"
    assert plans in problem({**BODY, "plan": "nope"})
    assert "runs on ['cuda', 'npu'], not on device 'cpu'" in problem({**BODY, "plan": "pr-report"})
    assert "not for 2" in problem({**BODY, "world_sizes": [2]})
    assert "bad backend name" in problem({**BODY, "backends": ["no spaces!"]})
    assert "extra" in problem({**BODY, "plan_name": "x"}).lower()
    assert "without backends" in problem({**BODY, "backend_source": "git+/srv/repo@main"})
    assert "neither 'git+<repository>@<commit>' nor a pip requirement" in problem(
        {**BODY, "backends": ["mine"], "backend_source": "not a ** requirement"}
    )
    assert client.post("/api/v1/campaigns", json=BODY).status_code == 401
    assert client.get("/api/v1/campaigns/5").status_code == 404
    assert client.get("/api/v1/campaigns").json() == {"items": [], "next": None}


def store_row_source(engine: Any, campaign_id: int) -> str | None:
    with Session(engine) as s:
        got = store.get_campaign(s, campaign_id)
        assert got is not None
        return got.backend_source


def test_a_backend_source_goes_to_the_jobs_that_run_the_peers(engine: Any) -> None:
    """The peers come from the named source in exactly the jobs that time them (gdn-op); the other
    jobs run our own code and carry no source, so their code under test stays ours."""
    source = "git+https://example.org/team/kernels.git@0123abc"
    req = campaign_request({**BODY, "backends": ["teamgdn"], "backend_source": source}, None)
    row, _ = store.create_campaign(engine, req)
    with Session(engine) as s:
        jobs = store.campaign_jobs(s, row.id)
    sourced = {k for k, j in jobs if j.labels.get(BACKEND_SOURCE_LABEL) == source}
    assert sourced == {k for k, j in jobs if j.suite == "gdn-op"} and sourced
    assert store_row_source(engine, row.id) == source
    # the same idempotency key with another source names another campaign: a conflict
    keyed = {**BODY, "backends": ["teamgdn"], "backend_source": source, "idempotency_key": "src"}
    first, _ = store.create_campaign(engine, campaign_request(keyed, None))
    again, created = store.create_campaign(engine, campaign_request(keyed, None))
    assert again.id == first.id and not created
    with pytest.raises(JobConflict, match="different settings"):
        store.create_campaign(engine, campaign_request({**keyed, "backend_source": source + "0"}, None))
    gdn = next(j for _, j in jobs if j.suite == "gdn-op")
    assert "teamgdn" in gdn.params["backends"]
    assert all(BACKEND_SOURCE_LABEL not in j.labels for k, j in jobs if k not in sourced)


@pytest.mark.stores("sqlite")
def test_api_creates_reads_lists_and_reports(client: TestClient) -> None:
    r = client.post("/api/v1/campaigns", json={**BODY, "idempotency_key": "same"}, headers=AUTH)
    assert r.status_code == 201, r.text
    c = r.json()
    assert r.headers["location"] == f"/api/v1/campaigns/{c['id']}"
    assert (c["status"], c["verdict"], c["done"], c["total"]) == ("queued", None, 0, 12)
    again = client.post("/api/v1/campaigns", json={**BODY, "idempotency_key": "same"}, headers=AUTH)
    assert again.status_code == 200 and again.json()["id"] == c["id"]
    detail = client.get(f"/api/v1/campaigns/{c['id']}").json()
    assert detail["plan_document"]["name"] == "pr-report-cpu"
    keys = [j["key"] for j in detail["jobs"]]
    assert keys[:3] == ["capability", "gdn-op", "cp-layer@4"] and "profile@8" in keys
    assert all(j["job"]["status"] == "queued" for j in detail["jobs"])
    assert [x["id"] for x in client.get("/api/v1/campaigns").json()["items"]] == [c["id"]]
    report = client.get(f"/api/v1/campaigns/{c['id']}/report.md")
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/markdown")
    assert "#" in report.text
    assert client.get(f"/api/v1/campaigns/{c['id']}/compare/{c['id']}").json()["only_base"] == []
    assert client.get(f"/api/v1/campaigns/{c['id']}/compare/77").status_code == 404


@pytest.mark.stores("sqlite")
def test_pages_show_campaigns_and_their_jobs(client: TestClient, db_url: str) -> None:
    assert "No campaigns yet" in client.get("/campaigns").text
    c = client.post("/api/v1/campaigns", json={**BODY, "world_sizes": [8]}, headers=AUTH).json()
    listing = client.get("/campaigns")
    assert listing.status_code == 200
    version = load_plan("pr-report-cpu").version
    assert f'href="/campaigns/{c["id"]}"' in listing.text and f"pr-report-cpu v{version}" in listing.text
    detail = client.get(f"/campaigns/{c['id']}")
    assert detail.status_code == 200
    jobs = client.get(f"/api/v1/campaigns/{c['id']}").json()["jobs"]
    for j in jobs:
        assert f'href="/jobs/{j["job"]["id"]}"' in detail.text and j["key"] in detail.text
    assert f'href="/api/v1/campaigns/{c["id"]}/report.md"' in detail.text
    # the report page of exactly the campaign's jobs, in the plan's order
    report_href = re.search(r'id="report-page" href="([^"]+)"', detail.text).group(1).replace("&amp;", "&")
    assert report_href == "/reports/campaign?" + "&".join(f"job={j['job']['id']}" for j in jobs)
    assert client.get(report_href).status_code == 200
    # submitted without a commit: the installed code, and once jobs ran, the commit they recorded
    assert "commit <span class=\"muted\">installed</span> ·" in " ".join(detail.text.split())
    eng = create_engine(db_url)
    with Session(eng) as s, s.begin():
        s.execute(update(JobRow).where(JobRow.id == jobs[0]["job"]["id"]).values(info={"commit": "ab" * 20}))
    eng.dispose()
    assert f'(ran at <span class="mono">{"ab" * 6}</span>)' in client.get(f"/campaigns/{c['id']}").text
    assert client.get("/campaigns/4242").status_code == 404
    assert client.get("/campaigns/99999999999").status_code == 404


@pytest.mark.stores("sqlite")
def test_a_campaign_outlives_the_service_that_queued_it(db_url: str) -> None:
    """Everything is in the store: a new app on the same store shows the same campaign and jobs."""
    settings = Settings(db_url=db_url, dispatch=False, executor="local")
    with TestClient(create_app(settings)) as first:
        made = first.post("/api/v1/campaigns", json=BODY).json()
        before = first.get(f"/api/v1/campaigns/{made['id']}").json()
    with TestClient(create_app(settings)) as second:
        after = second.get(f"/api/v1/campaigns/{made['id']}").json()
    assert after == before and after["total"] == 12


def test_cli_refuses_bad_world_sizes_and_an_unreachable_service() -> None:
    from click.testing import CliRunner

    from service.cli import main

    bad = CliRunner().invoke(main, ["campaign", "submit", "--plan", "pr-report-cpu", "--world-sizes", "4,x"])
    assert bad.exit_code == 2 and "comma-separated integers like 4,8, got '4,x'" in bad.output
    down = CliRunner().invoke(main, ["campaign", "show", "1", "--server", "http://127.0.0.1:9"])
    assert down.exit_code == 2 and "cannot reach the service at http://127.0.0.1:9" in down.output
