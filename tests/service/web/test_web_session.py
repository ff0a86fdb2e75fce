"""Login sessions are signed, expire, and end at /logout on the server (a copied cookie stops
working), at a token change, and with the default per-process secret at a restart."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.web_session import COOKIE, SessionKeys

TOKEN = "s3cret"


def _client(tmp_path: Path, **kw: object) -> TestClient:
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'web.db'}", api_token=TOKEN, protect_reads=True,
                        dispatch=False, executor="local", artifacts_dir=tmp_path / "a", **kw)
    return TestClient(create_app(settings), follow_redirects=False)


def _login(c: TestClient) -> str:
    r = c.post("/login", data={"token": TOKEN, "next": "/suites"})
    assert r.status_code == 303
    assert "Max-Age=" in r.headers["set-cookie"]
    return r.cookies[COOKIE]


def test_logout_revokes_the_session_on_the_server(tmp_path: Path) -> None:
    with _client(tmp_path) as c:
        value = _login(c)
        assert TOKEN not in value and value.startswith("v1.")
        assert c.get("/suites").status_code == 200 and c.get("/api/v1/suites").status_code == 200
        assert c.get("/logout").status_code == 405  # a link elsewhere cannot log anyone out
        c.cookies.set(COOKIE, "")  # a cross-site form: no session cookie sent
        anon = c.post("/logout")
        assert anon.status_code == 303 and "set-cookie" not in anon.headers
        c.cookies.set(COOKIE, value)
        assert c.get("/suites").status_code == 200  # the session still works after both
        assert c.post("/logout").status_code == 303
        c.cookies.clear()
        c.cookies.set(COOKIE, value)  # a copy of the cookie kept from before the logout
        assert c.get("/suites").status_code == 303
        assert c.get("/api/v1/suites").status_code == 401
        c.cookies.clear()
        again = _login(c)  # a new login is a new session
        assert again != value and c.get("/suites").status_code == 200


def test_sessions_expire(tmp_path: Path) -> None:
    # expiry has whole-second resolution, so a 1 s TTL could lapse before the first request on a
    # loaded machine: 3 s leaves at least 2
    with _client(tmp_path, session_ttl_s=3.0) as c:
        _login(c)
        assert c.get("/suites").status_code == 200
        time.sleep(4.1)
        assert c.get("/suites").status_code == 303


def test_signature_expiry_token_and_secret_are_all_checked() -> None:
    keys = SessionKeys(None, ttl_s=60)
    now = 1_000_000.0
    value = keys.issue(TOKEN, now=now)
    assert keys.valid(TOKEN, value, now=now + 59)
    assert not keys.valid(TOKEN, value, now=now + 61)  # expired
    v, sid, expiry, sig = value.split(".")
    assert not keys.valid(TOKEN, f"{v}.{sid}.{int(expiry) + 3600}.{sig}", now=now)  # a stretched expiry
    assert not keys.valid("another-token", value, now=now)  # the API token changed
    assert not SessionKeys(None, 60).valid(TOKEN, value, now=now)  # a restart: a new random secret
    shared_a, shared_b = SessionKeys("replica-secret", 60), SessionKeys("replica-secret", 60)
    assert shared_b.valid(TOKEN, shared_a.issue(TOKEN, now=now), now=now)  # replicas with one secret
    keys.revoke(TOKEN, value, now=now)
    assert not keys.valid(TOKEN, value, now=now)
    for forged in ("", "0" * 64, "v1.x.y.z", "v1.a.99999999999.00"):
        assert not keys.valid(TOKEN, forged, now=now)


def test_wrong_tokens_lock_the_client_out_even_with_the_right_one(tmp_path: Path) -> None:
    from service.api.auth_limit import MAX_FAILURES

    with _client(tmp_path) as c:
        for _ in range(MAX_FAILURES):
            assert c.post("/login", data={"token": "guess", "next": "/jobs"}).status_code == 401
        r = c.post("/login", data={"token": TOKEN, "next": "/jobs"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0 and COOKIE not in r.cookies
        right = {"Authorization": f"Bearer {TOKEN}"}
        bearer = c.post("/api/v1/jobs", json={"suite": "capability"}, headers=right)
        assert bearer.status_code == 429 and "retry-after" in bearer.headers  # one count for every way in
    with _client(tmp_path) as c:  # the API's bearer token counts the same way
        wrong = {"Authorization": "Bearer guess"}
        codes = [c.get("/api/v1/suites", headers=wrong).status_code for _ in range(MAX_FAILURES)]
        assert codes == [403] * MAX_FAILURES
        assert c.get("/api/v1/suites", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 429
