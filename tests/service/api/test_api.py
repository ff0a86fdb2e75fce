"""The REST API through a real server process (`gdnval serve` on a loopback port).

One server for the module per store: a SQLite file, then a fresh PostgreSQL database. Its
executor routes the `fake-store` suite to a steerable fake and every other suite to the real
local executor, so the end-to-end path is also exercised with a real quick suite (`capability`)
on real rank processes.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.api_support import FAKE, TOKEN, Server, make_server, value
from tests.support.stores import STORES, store_url

pytestmark = pytest.mark.slow  # a real server process per store

AUTH = {"Authorization": f"Bearer {TOKEN}"}
FINAL = ("succeeded", "failed", "cancelled")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One server process per store kind for the module; a test's `stores` marker names fewer."""
    if "server" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("stores")
        metafunc.parametrize("server", marker.args if marker else STORES, indirect=True, scope="module")


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("api")
    with store_url(request, request.param, workdir / "gdnval.db") as url:
        srv = make_server(
            workdir, GDNVAL_DB_URL=url, GDNVAL_DEVICE_LIMITS='{"cpu": 4}', GDNVAL_MAX_BODY_BYTES="20000"
        )
        srv.start()
        yield srv
        srv.stop()


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def any_job(http: httpx.Client) -> int:
    return int(submit(http, params={"cases": 1, "samples": 1})["id"])


