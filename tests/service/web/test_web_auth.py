"""Pages under `protect_reads`: a login cookie instead of the bearer header, no open redirect."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

TOKEN = "s3cret"


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'web.db'}", api_token=TOKEN, protect_reads=True,
                        dispatch=False, executor="local", artifacts_dir=tmp_path / "a")
    with TestClient(create_app(settings), follow_redirects=False) as c:
        yield c


def test_protected_pages_need_the_login_cookie(client: TestClient) -> None:
    for path in ("/jobs", "/jobs/rows", "/jobs/1", "/jobs/1/progress", "/compare", "/history", "/suites"):
        r = client.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/login?next=%2F"), r.headers["location"]
    assert client.get("/static/gdnval.css").status_code == 200  # the login page needs its style
    r = client.post("/login", data={"token": "nope", "next": "/suites"})
    assert r.status_code == 401 and "Wrong token" in r.text and "gdnval_session" not in r.headers.get(
        "set-cookie", "")
    r = client.post("/login", data={"token": TOKEN, "next": "/suites"})
    assert r.status_code == 303 and r.headers["location"] == "/suites"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "samesite=lax" in cookie.lower() and TOKEN not in cookie
    assert client.get("/suites").status_code == 200
    assert client.get("/jobs/1").status_code == 404  # past the login: a real answer
    client.post("/logout")
    assert client.get("/suites").status_code == 303


def test_login_never_redirects_off_site(client: TestClient) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "/\\\\evil.example"):
        r = client.post("/login", data={"token": TOKEN, "next": target})
        assert r.status_code == 303 and r.headers["location"] == "/jobs", target


def test_open_service_needs_no_login(tmp_path: Path) -> None:
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'open.db'}", api_token=TOKEN, dispatch=False,
                        executor="local")
    with TestClient(create_app(settings), follow_redirects=False) as c:
        assert c.get("/jobs").status_code == 200
        assert c.get("/").headers["location"] == "/jobs"


def test_protected_downloads_need_a_login_and_work_with_it(client: TestClient, tmp_path: Path) -> None:
    """The job page links its samples and artifacts to the API: a logged-in browser (cookie, no
    bearer header) downloads them; an anonymous or forged reader is refused; writes still need
    the bearer token."""
    import re

    from sqlalchemy.orm import Session

    from service.persistence import artifacts as artifact_store
    from service.persistence import cases
    from service.persistence import samples as sample_store
    from service.persistence.models import JobRow
    from service.web_session import COOKIE
    from workers.suite import Case, Metric

    engine = client.app.state.engine
    with Session(engine) as s, s.begin():
        job = JobRow(suite="s", preset="quick", device="cpu", world_size=1, status="succeeded", attempts=1)
        s.add(job)
        s.flush()
        mid = sample_store.ensure_metrics(s, "s", [Metric("t_ms", "ms", "time")])["t_ms"]
        cid = cases.ensure_cases(s, [Case("s", "c0", {})], "cpu", 1)["c0"]
        artifact_store.save_artifact(s, job.id, "trace.json", "application/json", b'{"traceEvents": []}',
                            tmp_path / "a")
        job_id = job.id
    sample_store.insert_samples(engine, job_id, [(cid, mid, 0, i, 1.5 + i) for i in range(7)])
    csv_url = f"/api/v1/jobs/{job_id}/samples?format=csv"

    assert client.get(csv_url).status_code == 401  # anonymous
    client.cookies.set(COOKIE, "0" * 64)
    assert client.get(csv_url).status_code == 401  # forged cookie
    client.cookies.clear()
    assert client.get(csv_url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200

    assert client.post("/login", data={"token": TOKEN, "next": f"/jobs/{job_id}"}).status_code == 303
    page = client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    links = set(re.findall(r'href="([^"]+)"', page.text.replace("&amp;", "&")))
    api = f"/api/v1/jobs/{job_id}"
    wanted = {csv_url, f"{api}/samples?format=json", f"{api}/artifacts/trace.json",
              f"/jobs/{job_id}/report.md"}
    assert wanted <= links
    csv = client.get(csv_url)
    assert csv.status_code == 200 and "text/csv" in csv.headers["content-type"]
    assert len(csv.text.strip().splitlines()) == 1 + 7 and "1.5" in csv.text
    assert client.get(f"/api/v1/jobs/{job_id}/samples?format=json").json()["items"][0]["value"] == 1.5
    assert client.get(f"/api/v1/jobs/{job_id}/artifacts/trace.json").content == b'{"traceEvents": []}'
    assert client.get(f"/jobs/{job_id}/report.md").status_code == 200
    # the cookie opens reads only: a write with it alone is still refused
    r = client.post("/api/v1/jobs", json={"suite": "capability"})
    assert r.status_code == 401
    client.post("/logout")
    assert client.get(csv_url).status_code == 401
