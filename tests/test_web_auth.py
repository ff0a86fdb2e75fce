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
                        dispatch=False, executor="inprocess", artifacts_dir=tmp_path / "a")
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
    client.get("/logout")
    assert client.get("/suites").status_code == 303


def test_login_never_redirects_off_site(client: TestClient) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "/\\\\evil.example"):
        r = client.post("/login", data={"token": TOKEN, "next": target})
        assert r.status_code == 303 and r.headers["location"] == "/jobs", target


def test_open_service_needs_no_login(tmp_path: Path) -> None:
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'open.db'}", api_token=TOKEN, dispatch=False,
                        executor="inprocess")
    with TestClient(create_app(settings), follow_redirects=False) as c:
        assert c.get("/jobs").status_code == 200
        assert c.get("/").headers["location"] == "/jobs"
