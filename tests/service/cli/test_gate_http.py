"""`gdnval gate` and `gdnval report` as a user runs them: CLI processes against a real server.

The server (create_app, uvicorn in a thread) runs jobs with the local executor on snapshots of a
temporary repository (GDNVAL_REPO), so every job runs its own commit's code: commit C plants a
slow-down in the test-only `gatetime` suite. The CLI resolves refs and the parent in `--repo`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tests.support.cli import gdnval_here
from tests.support.gate_suite import NOISE_ENV, SUITE_MODULE, make_repo, serve_in_thread
from tests.support.ports import free_port
from workers.job_env import EXTRA_ENV


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    from service.executor_choice import close_executors
    from service.settings import Settings
    from workers.registry import SUITE_MODULES, get_suite

    tmp = tmp_path_factory.mktemp("gatehttp")
    repo = tmp / "repo"
    repo.mkdir()
    shas = make_repo(repo)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(SUITE_MODULES, "gatetime", SUITE_MODULE)
        get_suite.cache_clear()
        mp.setenv("GDNVAL_REPO", str(repo))
        mp.setenv("GDNVAL_SNAPSHOT_CACHE", str(tmp / "snapshots"))
        close_executors()  # an executor cached by another test would not know this repository
        settings = Settings(db_url=f"sqlite:///{tmp / 'svc.db'}", artifacts_dir=tmp / "artifacts",
                            executor="local", poll_interval_s=0.3, lease_s=60.0)
        try:
            with serve_in_thread(settings) as url:
                yield SimpleNamespace(url=url, repo=repo, shas=shas, tmp=tmp, mp=mp)
        finally:
            close_executors()
            get_suite.cache_clear()


@pytest.mark.slow
def test_gate_cli_exit_codes_and_report(server: SimpleNamespace) -> None:
    repo, url = str(server.repo), server.url
    verdict = server.tmp / "slow.json"
    # HEAD is D (timing as B); gate C against its parent B, found by the CLI in --repo
    slow = gdnval_here("gate", "--head", "HEAD~1", "--suite", "gatetime", "--repo", repo, "--server", url,
               "--poll", "0.2", "--json", str(verdict))
    assert slow.exit_code == 1, slow.stdout + slow.stderr
    assert "❌ FAIL" in slow.stdout and "regressed" in slow.stdout
    data = json.loads(verdict.read_text())
    assert data["exit_code"] == 1 and data["head"] == server.shas["C"] and data["base"] == server.shas["B"]
    (cmp,) = data["comparisons"]
    metric = next(m for c in cmp["cases"] for m in c["metrics"] if m["metric"] == "sleep_ms")
    assert metric["verdict"] == "regressed" and metric["ratio"] > 1.3
    assert f"{url}/jobs/" in slow.stdout  # numbers link to the job pages

    # D's code under test is byte-identical to B's (the runtime's and the suite module's bytes):
    # without a job of its own, D is judged by B's job, and nothing runs
    twin_json = server.tmp / "twin.json"
    twin = gdnval_here("gate", "--head", "HEAD", "--base", "HEAD~2", "--suite", "gatetime", "--repo", repo,
               "--server", url, "--poll", "0.2", "--json", str(twin_json))
    assert twin.exit_code == 0, twin.stdout + twin.stderr
    roles = {j["role"]: j for j in json.loads(twin_json.read_text())["jobs"]}
    assert roles["head"]["reused"] and roles["head"]["commit"] == server.shas["B"], roles

    # D measured anew (--fresh), its first run slow once (noise): the gate passes
    flag = server.tmp / "noise-once"
    flag.write_text("slow once")
    server.mp.setenv(NOISE_ENV, str(flag))
    server.mp.setenv(EXTRA_ENV, NOISE_ENV)  # named for the ranks: they get an allow-listed environment
    noisy_json = server.tmp / "noisy.json"
    noisy = gdnval_here("gate", "--head", "HEAD", "--base", "HEAD~2", "--suite", "gatetime", "--repo", repo,
                "--server", url, "--poll", "0.2", "--confirm", "--fresh", "--json", str(noisy_json))
    assert not flag.exists()  # the head's first run consumed it
    assert noisy.exit_code == 0, noisy.stdout + noisy.stderr
    # byte-identical code: D's slow run is shown, never judged, so there is nothing to confirm
    noisy_data = json.loads(noisy_json.read_text())
    assert noisy_data["confirmations"] == []
    (noisy_metric,) = [m for c in noisy_data["comparisons"][0]["cases"] for m in c["metrics"]
                       if m["metric"] == "sleep_ms"]
    assert noisy_metric["verdict"] == "changed" and "byte-identical" in noisy_metric["reason"], noisy_metric

    # the unchanged pair: D against B, without --confirm; both jobs are reused (D's newest job
    # is the re-run), so the gate costs no run
    same = gdnval_here("gate", "--head", "HEAD", "--base", "HEAD~2", "--suite", "gatetime", "--repo", repo,
               "--server", url, "--poll", "0.2")
    assert same.exit_code == 0, same.stdout + same.stderr
    assert "✅ PASS" in same.stdout and same.stdout.count("| reused |") == 2

    # the executor can never give 64 CPU ranks: refused at once, exit 2
    never = gdnval_here("gate", "--head", "HEAD", "--suite", "gatetime", "--repo", repo, "--server", url,
                "--world-size", "64")
    assert never.exit_code == 2, never.stdout + never.stderr
    assert "world_size 64" in never.stdout

    # the report of the slow head job against its base, through the API
    head_job = next(j["job_id"] for j in data["jobs"] if j["role"] == "head")
    base_job = next(j["job_id"] for j in data["jobs"] if j["role"] == "base")
    rep = gdnval_here("report", str(head_job), "--base", str(base_job), "--server", url)
    assert rep.exit_code == 0, rep.stderr
    for section in ("## Environment and backends", "## Suite gatetime", "## Against the base",
                    "## Conclusions"):
        assert section in rep.stdout, section
    # the service has no public URL: its loopback address is never a link a reader could not open
    assert "](" not in rep.stdout and "127.0.0.1" not in rep.stdout
    assert f"| gatetime | #{head_job} | #{base_job} | FAIL |" in rep.stdout
    assert "sleep_ms" in rep.stdout and "🔴 regressed" in rep.stdout

    import httpx

    got = httpx.get(f"{url}/api/v1/compare", params={"base": base_job, "head": head_job}).json()
    assert got["passed"] is False and got["counts"]["regressed"] == 1
    params = {"base_commit": server.shas["B"], "head_commit": server.shas["C"][:10], "suite": "gatetime"}
    by_commit = httpx.get(f"{url}/api/v1/compare", params=params).json()
    newest_b = next(j["job_id"] for j in noisy_data["jobs"] if j["role"] == "base")  # --fresh measured B anew
    assert (by_commit["base"]["job_id"], by_commit["head"]["job_id"]) == (newest_b, head_job)

    # a gate that gives up waiting has no verdict yet: exit 3 (README's table), never "could not run"
    waited = gdnval_here("gate", "--head", "HEAD", "--base", "HEAD~1", "--suite", "gatetime", "--repo", repo,
                 "--server", url, "--fresh", "--timeout", "0.3", "--poll", "0.1", "--param", "repeats=2")
    assert waited.exit_code == 3, waited.stdout + waited.stderr
    assert "NO VERDICT YET (exit 3)" in waited.stdout and "gave up waiting after 0.3 s" in waited.stdout


def test_gate_cli_with_the_server_down_exits_2(server: SimpleNamespace) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    down = gdnval_here("gate", "--head", "HEAD", "--base", "HEAD~1", "--repo", str(server.repo),
                       "--server", dead, "--json", str(server.tmp / "down.json"))
    assert down.exit_code == 2, down.stdout + down.stderr
    assert "unreachable" in down.stdout
    assert json.loads((server.tmp / "down.json").read_text())["verdict"] == "error"


def test_gate_api_rejects_unknown_suites_with_the_reason(server: SimpleNamespace) -> None:
    import httpx

    resp = httpx.post(f"{server.url}/api/v1/gate", json={"head": server.shas["B"], "suites": ["nope"]})
    assert resp.status_code == 422 and "unknown suite 'nope'" in resp.json()["detail"]
    resp = httpx.get(f"{server.url}/api/v1/jobs/999999/report")
    assert resp.status_code == 404 and "no job 999999" in resp.json()["detail"]
    resp = httpx.get(f"{server.url}/api/v1/compare", params={"base": 1})
    assert resp.status_code == 422 and "give exactly one of head" in resp.json()["detail"]
    resp = httpx.get(f"{server.url}/api/v1/compare", params={"base": 1, "head_commit": "abc1234"})
    assert resp.status_code == 422 and "needs suite=NAME" in resp.json()["detail"]


@pytest.mark.slow
def test_report_of_real_quick_jobs(server: SimpleNamespace) -> None:
    """Real suites' quick jobs (capability; gdn-op with the eager backend, as the Triton
    interpreter takes minutes on CPU) run by the executor; their report shows their numbers."""
    import httpx

    ids = []
    for body in ({"suite": "capability", "preset": "quick", "params": {"process_checks": False}},
                 {"suite": "gdn-op", "preset": "quick", "params": {"backends": ["eager"]}}):
        resp = httpx.post(f"{server.url}/api/v1/jobs", json=body)
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["id"])
    deadline = time.monotonic() + 240
    for job_id in ids:
        while (job := httpx.get(f"{server.url}/api/v1/jobs/{job_id}").json())["status"] not in (
            "succeeded", "failed", "cancelled"
        ):
            assert time.monotonic() < deadline, job
            time.sleep(0.5)
        assert job["status"] == "succeeded", job
    rep = gdnval_here("report", *map(str, ids), "--server", server.url)
    assert rep.exit_code == 0, rep.stderr
    md = rep.stdout
    import torch

    assert f"torch {torch.__version__}" in md  # the environment the ranks reported
    assert md.startswith("# gdnval test report: capability, gdn-op @ ")  # one report of both jobs
    cap = md[md.index("## Capability and fail-fast"): md.index("## Single-device GDN accuracy")]
    # the fail-fast cases raised their expected errors, the backends' contracts hold
    assert re.search(r"\| failfast_\w+ \| raised UnsupportedGDNRequest \|", cap), cap
    assert "Every bound holds; no case errored." in md
    acc = md[md.index("## Single-device GDN accuracy"): md.index("## Single-device GDN speed and memory")]
    header = next(ln for ln in acc.splitlines() if ln.startswith("| T |"))
    assert "| o |" in header  # the tensors as columns
    o_row = next(ln for ln in acc.splitlines() if re.match(r"\| \d+K? \|", ln))  # a row of one length
    assert re.search(r"\| \d\.\d{3}e-\d\d \|", o_row)  # a real relative-L2
    speed = md[md.index("## Single-device GDN speed and memory"):]
    assert re.search(r"\| fwd\+bwd \|", speed) and re.search(r"\| \d+\.\d{3} \|", speed)

