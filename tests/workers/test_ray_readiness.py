"""Readiness against a real Ray cluster (`ray.cluster_utils.Cluster`): `/readyz` reports the
alive nodes and resources per kind once the service's Ray driver joined the cluster and placed a
group, and is not ready within seconds of the cluster stopping; a submit then answers 503 naming
the cluster, in seconds. The service process never joins the cluster: its driver process does."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def _readyz(client, status: int, within_s: float):  # type: ignore[no-untyped-def]
    """The first `/readyz` answer with `status`, asked every 0.2 s for up to `within_s`."""
    end = time.monotonic() + within_s
    while (answer := client.get("/readyz")).status_code != status:
        assert time.monotonic() < end, answer.text
        time.sleep(0.2)
    return answer


def test_readyz_follows_the_cluster_and_submit_answers_503_when_it_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient
    from ray.cluster_utils import Cluster

    from service.api.routes import health
    from service.app import create_app
    from service.settings import Settings

    monkeypatch.setattr(health, "EXECUTOR_CHECK_TTL_S", 0.0)
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        c.add_node(num_cpus=2, resources={"cpu_node": 1})
        address = c.address
        settings = Settings(db_url=f"sqlite:///{tmp_path / 'r.db'}", executor="ray",
                            ray_address=address, dispatch=False)
        with TestClient(create_app(settings)) as client:
            ready = _readyz(client, 200, 60)  # once the service's Ray driver joined and placed a group
            cluster = ready.json()["checks"]["cluster"]
            assert cluster["address"] == address and cluster["nodes"] == 2
            assert cluster["resources"]["CPU"] == 2 and cluster["resources"]["cpu_node"] == 1
            c.shutdown()
            t0 = time.monotonic()
            gone = _readyz(client, 503, 5)
            assert gone.json()["status"] == "not ready"
            assert f"the Ray cluster at {address} is unreachable" in gone.json()["checks"]["executor"]
            assert "cluster" not in gone.json()["checks"]
            job = {"suite": "capability", "device": "cpu", "world_size": 1}
            refused = client.post("/api/v1/jobs", json=job)
            assert refused.status_code == 503, refused.text
            assert f"the Ray cluster at {address} is unreachable" in refused.text
            assert time.monotonic() - t0 < 15
            assert client.get("/api/v1/jobs").json()["items"] == []
    finally:
        c.shutdown()
        if ray.is_initialized():
            ray.shutdown()


def _requested() -> list[dict]:
    """The bundles the autoscaler is asked for, as Ray stores the request (no autoscaler runs)."""
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    if is_autoscaler_v2():
        from ray.autoscaler.v2.sdk import get_cluster_resource_state
        from ray.experimental.internal_kv import internal_kv_get_gcs_client

        state = get_cluster_resource_state(internal_kv_get_gcs_client())
        return [dict(r.resources_bundle) for c in state.cluster_resource_constraints
                for req in c.resource_requests for r in [req.request] * req.count]
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return json.loads(raw) if raw else []


def test_a_job_wider_than_the_alive_nodes_asks_for_nodes_and_starts_when_one_comes() -> None:
    """With a declared maximum of two CPU nodes and one alive, a 3-rank job is accepted, waits
    with its bundles requested from the autoscaler (a cancel withdraws them), and runs once a
    second node joins; its request is withdrawn when it is placed."""
    from ray.cluster_utils import Cluster

    from tests.support.suites import RecordingSink
    from workers.executors.base import JobSpec
    from workers.executors.ray_executor import RayExecutor
    from workers.registry import SUITE_MODULES

    if ray.is_initialized():
        ray.shutdown()
    node = {"CPU": 2, "cpu_node": 1}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    SUITE_MODULES["probe"] = "tests.support.suites"
    try:
        c.add_node(num_cpus=2, resources={"cpu_node": 1})
        ex = RayExecutor(address=c.address, max_nodes=[node, node], node_wait_s=60)
        assert (ex.most_ranks("cpu"), ex.alive_ranks("cpu")) == (4, 2)
        bundle = ex.bundle("cpu")

        def start(job_id: int) -> tuple[RecordingSink, threading.Event, dict, threading.Thread]:
            sink, cancel, result = RecordingSink(), threading.Event(), {}
            spec = JobSpec(job_id=job_id, suite="probe", world_size=3, deadline_s=120)
            t = threading.Thread(target=lambda: result.update(outcome=ex.run(spec, sink, cancel)))
            t.start()
            end = time.monotonic() + 30
            while _requested() != [bundle] * 3:
                assert time.monotonic() < end and t.is_alive(), (result, _requested())
                time.sleep(0.2)
            while not sink.waits:  # the request goes out just before the wait is reported
                assert time.monotonic() < end and t.is_alive(), result
                time.sleep(0.1)
            assert any("requested from the autoscaler" in line for line in sink.logs), sink.logs
            assert len(sink.waits) == 1 and sink.waits[0] in sink.logs
            assert sink.waits[0].startswith(f"waiting for 3 x {bundle} (PACK)"), sink.waits
            return sink, cancel, result, t

        _, cancel, result, t = start(1)
        cancel.set()
        t.join(30)
        assert result["outcome"].status == "cancelled" and _requested() == []

        sink, _, result, t = start(2)
        c.add_node(num_cpus=2, resources={"cpu_node": 1})
        t.join(90)
        assert result["outcome"].status == "succeeded", result["outcome"].error
        assert _requested() == [] and sink.waits[-1] is None  # placed: the ranks start
        ranks = next(i["ranks"] for i in sink.infos if "ranks" in i)
        placed = next(i for i in sink.infos if "distinct_nodes" in i)
        assert placed == {"placement": "PACK", "distinct_nodes": len({r["node_id"] for r in ranks})} == {
            "placement": "PACK", "distinct_nodes": 2}
    finally:
        SUITE_MODULES.pop("probe", None)
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def test_a_job_waiting_for_nodes_reads_queued_with_its_reason_in_api_page_and_cli(tmp_path: Path) -> None:
    """Served for real (uvicorn, dispatcher, Ray executor): a 3-rank job with one of two declared
    CPU nodes alive is claimed and waits for a node; the API, the list filters, the job page and
    `gdnval jobs` all say `queued` and what it waits for. A second node starts it: it turns
    `running`, then succeeds, and its status events tell that story."""
    import httpx
    import uvicorn
    from click.testing import CliRunner
    from ray.cluster_utils import Cluster

    from service.app import create_app
    from service.cli import main
    from service.settings import Settings
    from tests.support.ports import free_port
    from workers.registry import SUITE_MODULES

    if ray.is_initialized():
        ray.shutdown()
    node = {"CPU": 2, "cpu_node": 1}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    SUITE_MODULES["probe"] = "tests.support.suites"
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    try:
        c.add_node(num_cpus=2, resources={"cpu_node": 1})
        settings = Settings(db_url=f"sqlite:///{tmp_path / 'w.db'}", executor="ray", ray_address=c.address,
                            ray_max_resources=[node, node], ray_node_wait_s=120, poll_interval_s=0.1,
                            artifacts_dir=tmp_path / "art")
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                               log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as http:
            end = time.monotonic() + 60
            while not server.started:
                assert time.monotonic() < end and thread.is_alive(), "the server did not start"
                time.sleep(0.1)
            _readyz(http, 200, 60)  # the service's Ray driver joined the cluster
            wide = {"suite": "probe", "world_size": 3, "params": {"repeats": 1}}
            made = http.post("/api/v1/jobs", json=wide)
            assert made.status_code == 201, made.text
            job_id = made.json()["id"]

            def job() -> dict:
                return http.get(f"/api/v1/jobs/{job_id}").json()

            end = time.monotonic() + 60
            while not job()["waiting_for"]:
                assert time.monotonic() < end and job()["status"] in ("queued", "running"), job()
                time.sleep(0.2)
            waiting = job()
            reason = waiting["waiting_for"]
            assert waiting["status"] == "queued" and waiting["progress"]["message"] == reason
            assert reason.startswith("waiting for 3 x {'CPU': 1.0, 'cpu_node': 0.001} (PACK): more than the "
                                     "alive nodes hold, requested from the autoscaler")
            ids = {st: [j["id"] for j in http.get("/api/v1/jobs", params={"status": st}).json()["items"]]
                   for st in ("queued", "running")}
            assert ids == {"queued": [job_id], "running": []}
            page = http.get(f"/jobs/{job_id}").text
            assert 'class="badge st-queued"' in page and "requested from the autoscaler" in page
            listed = CliRunner().invoke(main, ["jobs", "--server", base])
            assert listed.exit_code == 0, listed.output
            rows = listed.output.splitlines()
            row = next(line for line in rows if line.strip("│ ").startswith(str(job_id)))
            assert "queued" in row and "waiting for 3 x" in row and "requested from the autoscaler" in row

            c.add_node(num_cpus=2, resources={"cpu_node": 1})
            end = time.monotonic() + 120
            while job()["status"] not in ("succeeded", "failed", "cancelled"):
                assert time.monotonic() < end, job()
                time.sleep(0.2)
            done = job()
            assert done["status"] == "succeeded", done["error"]
            assert done["waiting_for"] is None and done["info"]["distinct_nodes"] == 2
            events = http.get(f"/api/v1/jobs/{job_id}/events", params={"kind": "status"}).json()["items"]
            assert [e["message"] for e in events] == ["queued", "running", "queued", "running", "succeeded"]
            assert events[2]["data"]["waiting_for"] == reason and events[3]["data"]["placed"] is True
    finally:
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(30)
        SUITE_MODULES.pop("probe", None)
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
