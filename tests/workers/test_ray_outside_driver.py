"""A service outside the Ray cluster: the server process runs in PID and mount namespaces of its
own (`unshare`; empty `/tmp/ray` and `/dev/shm`, so no raylet, plasma store or Ray process of the
machine is visible to it, as in the compose `service` container or the KubeRay Deployment), and
reaches the cluster only through the Ray driver listener on a node of it (`python -m
workers.executors.ray_driver --listen`), which hands it a driver once it proved it holds the
cluster's Ray token. A 2-rank job passes. A connection without the token gets no driver.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from multiprocessing.connection import AuthenticationError
from pathlib import Path

import httpx
import pytest

from tests.support.api_support import ROOT, TOKEN, make_server
from tests.support.ports import free_port

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray cluster, a driver listener and a real server

AUTH = {"Authorization": f"Bearer {TOKEN}"}
# the server's namespaces: a private /proc, and empty Ray session and shared-memory folders
HIDE_RAY = "mkdir -p /tmp/ray && mount -t tmpfs none /tmp/ray && mount -t tmpfs none /dev/shm && exec \"$@\""
UNSHARE = ("unshare", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child",
           "sh", "-c", HIDE_RAY, "sh")


def _namespaces_or_skip() -> None:
    """Skip, saying why, where this machine cannot make the namespaces (no unshare, no root)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: no namespaces of its own for the service")
    probe = subprocess.run([*UNSHARE, "sh", "-c", "ls -A /tmp/ray | wc -l; ls /proc | grep -c '^[0-9]'"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make PID and mount namespaces here: {probe.stderr.strip()[-300:]}")
    files, processes = (int(x) for x in probe.stdout.split())
    assert files == 0 and processes <= 4, probe.stdout  # nothing of Ray's, no other process visible


def test_a_service_outside_the_cluster_runs_a_two_rank_job_through_the_driver_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray._private.authentication_test_utils import reset_auth_token_state
    from ray.cluster_utils import Cluster

    from workers.executors.ray_driver import connect

    _namespaces_or_skip()
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # the cluster, the listener and the service
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(16))
    reset_auth_token_state()  # this process reads the token auth settings anew
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    listener: subprocess.Popen[bytes] | None = None
    server = None
    try:
        cluster.add_node(num_cpus=2, resources={"cpu_node": 1})
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GDNVAL_RAY_ADDRESS": cluster.address}
        listener = subprocess.Popen(
            [sys.executable, "-m", "workers.executors.ray_driver", "--listen", f"127.0.0.1:{port}"],
            env=env, stdout=open(tmp_path / "listener.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        )
        end = time.monotonic() + 30
        while b"listening" not in (tmp_path / "listener.log").read_bytes():
            assert time.monotonic() < end and listener.poll() is None, (tmp_path / "listener.log").read_text()
            time.sleep(0.2)
        with pytest.raises((AuthenticationError, EOFError, OSError)):
            connect(f"127.0.0.1:{port}", b"not the token")

        server = make_server(tmp_path, executor="tests.support.suites:make_ray_executor",
                             GDNVAL_RAY_DRIVER=f"127.0.0.1:{port}")
        server.env.pop("GDNVAL_RAY_ADDRESS", None)
        server.prefix = UNSHARE
        server.start(timeout=120)
        ready = httpx.get(f"{server.base}/readyz", timeout=10).json()
        assert ready["checks"]["cluster"]["nodes"] == 2, ready

        body = {"suite": "probe", "world_size": 2, "params": {"repeats": 1}}
        made = httpx.post(f"{server.base}/api/v1/jobs", json=body, headers=AUTH, timeout=30)
        assert made.status_code == 201, made.text
        job_id = made.json()["id"]
        end = time.monotonic() + 180
        while (job := httpx.get(f"{server.base}/api/v1/jobs/{job_id}", timeout=10).json())["status"] in (
                "queued", "running"):
            assert time.monotonic() < end, job
            time.sleep(0.5)
        assert job["status"] == "succeeded" and job["verdict"] == "passed", (job["error"], server.log_text())
        ranks = job["info"]["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1] and all(r["node_id"] for r in ranks)
        assert "refused a driver connection" in (tmp_path / "listener.log").read_text()
    finally:
        if server is not None:
            server.stop()
        if listener is not None:
            listener.terminate()
            listener.wait(15)
        cluster.shutdown()
        monkeypatch.undo()
        reset_auth_token_state()