def submit(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/api/v1/jobs", json={"suite": FAKE, **body}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()


def wait_final(http: httpx.Client, job_id: int, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/api/v1/jobs/{job_id}").json()
        if job["status"] in FINAL:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not finished in {timeout} s: {job}")


def test_probes(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok", "checks": {}}
    ready = http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "dispatcher": "ok", "executor": "ok"}


def test_submit_runs_and_every_endpoint_reads_the_results(http: httpx.Client) -> None:
    params = {"cases": 2, "samples": 12, "ranks": 3, "batch": 20, "artifact": True}
    job = submit(http, params=params, commit="abc1234", labels={"who": "e2e"}, priority=3, world_size=3)
    assert job["status"] == "queued" and job["params"] == params and job["commit"] == "abc1234"
    done = wait_final(http, job["id"])
    assert done["status"] == "succeeded", done
    assert done["info"]["device_name"] == "fake-cpu" and done["info"]["commit"] == "abc1234"
    assert {"torch", "triton", "driver"} <= set(done["info"])
    assert done["progress"] == {"done": 2, "total": 2, "message": "c1"}

    listed = http.get("/api/v1/jobs", params={"status": "succeeded", "suite": FAKE, "commit": "abc1"}).json()
    assert job["id"] in [j["id"] for j in listed["items"]]

    cases = http.get(f"/api/v1/jobs/{job['id']}/cases").json()
    assert cases["next"] is None and [c["name"] for c in cases["items"]] == ["c0", "c1"]
    for ci, case in enumerate(cases["items"]):
        assert case["status"] == "passed"
        t = case["metrics"]["time_ms"]  # lower is better: the slowest rank (rank 2) per idx
        worst = np.array([value(ci, "time_ms", 2, i) for i in range(12)])
        assert (t["median"], t["p90"], t["min"], t["max"], t["count"], t["samples"], t["ranks"]) == (
            pytest.approx(np.median(worst)),
            pytest.approx(np.percentile(worst, 90)),
            worst.min(),
            worst.max(),
            12,
            36,
            3,
        )
        tp = case["metrics"]["throughput"]  # higher is better: the lowest rank value per idx
        assert tp["min"] == value(ci, "throughput", 2, 11) and tp["passes"] is True

    total = 2 * 2 * 12 * 3
    seen: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = http.get(f"/api/v1/jobs/{job['id']}/samples", params={"limit": 50, "cursor": cursor}).json()
        seen += page["items"]
        cursor = page["next"]
        if cursor is None:
            break
    assert len(seen) == total and len({s["id"] for s in seen}) == total
    assert all(s["value"] == value(int(s["case"][1]), s["metric"], s["rank"], s["idx"]) for s in seen)
    one = http.get(f"/api/v1/jobs/{job['id']}/samples", params={"case": "c1", "metric": "time_ms", "rank": 0})
    assert len(one.json()["items"]) == 12

    got_csv = http.get(f"/api/v1/jobs/{job['id']}/samples", params={"format": "csv"})
    assert got_csv.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(got_csv.text)))
    assert len(rows) == total and rows[0].keys() == seen[0].keys()
    assert sum(float(r["value"]) for r in rows) == pytest.approx(sum(s["value"] for s in seen))

    nd = http.get(f"/api/v1/jobs/{job['id']}/samples", params={"format": "ndjson", "metric": "throughput"})
    lines = [json.loads(x) for x in nd.text.splitlines()]
    assert len(lines) == total // 2 and {x["metric"] for x in lines} == {"throughput"}

    events = http.get(f"/api/v1/jobs/{job['id']}/events", params={"kind": "status"}).json()["items"]
    assert [e["message"] for e in events] == ["queued", "running", "succeeded"]
    logs = http.get(f"/api/v1/jobs/{job['id']}/events", params={"kind": "log"}).json()["items"]
    assert [e["message"] for e in logs] == ["c0 done", "c1 done"]

    arts = http.get(f"/api/v1/jobs/{job['id']}/artifacts").json()["items"]
    assert [(a["name"], a["media_type"], a["size"]) for a in arts] == [("report.txt", "text/plain", 12)]
    assert http.get(arts[0]["url"]).content == b"fake report\n"

    r = http.put("/api/v1/baselines/main", json={"job_id": job["id"], "note": "first"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["job_id"] == job["id"]
    r = http.put("/api/v1/baselines/release", json={"commit": "v1.2"}, headers=AUTH)
    assert r.json()["commit"] == "v1.2"
    assert http.get("/api/v1/baselines/main").json()["note"] == "first"
    assert {b["name"] for b in http.get("/api/v1/baselines").json()["items"]} >= {"main", "release"}


def test_suite_catalogue(http: httpx.Client) -> None:
    suites = http.get("/api/v1/suites").json()
    names = [s["name"] for s in suites["items"]]
    assert {"capability", FAKE} <= set(names) and suites["next"] is None
    fake = http.get(f"/api/v1/suites/{FAKE}").json()
    assert set(fake["presets"]) == {"quick", "slow"}
    assert [m["name"] for m in fake["metrics"]] == ["time_ms", "throughput"]
    assert len(fake["presets"]["quick"]["cases"]) == 2


# The store reads a real job's rows as a fake one's: PostgreSQL keeps the fake jobs and a stored
# real cp-layer run (test_compare_reduced.py); the rank processes do not depend on the store.
@pytest.mark.stores("sqlite")
def test_real_local_executor_runs_a_quick_suite(http: httpx.Client) -> None:
    r = http.post(
        "/api/v1/jobs", json={"suite": "capability", "preset": "quick", "device": "cpu"}, headers=AUTH
    )
    assert r.status_code == 201, r.text
    done = wait_final(http, r.json()["id"], timeout=150)
    assert done["status"] == "succeeded", done
    assert done["info"]["torch"] and "device_name" in done["info"] and done["info"]["commit"]
    cases = http.get(f"/api/v1/jobs/{done['id']}/cases").json()["items"]
    assert cases and all(c["status"] in ("passed", "expected_error", "skipped") for c in cases), cases
    samples = http.get(f"/api/v1/jobs/{done['id']}/samples").json()["items"]
    assert samples and all(s["attempt"] == 1 for s in samples)


def test_50_concurrent_submissions_make_50_jobs(http: httpx.Client, server: Server) -> None:
    def one(i: int) -> tuple[int, int]:
        with httpx.Client(base_url=server.base, timeout=60) as c:
            r = c.post(
                "/api/v1/jobs",
                headers=AUTH,
                json={
                    "suite": FAKE,
                    "params": {"cases": 1, "samples": 2},
                    "labels": {"batch": "c50", "i": str(i)},
                },
            )
            return r.status_code, r.json()["id"]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(50)))
    assert [s for s, _ in results] == [201] * 50
    ids = {i for _, i in results}
    assert len(ids) == 50
    listed = http.get("/api/v1/jobs", params={"label": "batch=c50", "limit": 500}).json()
    assert {j["id"] for j in listed["items"]} == ids and listed["next"] is None
    first = http.get("/api/v1/jobs", params={"label": "batch=c50", "limit": 30}).json()
    rest = http.get(
        "/api/v1/jobs", params={"label": "batch=c50", "limit": 30, "cursor": first["next"]}
    ).json()
    assert len(first["items"]) == 30 and len(rest["items"]) == 20 and rest["next"] is None
    assert {j["id"] for j in first["items"] + rest["items"]} == ids


