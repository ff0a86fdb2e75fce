"""Ray stopped and started again under a live service: a real server process (`gdnval serve`,
SQLite, the Ray executor) and a real local Ray cluster (`ray.cluster_utils.Cluster`: a head
without resources and one 2-CPU node), stopped for good and replaced by a new cluster (a new
cluster id) at the same GCS address.

The service stays up throughout (same process, `/healthz` 200); `/readyz` turns 503 within
seconds of the stop and 200 once the new cluster places work; the 2-rank job that ran during
the stop is re-queued without spending an attempt and then passes, keeping the cases it had
finished; a job submitted afterwards passes.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.api_support import TOKEN, make_server
from tests.support.ports import free_port
from tests.support.waiting import wait_until as _wait

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # Ray clusters and a real server

AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXECUTOR = "tests.support.suites:make_ray_executor"


def _cluster(gcs_port: int):  # type: ignore[no-untyped-def]
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "gcs_server_port": gcs_port})
    c.add_node(num_cpus=2, resources={"cpu_node": 1})
    return c


def _readyz(base: str) -> httpx.Response:
    return httpx.get(f"{base}/readyz", timeout=10)


def _job(base: str, job_id: int) -> dict:
    return httpx.get(f"{base}/api/v1/jobs/{job_id}", timeout=10).json()


def _ended(base: str, job_id: int) -> dict | None:
    job = _job(base, job_id)
    return job if job["status"] in ("succeeded", "failed", "cancelled") else None


def _submit(base: str, params: dict) -> int:
    body = {"suite": "probe", "world_size": 2, "params": params}
    made = httpx.post(f"{base}/api/v1/jobs", json=body, headers=AUTH, timeout=30)
    assert made.status_code == 201, made.text
    return int(made.json()["id"])


def test_the_service_outlives_a_ray_restart_and_requeues_the_job_it_ran(tmp_path: Path) -> None:
    if ray.is_initialized():
        ray.shutdown()
    port = free_port()
    first = _cluster(port)
    second = None
    server = make_server(tmp_path, executor=EXECUTOR, GDNVAL_RAY_ADDRESS=first.address)
    try:
        server.start(timeout=90)  # ready: the service's Ray driver joined and placed a group
        pid = server.proc.pid
        # the `bounded` case sleeps while `hold` exists: the job is mid-run when the cluster goes,
        # and its re-run (the file gone by then) goes straight on
        hold = tmp_path / "hold"
        hold.touch()
        job_id = _submit(server.base, {"repeats": 1, "pause_s": 120, "hold_file": str(hold)})
        _wait(lambda: _job(server.base, job_id)["progress"]["done"] >= 1, 90, "the first case ended")
        first.shutdown()
        not_ready = _wait(lambda: (r := _readyz(server.base)).status_code == 503 and r, 15, "/readyz 503")
        assert not_ready.json()["checks"]["executor"], not_ready.text
        requeued = _wait(lambda: (j := _job(server.base, job_id))["status"] == "queued" and j, 30,
                         "the running job is re-queued")
        assert requeued["attempts"] == 1 and requeued["error"] is None, requeued
        assert httpx.get(f"{server.base}/healthz", timeout=10).status_code == 200
        refused = httpx.post(f"{server.base}/api/v1/jobs", json={"suite": "probe", "world_size": 2},
                             headers=AUTH, timeout=30)
        assert refused.status_code == 503, refused.text

        hold.unlink()
        second = _cluster(port)
        _wait(lambda: _readyz(server.base).status_code == 200, 120, "ready again")
        done = _wait(lambda: _ended(server.base, job_id), 180, "the re-queued job ends")
        assert (done["status"], done["verdict"]) == ("succeeded", "passed"), (done, server.log_text())
        assert done["attempts"] == 2, done
        events = httpx.get(f"{server.base}/api/v1/jobs/{job_id}/events", params={"kind": "status"}).json()
        lost = [e["data"] for e in events["items"] if (e["data"] or {}).get("cluster_lost")]
        assert len(lost) == 1 and "the Ray driver ended" in lost[0]["reason"], events
        logs = httpx.get(f"{server.base}/api/v1/jobs/{job_id}/events", params={"kind": "log"}).json()
        assert any("keeps 1 case(s)" in e["message"] for e in logs["items"]), "the finished case was kept"

        after = _submit(server.base, {"repeats": 1})
        assert _wait(lambda: _ended(server.base, after), 180, "the new job ends")["status"] == "succeeded"
        assert server.proc.poll() is None and server.proc.pid == pid  # one service process throughout
    finally:
        server.stop()
        first.shutdown()
        if second is not None:
            second.shutdown()
