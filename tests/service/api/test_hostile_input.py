"""One input rule for both stores: a hand-made list of hostile requests, each answered with the
status the rule names (422 on the API, 404 for a page address, 400 for a page's query or body),
never 500, on SQLite and on PostgreSQL; the store still answers normally afterwards."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.input_rule import MAX_DEPTH, BadInput, loads
from service.app import create_app
from service.settings import Settings
from tests.support.api_support import FAKE, TOKEN
from tests.support.stores import store_url

AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "content-type": "application/json"}
VND = {**AUTH, "content-type": "application/vnd.api+json"}  # FastAPI parses every */*+json as JSON
FORM = {"content-type": "application/x-www-form-urlencoded"}
MULTIPART = {"content-type": "multipart/form-data; boundary=b0"}
HUGE = "99999999999999999999"  # past every integer column (and past int64)
PAST_INT4 = "2147483648"  # past PostgreSQL's INTEGER, still an int64


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def client(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("hostile")
    with store_url(request, request.param, tmp / "h.db") as url:
        settings = Settings(db_url=url, api_token=TOKEN, dispatch=False, artifacts_dir=tmp / "a",
                            executor="tests.support.api_support:make_fake_executor")
        with TestClient(create_app(settings), raise_server_exceptions=False) as http:
            job = http.post("/api/v1/jobs", json={"suite": FAKE, "labels": {"team": "a"}}, headers=AUTH)
            assert job.status_code == 201, job.text
            yield http


def raw(rest: str) -> str:
    """A job body written by hand (what json.dumps would never write)."""
    return f'{{"suite": "{FAKE}", {rest}}}'


def nested(depth: int) -> str:
    return raw('"params": {"x": ' + "[" * depth + "1" + "]" * depth + "}")


def multipart(**fields: str) -> bytes:
    """A multipart/form-data body (boundary `b0`) of these text fields."""
    parts = [f'--b0\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    return ("".join(parts) + "--b0--\r\n").encode()


GETS: list[tuple[str, int]] = [
    ("/api/v1/jobs?suite=%00", 422),
    ("/api/v1/jobs?commit=abc%00", 422),
    ("/api/v1/jobs?label=team%3D%00", 422),
    ("/api/v1/jobs?label=%00%3Da", 422),
    ("/api/v1/jobs?status=queued&%00=1", 422),
    (f"/api/v1/jobs?cursor={PAST_INT4}", 422),
    (f"/api/v1/jobs/{HUGE}", 422),
    (f"/api/v1/jobs/{PAST_INT4}", 422),
    (f"/api/v1/jobs/1/events?cursor={PAST_INT4}", 422),
    ("/api/v1/jobs/1/samples?case=%00", 422),
    ("/api/v1/jobs/1/samples?metric=a%00b&format=csv", 422),
    ("/api/v1/jobs/1/artifacts/%00", 422),
    ("/api/v1/jobs/1/artifacts/rank0%2F%00x", 422),
    ("/api/v1/compare?base_commit=%00&head=1&suite=x", 422),
    (f"/api/v1/compare?base={HUGE}&head=1", 422),
    (f"/api/v1/jobs/1/report?base={PAST_INT4}", 422),
    ("/api/v1/baselines/%00", 422),
    (f"/api/v1/gates/{PAST_INT4}", 422),
    (f"/api/v1/gates?cursor={PAST_INT4}", 422),
    (f"/api/v1/campaigns/{PAST_INT4}", 422),
    (f"/gates/{PAST_INT4}", 404),
    (f"/gates?before={PAST_INT4}", 404),
    (f"/campaigns/{PAST_INT4}", 404),
    (f"/campaigns?before={PAST_INT4}", 404),
    ("/api/v1/suites/%00", 422),
    ("/jobs?suite=%00", 400),
    ("/jobs?commit=%00", 400),
    (f"/jobs?before={HUGE}", 404),
    (f"/jobs?before={PAST_INT4}", 404),
    (f"/jobs/rows?before={HUGE}", 404),
    (f"/jobs/{HUGE}", 404),
    (f"/jobs/{PAST_INT4}", 404),
    (f"/jobs/{HUGE}/progress", 404),
    (f"/jobs/{HUGE}/report.md", 404),
    (f"/jobs/{HUGE}/plots?case=x", 404),
    (f"/compare/report.md?base={HUGE}&head=1", 404),
    (f"/history/{FAKE}?world_size={HUGE}", 404),
    ("/history?fingerprint=%00", 400),
    ("/compare?base=%00&head=1", 400),
    ("/static/%00", 404),
    ("/static/%00.css", 404),
    ("/%00", 404),
]


@pytest.mark.parametrize(("url", "status"), GETS)
def test_hostile_reads_are_refused_by_the_rule(client: Any, url: str, status: int) -> None:
    r = client.get(url)
    assert r.status_code == status, (url, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith(("application/problem+json", "text/html")), r.headers


WRITES: list[tuple[str, str, dict[str, str], str | bytes, int]] = [
    ("POST", "/api/v1/jobs", JSON, json.dumps({"suite": FAKE, "labels": {"k": "a\u0000b"}}), 422),
    ("POST", "/api/v1/jobs", JSON, json.dumps({"suite": FAKE, "labels": {"k\u0000": "v"}}), 422),
    ("POST", "/api/v1/jobs", JSON, json.dumps({"suite": FAKE, "idempotency_key": "x\u0000"}), 422),
    ("POST", "/api/v1/jobs", JSON, json.dumps({"suite": FAKE, "params": {"cases": "\u0000"}}), 422),
    ("POST", "/api/v1/jobs", JSON, json.dumps({"suite": FAKE, "commit": "main\u0000"}), 422),
    ("POST", "/api/v1/jobs", JSON, raw('"labels": {"k": "\\ud800"}'), 422),
    ("POST", "/api/v1/jobs", JSON, raw('"params": {"samples": NaN}'), 422),
    ("POST", "/api/v1/jobs", JSON, raw('"params": {"samples": Infinity}'), 422),
    ("POST", "/api/v1/jobs", JSON, raw('"params": {"samples": -Infinity}'), 422),
    ("POST", "/api/v1/jobs", JSON, raw('"idempotency_key": NaN'), 422),
    ("POST", "/api/v1/jobs", JSON, raw('"suite": "capability"'), 422),
    ("POST", "/api/v1/jobs", JSON, raw('"params": {"a": 1, "a": 2}'), 422),
    ("POST", "/api/v1/jobs", JSON, nested(MAX_DEPTH + 1), 422),
    ("POST", "/api/v1/jobs", JSON, nested(50_000), 422),
    ("POST", "/api/v1/jobs", JSON, json.dumps({"suite": FAKE, "world_size": int(HUGE)}), 422),
    ("POST", "/api/v1/jobs", JSON, json.dumps({"suite": FAKE, "priority": int(PAST_INT4)}), 422),
    ("POST", f"/api/v1/jobs/{HUGE}/cancel", AUTH, b"", 422),
    ("PUT", "/api/v1/baselines/main", JSON, json.dumps({"job_id": 1, "note": "n\u0000"}), 422),
    ("PUT", "/api/v1/baselines/main", JSON, json.dumps({"job_id": int(PAST_INT4)}), 422),
    ("PUT", "/api/v1/baselines/main", JSON, '{"job_id": 1, "note": "x", "note": "y"}', 422),
    ("POST", "/jobs/new", FORM, f"suite={FAKE}&token={TOKEN}&params=%7B%22a%22%3ANaN%7D", 422),
    ("POST", "/jobs/new", FORM, f"suite={FAKE}&token={TOKEN}&params=" + "%5B" * 5000 + "%5D" * 5000, 422),
    ("POST", "/jobs/new", FORM, f"suite={FAKE}%00&token={TOKEN}", 422),
    ("POST", "/jobs/new", FORM, f"suite={FAKE}&token={TOKEN}&labels=%7B%22k%22%3A%22%5Cu0000%22%7D", 422),
    ("POST", "/jobs/new", FORM, f"suite={FAKE}&token={TOKEN}&world_size={HUGE}", 422),
    ("POST", "/api/v1/jobs", VND, json.dumps({"suite": FAKE, "labels": {"k": "a\u0000b"}}), 422),
    ("POST", "/api/v1/jobs", VND, raw('"params": {"samples": NaN}'), 422),
    ("POST", "/api/v1/jobs", VND, raw('"params": {"a": 1, "a": 2}'), 422),
    ("POST", "/api/v1/jobs", VND, nested(40), 422),
    ("POST", "/api/v1/jobs", {**AUTH, "content-type": "Application/JSON; charset=utf-8"},
     raw('"params": {"samples": NaN}'), 422),
    ("POST", "/api/v1/jobs", {**AUTH, "content-type": "application/problem+json"},
     json.dumps({"suite": FAKE, "commit": "main\u0000"}), 422),
    ("POST", "/jobs/new", MULTIPART, multipart(suite=f"{FAKE}\x00", token=TOKEN), 422),
    ("POST", "/jobs/new", MULTIPART, multipart(suite=FAKE, token=TOKEN, labels='{"k": "\\u0000"}'), 422),
]


@pytest.mark.parametrize(("method", "url", "headers", "body", "status"), WRITES)
def test_hostile_writes_are_refused_and_store_nothing(
    client: Any, method: str, url: str, headers: dict[str, str], body: str | bytes, status: int
) -> None:
    before = client.get("/api/v1/jobs?limit=500").json()["items"]
    r = client.request(method, url, content=body, headers=headers)
    assert r.status_code == status, (url, body[:200], r.status_code, r.text[:300])
    after = client.get("/api/v1/jobs?limit=500").json()["items"]
    assert len(after) == len(before)
    assert client.get("/api/v1/jobs?label=team%3Da").status_code == 200  # the store still answers


def test_a_body_of_any_json_type_is_parsed_and_judged_alike(client: Any) -> None:
    """What the rule reads is what FastAPI parses: a valid `+json` body is a job like any."""
    made = client.post("/api/v1/jobs", content=json.dumps({"suite": FAKE, "labels": {"via": "vnd"}}),
                       headers=VND)
    assert made.status_code == 201, made.text
    assert client.get("/api/v1/jobs?label=via%3Dvnd").json()["items"][0]["id"] == made.json()["id"]


def test_multipart_form_fields_follow_the_rule(client: Any) -> None:
    """A multipart body's fields are text like an urlencoded form's (here judged by the rule
    itself: the session cookie means the 401 does not come first)."""
    from service.web_session import COOKIE

    headers = {**MULTIPART, "cookie": f"{COOKIE}=x"}
    for body, where in ((multipart(suite=f"{FAKE}\x00"), "form field 'suite'"),
                        (multipart(**{"a\x00": "1"}), "form field name")):
        r = client.post("/jobs/new", content=body, headers=headers)
        assert r.status_code == 422 and where in r.json()["detail"], r.text


def test_a_refusal_names_the_bad_value(client: Any) -> None:
    r = client.post("/api/v1/jobs", content=json.dumps({"suite": FAKE, "labels": {"k": "a\u0000b"}}),
                    headers=JSON)
    assert "U+0000" in r.json()["detail"] and "labels.k" in r.json()["detail"]
    r = client.post("/api/v1/jobs", content='{"suite": "a", "suite": "b"}', headers=JSON)
    assert "duplicate JSON key 'suite'" in r.json()["detail"]
    r = client.get(f"/api/v1/jobs?cursor={PAST_INT4}")
    assert PAST_INT4 in r.json()["detail"]


@pytest.mark.parametrize(
    "text", ['{"a": NaN}', "[Infinity]", '{"a": 1, "a": 1}', "[" * 40 + "]" * 40, '"\\u0000"', '["\\udfff"]']
)
def test_strict_json_refuses(text: str) -> None:
    with pytest.raises(BadInput):
        loads(text)


def test_strict_json_keeps_what_is_fine(tmp_path: Path) -> None:
    text = json.dumps({"a": [1, 2.5, None, True, "ü€😀"], "b": {"c": "d"}, "e": "[" * 10})
    assert loads(text) == json.loads(text)
    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None


def test_a_commit_the_repository_lacks_is_refused_at_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a repository (the executor's), a commit is resolved when it is submitted, not when it
    runs; without one the installed code runs and any well-formed ref is taken."""
    from service.domain.submission import InvalidJob, validate_request
    from workers.executors.local import LocalExecutor

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    (repo / "README").write_text("x\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "one"]):
        subprocess.run([*git, *args], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    sha = head.stdout.strip()
    executor = LocalExecutor(repo=repo, cache_dir=tmp_path / "snapshots")
    with pytest.raises(InvalidJob, match="commit 'deadbeef' is not a commit of the service's repository"):
        validate_request({"suite": "capability", "commit": "deadbeef"}, executor)
    for ref in (sha, sha[:10], "main"):
        assert validate_request({"suite": "capability", "commit": ref}, executor).commit == ref
    monkeypatch.delenv("GDNVAL_REPO", raising=False)
    no_repo = LocalExecutor()
    assert validate_request({"suite": "capability", "commit": "deadbeef"}, no_repo).commit == "deadbeef"


def test_without_credentials_the_401_comes_first(tmp_path: Path) -> None:
    """Nothing about a request is judged before its missing credentials are; a page's address
    is still checked (it names a file or nothing)."""
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'p.db'}", api_token=TOKEN, protect_reads=True,
                        dispatch=False, executor="tests.support.api_support:make_fake_executor",
                        artifacts_dir=tmp_path / "a")
    with TestClient(create_app(settings), raise_server_exceptions=False) as http:
        assert http.get("/api/v1/jobs?suite=%00").status_code == 401
        assert http.get(f"/api/v1/jobs/{HUGE}").status_code == 401
        nan = raw('"params": {"samples": NaN}')
        bare = {"content-type": "application/json"}
        assert http.post("/api/v1/jobs", content=nan, headers=bare).status_code == 401
        assert http.get("/static/%00").status_code == 404
        assert http.get("/api/v1/jobs?suite=%00", headers=AUTH).status_code == 422
        assert http.post("/api/v1/jobs", content=nan, headers=JSON).status_code == 422