def test_repeated_idempotency_key_makes_one_job(server: Server) -> None:
    body = {"suite": FAKE, "params": {"cases": 1}, "idempotency_key": "ci-run-42"}

    def one(_: int) -> tuple[int, int]:
        with httpx.Client(base_url=server.base, timeout=60) as c:
            r = c.post("/api/v1/jobs", json=body, headers=AUTH)
            return r.status_code, r.json()["id"]

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(one, range(10)))
    assert len({i for _, i in results}) == 1
    assert sorted(s for s, _ in results) == [200] * 9 + [201]


def test_cancel_running_job(http: httpx.Client) -> None:
    job = submit(http, preset="slow")
    deadline = time.monotonic() + 30
    while http.get(f"/api/v1/jobs/{job['id']}").json()["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    assert r.status_code == 200 and r.json()["cancel_requested"] is True
    assert wait_final(http, job["id"])["status"] == "cancelled"
    again = http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    assert again.status_code == 409
    assert again.json()["detail"] == (
        f"job {job['id']} is already cancelled; only queued or running jobs can be cancelled"
    )


BAD: list[tuple[str, str, str, Any, dict[str, str] | None, int, str]] = [
    # (id, method, path, json body, headers (None = valid token), status, message fragment)
    (
        "unknown suite",
        "POST",
        "/api/v1/jobs",
        {"suite": "nope"},
        None,
        422,
        "unknown suite 'nope'; expected one of ['capability', ",
    ),
    (
        "unknown preset",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "preset": "huge"},
        None,
        422,
        "unknown preset 'huge' for suite 'fake-store'; expected one of ['quick', 'slow']",
    ),
    (
        "unknown param",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "params": {"colour": 1}},
        None,
        422,
        "unknown parameter(s) ['colour'] for suite 'fake-store'; expected a subset of ['artifact', 'batch'",
    ),
    (
        "bad param value",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "params": {"cases": "many"}},
        None,
        422,
        "invalid parameters for suite 'fake-store'",
    ),
    (
        "world size never",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "device": "cuda"},
        None,
        422,
        "world_size 1 on 'cuda' can never be satisfied",
    ),
    (
        "world size too big",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "world_size": 4000},
        None,
        422,
        "world_size 4000 on 'cpu' can never be satisfied: the local+fake executor offers at most 8",
    ),
    (
        "world size zero",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "world_size": 0},
        None,
        422,
        "greater than or equal to 1",
    ),
    (
        "bad device",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "device": "tpu"},
        None,
        422,
        "'cuda', 'npu' or 'cpu'",
    ),
    (
        "bad commit",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "commit": "main;rm -rf"},
        None,
        422,
        "commit must be a hex sha of 7-40 characters, or a ref",
    ),
    ("commit dotdot", "POST", "/api/v1/jobs", {"suite": FAKE, "commit": "a..b"}, None, 422, "got 'a..b'"),
    ("short sha", "POST", "/api/v1/jobs", {"suite": FAKE, "commit": "abc"}, None, 201, ""),  # a valid ref
    (
        "extra field",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "gpus": 2},
        None,
        422,
        "Extra inputs are not permitted",
    ),
    ("not json", "POST", "/api/v1/jobs", "{nope", None, 422, "JSON decode error"),
    (
        "label too long",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "labels": {"x": "y" * 501}},
        None,
        422,
        "String should have at most 500 characters",
    ),
    (
        "body over limit",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE, "pad": "z" * 30000},
        None,
        413,
        "exceeds the limit of 20000 bytes",
    ),
    ("no token", "POST", "/api/v1/jobs", {"suite": FAKE}, {}, 401, "missing credentials"),
    (
        "wrong token",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE},
        {"Authorization": "Bearer nope"},
        403,
        "bearer token is not valid",
    ),
    (
        "basic auth",
        "POST",
        "/api/v1/jobs",
        {"suite": FAKE},
        {"Authorization": "Basic eDp5"},
        401,
        "missing credentials",
    ),
    ("cancel no token", "POST", "/api/v1/jobs/{job}/cancel", None, {}, 401, "missing credentials"),
    (
        "baseline no token",
        "PUT",
        "/api/v1/baselines/x",
        {"commit": "abcdef0"},
        {},
        401,
        "missing credentials",
    ),
    ("no job", "GET", "/api/v1/jobs/999999", None, None, 404, "no job 999999"),
    ("job id zero", "GET", "/api/v1/jobs/0", None, None, 422, "greater than or equal to 1"),
    ("job id huge", "GET", "/api/v1/jobs/99999999999999999999999", None, None, 422, "less than or equal to"),
    ("cancel no job", "POST", "/api/v1/jobs/999999/cancel", None, None, 404, "no job 999999"),
    (
        "bad cursor",
        "GET",
        "/api/v1/jobs?cursor=abc",
        None,
        None,
        422,
        "query.cursor: String should match pattern '^[0-9]{0,18}$' (got 'abc')",
    ),
    ("bad status filter", "GET", "/api/v1/jobs?status=done", None, None, 422, "'queued', 'running'"),
    ("limit too big", "GET", "/api/v1/jobs?limit=100000", None, None, 422, "less than or equal to 500"),
    (
        "bad format",
        "GET",
        "/api/v1/jobs/{job}/samples?format=xml",
        None,
        None,
        422,
        "'json', 'csv' or 'ndjson'",
    ),
    ("unknown suite entry", "GET", "/api/v1/suites/nope", None, None, 404, "unknown suite 'nope'"),
    ("no baseline", "GET", "/api/v1/baselines/none-such", None, None, 404, "no baseline 'none-such'"),
    (
        "baseline both",
        "PUT",
        "/api/v1/baselines/x",
        {"commit": "abcdef0", "job_id": 1},
        None,
        422,
        "give exactly one of 'commit'",
    ),
    (
        "baseline neither",
        "PUT",
        "/api/v1/baselines/x",
        {"note": "n"},
        None,
        422,
        "give exactly one of 'commit'",
    ),
    (
        "baseline unknown job",
        "PUT",
        "/api/v1/baselines/x",
        {"job_id": 987654},
        None,
        422,
        "job_id 987654 does not exist",
    ),
    (
        "baseline bad name",
        "PUT",
        "/api/v1/baselines/-x",
        {"commit": "abcdef0"},
        None,
        422,
        "String should match pattern",
    ),
    (
        "no artifact",
        "GET",
        "/api/v1/jobs/{job}/artifacts/none.txt",
        None,
        None,
        404,
        "has no artifact 'none.txt'",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_input(
    http: httpx.Client,
    any_job: int,
    method: str,
    path: str,
    body: Any,
    headers: dict[str, str] | None,
    status: int,
    message: str,
) -> None:
    path = path.replace("{job}", str(any_job))
    kwargs: dict[str, Any] = {"headers": AUTH if headers is None else headers}
    if isinstance(body, str):
        kwargs["content"] = body
        kwargs["headers"] = {**kwargs["headers"], "content-type": "application/json"}
    elif body is not None:
        kwargs["json"] = body
    r = http.request(method, path, **kwargs)
    assert r.status_code == status, r.text
    if message:
        assert message in json.dumps(r.json()["detail"]) or message in str(r.json()["detail"]), r.text
    if status == 401:
        assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("take", [{"take_cases_from": "{job}", "take_backends": "eager"},
                                  {"take_backends": "eager"}], ids=["both", "backends"])
def test_labels_that_take_another_jobs_measurements_are_refused(
    http: httpx.Client, any_job: int, take: dict[str, str]
) -> None:
    """A caller cannot make its job copy another job's cases as its own: only the gate sets the
    take labels. The answer names them, and no job is queued."""
    labels = {"who": "taker", **{k: v.replace("{job}", str(any_job)) for k, v in take.items()}}
    r = http.post("/api/v1/jobs", json={"suite": FAKE, "labels": labels}, headers=AUTH)
    assert r.status_code == 422, r.text
    detail = json.dumps(r.json()["detail"])
    assert "set by the gate only" in detail and all(k in detail for k in take), detail
    assert http.get("/api/v1/jobs", params={"label": "who=taker"}).json()["items"] == []


def test_reused_idempotency_key_with_other_parameters_is_a_conflict(http: httpx.Client) -> None:
    submit(http, idempotency_key="conflict-key", params={"cases": 1})
    r = http.post("/api/v1/jobs", headers=AUTH, json={"suite": FAKE, "idempotency_key": "conflict-key"})
    assert r.status_code == 409
    assert "idempotency key 'conflict-key' already names job" in r.json()["detail"]


@pytest.mark.stores("sqlite")  # the CLI speaks HTTP only; the API's reads run on both stores above
def test_cli_submit_wait_and_jobs(server: Server) -> None:
    env = {**server.env, "GDNVAL_SERVER": server.base}
    cli = [sys.executable, "-m", "service.cli"]
    out = subprocess.run(
        [
            *cli,
            "submit",
            FAKE,
            "--param",
            "cases=3",
            "--param",
            "samples=4",
            "--label",
            "via=cli",
            "--wait",
            "--timeout",
            "60",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "verdict passed (3 passed); exit 0" in out.stdout, out.stdout
    bad = subprocess.run([*cli, "submit", "nope"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown suite 'nope'" in bad.stderr
    noauth = subprocess.run(
        [*cli, "submit", FAKE],
        env={**env, "GDNVAL_API_TOKEN": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert noauth.returncode == 2 and "401" in noauth.stderr
    listed = subprocess.run(
        [*cli, "jobs", "--suite", FAKE, "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0 and json.loads(listed.stdout)["items"][0]["suite"] == FAKE


def test_no_request_makes_a_500(server: Server, any_job: int) -> None:
    """A bounded schemathesis run over every operation of the OpenAPI schema: valid and invalid
    inputs (positive and negative generation), with and without the token."""
    from collections import Counter

    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(f"{server.base}/openapi.json")
    schema.config.base_url = server.base
    # POST /api/v1/gate starts real suite jobs (the gate's own tests cover it); everything else runs
    ops = [op for op in (r.ok() for r in schema.get_all_operations()) if op.label != "POST /api/v1/gate"]
    assert len(ops) >= 14
    strategies = [op.as_strategy(mode) for op in ops for mode in GenerationMode]
    labels = [op.label for op in ops for _ in GenerationMode]
    for op in ops:  # also aim at things that exist, so handlers run past their 404s
        known = {"job_id": any_job, "name": FAKE if "suites" in op.path else "main"}
        fixed = {k: v for k, v in known.items() if "{" + k + "}" in op.path}
        if fixed:
            strategies.append(op.as_strategy(path_parameters=fixed))
            labels.append(op.label)
    answered: Counter[tuple[str, int]] = Counter()

    @settings(
        max_examples=100,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(strategies) - 1))
        case = data.draw(strategies[i])
        response = case.call(headers=AUTH if data.draw(st.booleans()) else {}, timeout=30)
        answered[(labels[i], response.status_code // 100)] += 1
        assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:300]}"
        case.validate_response(response, checks=[not_a_server_error])

    run()
    ok_ops = {label for label, klass in answered if klass == 2}
    assert len({label for label, _ in answered}) >= len(ops) // 2, answered
    assert len(ok_ops) >= 5, answered  # the fuzz reached real handlers, not only validation errors


def test_chunked_body_over_the_limit_is_413(http: httpx.Client) -> None:
    """No Content-Length to check up front: the limit applies while the body streams in."""

    def body() -> Iterator[bytes]:
        yield b'{"suite": "' + FAKE.encode() + b'", "labels": {"pad": "'
        for _ in range(30):
            yield b"x" * 1000
        yield b'"}}'

    r = http.post("/api/v1/jobs", content=body(), headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["detail"] == "request body exceeds the limit of 20000 bytes"


def test_demo_queues_the_quick_jobs_into_an_empty_store(tmp_path: Path) -> None:
    """`gdnval serve --demo`: capability, gdn-op and cp-layer quick CPU jobs when the store has
    none (a verdict table, a matrix and plots on the first page), never a second set."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(db_url=f"sqlite:///{tmp_path / 'demo.db'}", executor="local", dispatch=False)
    for _ in range(2):
        with TestClient(create_app(settings, demo=True)) as client:
            jobs = client.get("/api/v1/jobs").json()["items"]
    got = sorted((j["suite"], j["preset"], j["device"], j["world_size"], j["labels"]) for j in jobs)
    assert got == [("capability", "quick", "cpu", 1, {"demo": "true"}),
                   ("cp-layer", "quick", "cpu", 2, {"demo": "true"}),
                   ("gdn-op", "quick", "cpu", 1, {"demo": "true"})]
    assert next(j for j in jobs if j["suite"] == "gdn-op")["params"] == {"backends": ["eager"]}
