"""Readiness against a real Ray cluster (`ray.cluster_utils.Cluster`): `/readyz` reports the
alive nodes and resources per kind while the cluster answers, and is not ready once it is
stopped; a submit then answers 503 naming the cluster, in seconds. The test process never joins
the cluster as a driver: readiness asks the GCS directly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


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
                            ray_address=address, dispatch=False)  # fmt: skip
        with TestClient(create_app(settings)) as client:
            ready = client.get("/readyz")
            assert ready.status_code == 200, ready.text
            cluster = ready.json()["checks"]["cluster"]
            assert cluster["address"] == address and cluster["nodes"] == 2
            assert cluster["resources"]["CPU"] == 2 and cluster["resources"]["cpu_node"] == 1
            c.shutdown()
            t0 = time.monotonic()
            gone = client.get("/readyz")
            assert gone.status_code == 503 and gone.json()["status"] == "not ready"
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
