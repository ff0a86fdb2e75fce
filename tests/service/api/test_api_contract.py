"""The API keeps the contract its OpenAPI document states: strict request types, one error shape
(RFC 9457 problem details) declared for every status an operation answers, the bearer scheme on
every operation that needs the token, the token checked before the request is validated, and
schemathesis (`--checks all`, bounded in time and examples) finding nothing against a real server.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.support.api_support import TOKEN, make_server
from tests.support.stores import STORES, store_url

PROBLEM = "application/problem+json"
REF = "#/components/schemas/Problem"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAKE_EXECUTOR = "tests.support.api_support:make_fake_executor"
JSON = {**AUTH, "content-type": "application/json"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("contract")
    settings = Settings(db_url=f"sqlite:///{tmp / 'c.db'}", api_token=TOKEN, dispatch=False,
                        executor=FAKE_EXECUTOR, artifacts_dir=tmp / "a")
    with TestClient(create_app(settings)) as http:
        yield http


def _problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM, r.headers
    body = r.json()
    assert body["status"] == status and body["title"] and isinstance(body["detail"], str), body
    return body


@pytest.mark.parametrize("value", ["2", True, 2.0, None])
def test_request_types_are_strict(client: TestClient, value: Any) -> None:
    r = client.post("/api/v1/jobs", json={"suite": "fake-store", "world_size": value}, headers=AUTH)
    body = _problem(r, 422)
    assert body["errors"][0]["loc"] == ["body", "world_size"], body
    assert repr(value) in body["detail"]  # the problem names the bad value


def test_every_error_status_answers_one_shape(client: TestClient) -> None:
    _problem(client.post("/api/v1/jobs", json={"suite": "fake-store"}), 401)
    wrong = {"Authorization": "Bearer x"}
    _problem(client.post("/api/v1/jobs", json={"suite": "fake-store"}, headers=wrong), 403)
    _problem(client.get("/api/v1/jobs/2147483647"), 404)
    _problem(client.get("/api/v1/no-such-route"), 404)
    allowed = _problem(client.post("/api/v1/baselines/main"), 405)
    assert allowed and client.post("/api/v1/baselines/main").headers["allow"] == "GET, PUT"
    body = _problem(client.put("/api/v1/baselines/0", json={"note": ""}, headers=AUTH), 422)
    assert "give exactly one of 'commit'" in body["detail"]
    _problem(client.post("/api/v1/jobs", content=b"x" * (2 << 20), headers=JSON), 413)
    job = client.post("/api/v1/jobs", json={"suite": "fake-store"}, headers=AUTH).json()
    client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    _problem(client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH), 409)
    bad_json = client.post("/api/v1/jobs", content=b"{not json", headers=JSON)
    assert bad_json.status_code in (400, 422) and bad_json.headers["content-type"] == PROBLEM


def test_openapi_declares_problems_and_the_bearer_scheme(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "the service's API token (GDNVAL_API_TOKEN)"
    }
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    api = {p: item for p, item in doc["paths"].items() if p.startswith("/api/v1")}
    ops = [(p, m, op) for p, item in api.items() for m, op in item.items()]
    assert len(ops) >= 15
    for path, method, op in ops:
        errors = {code: r for code, r in op["responses"].items() if code[0] in "45"}
        assert {"404", "503"} <= set(errors), (path, method)
        for code, resp in errors.items():
            assert resp["content"] == {PROBLEM: {"schema": {"$ref": REF}}}, (path, code)
        if method in ("post", "put"):
            assert op["security"] == [{"bearer": []}] and {"401", "403", "413"} <= set(errors), (path, method)
        else:
            assert "security" not in op, (path, method)  # reads are open unless protect_reads
    suites = doc["paths"]["/api/v1/suites/{name}"]["get"]["responses"]["200"]["content"]["application/json"]
    assert suites["schema"] == {"$ref": "#/components/schemas/SuiteOut"}


def test_the_token_is_checked_before_the_request(client: TestClient, tmp_path: Path) -> None:
    """Without credentials every guarded operation answers 401, whatever is wrong with the body,
    the path or the query (nothing about the request is revealed to an anonymous caller)."""
    doc = client.get("/openapi.json").json()
    guarded = [(p, m) for p, item in doc["paths"].items() for m, op in item.items() if op.get("security")]
    assert len(guarded) >= 4
    for path, method in guarded:
        url = path.replace("{job_id}", "0").replace("{name}", "-bad-")
        for kw in ({"json": {"unknown": 1}}, {"content": b"{not json"}, {"json": []}):
            _problem(client.request(method.upper(), url, **kw), 401)
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'p.db'}", api_token=TOKEN, protect_reads=True,
                        dispatch=False, executor="local", artifacts_dir=tmp_path / "a")
    with TestClient(create_app(settings)) as protected:
        for url in ("/api/v1/jobs?limit=0", "/api/v1/jobs/0", "/api/v1/compare?base=x", "/api/v1/suites"):
            _problem(protected.get(url), 401)
        reads = protected.get("/openapi.json").json()["paths"]["/api/v1/jobs"]["get"]
        assert reads["security"] == [{"bearer": []}]


# Anything schemathesis finds fails this test.
KNOWN_ELSEWHERE: set[tuple[str, str]] = set()


def _failures(stdout: str) -> set[tuple[str, str]]:
    """(operation, check code) of every failure in `st run`'s FAILURES section."""
    section = stdout.split("= FAILURES =", 1)[-1] if "= FAILURES =" in stdout else ""
    section = re.split(r"=+ (?:WARNINGS|SUMMARY|ERRORS) =+", section)[0]
    found, op = set(), ""
    for line in section.splitlines():
        heading = re.match(r"^_+ (\S+ \S+) _+$", line.strip())
        if heading:
            op = heading.group(1)
        code = re.match(r"^- (ST\d{3}) ", line.strip())
        if code:
            found.add((op, code.group(1)))
    return found


@pytest.mark.slow  # about a minute per store: a server subprocess and 45 s of schemathesis
@pytest.mark.parametrize("store", STORES)
def test_schemathesis_finds_no_contract_failure(store: str, request: pytest.FixtureRequest,
                                                tmp_path: Path) -> None:
    """`st run --checks all` against a real server (uvicorn subprocess, a SQLite file or a
    PostgreSQL database; no dispatcher, so accepted jobs stay queued), bounded to 10 examples per
    operation and 45 s."""
    with store_url(request, store, tmp_path / "gdnval.db") as url:
        _schemathesis(tmp_path, url)


def _schemathesis(tmp_path: Path, url: str) -> None:
    server = make_server(tmp_path, executor=FAKE_EXECUTOR, GDNVAL_DISPATCH="false", GDNVAL_DB_URL=url)
    server.start()
    try:
        config = str(Path(__file__).with_name("schemathesis.toml"))
        schema = f"{server.base}/openapi.json"
        st = [str(Path(sys.executable).parent / "st"), "--config-file", config, "run", schema,
              "--checks", "all", "--max-examples", "10", "--max-time", "45", "--seed", "1", "--workers", "1",
              "--generation-database", "none", "--no-color", "--header", f"Authorization: Bearer {TOKEN}",
              "--request-timeout", "20"]
        out = subprocess.run(st, cwd=tmp_path, capture_output=True, text=True, timeout=110)
        tail = out.stdout[-6000:] + out.stderr[-2000:]
        assert "Test cases:" in out.stdout and "generated" in out.stdout, tail  # it really ran
        found = _failures(out.stdout)
        assert found <= KNOWN_ELSEWHERE, tail
        assert out.returncode == 0 or found, tail
    finally:
        server.stop()
