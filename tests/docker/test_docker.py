"""docker/: the compose file's services, healthchecks, restart policies and profiles, and every
repository path it or its Dockerfiles name.

`docker compose config` validates the file where the compose plugin is installed; everywhere the
YAML itself is checked. Absolute paths (host devices, the Ascend driver) belong to the
deployment host and are documented in docs/deploy.md instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _dockerfiles() -> list[tuple[Path, Path]]:
    """(context, dockerfile) of every service that builds an image."""
    out = []
    for svc in _compose()["services"].values():
        build = svc.get("build")
        if build:
            context = (DOCKER / build["context"]).resolve()
            out.append((context, context / build.get("dockerfile", "Dockerfile")))
    return out


WORKERS = {"worker-cuda": "cuda", "worker-npu": "npu", "worker-cpu": "cpu"}
COMPOSE_ENV = {"RAY_AUTH_TOKEN": "t", "GDNVAL_DB_PASSWORD": "p", "GDNVAL_API_TOKEN": "a"}


def test_compose_has_a_store_a_head_the_service_and_workers() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "ray-head", "service", *WORKERS}
    assert services["ray-head"]["command"] == ["gdnval-ray-head"]  # docker/ray-head.sh in the image
    head = (DOCKER / "ray-head.sh").read_text()
    assert "ray start --head --port=6379" in head and "ray_driver --listen 0.0.0.0:6380" in head
    service_image = (DOCKER / "Dockerfile.service").read_text()
    assert "COPY docker/ray-head.sh /usr/local/bin/gdnval-ray-head" in service_image
    env = services["service"]["environment"]
    # no raylet in the service's container: its Ray driver runs on the head, through the listener
    assert env["GDNVAL_EXECUTOR"] == "ray" and env["GDNVAL_RAY_DRIVER"] == "ray-head:6380"
    assert "GDNVAL_RAY_ADDRESS" not in env
    url = env["GDNVAL_DB_URL"]
    assert url.startswith("postgresql+psycopg://gdnval:") and "@postgres:5432/" in url
    assert services["service"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for worker in WORKERS:
        assert "--address=ray-head:6379" in services[worker]["command"]
    gpus = services["worker-cuda"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpus["capabilities"] == ["gpu"] and "count" not in gpus  # its own device set, not `count: all`
    assert '--resources={"cpu_node": 1}' in services["worker-cpu"]["command"]  # CPU ranks land only here


def test_every_long_running_service_has_a_healthcheck_and_a_restart_policy() -> None:
    services = _compose()["services"]
    for name, svc in services.items():
        check = svc.get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL") and check.get("interval"), name
        assert svc.get("restart") in ("unless-stopped", "always"), name
    assert "/readyz" in " ".join(services["service"]["healthcheck"]["test"])
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])


def test_profiles_start_one_device_family_and_workers_cannot_be_scaled() -> None:
    services = _compose()["services"]
    for name in ("postgres", "ray-head", "service"):
        assert "profiles" not in services[name], name  # always started
    for name, family in WORKERS.items():
        assert services[name]["profiles"] == [family], name  # `--profile npu` starts no CUDA worker
        assert services[name]["container_name"], name  # a fixed name: `--scale` is refused
    npu = services["worker-npu"]
    assert not any(re.search(r"davinci\d", d) for d in npu["devices"])  # the NPUs come from a variable
    assert npu["environment"]["ASCEND_VISIBLE_DEVICES"].startswith("${GDNVAL_NPU_DEVICES")
    mounts = {v.split(":")[0] for v in npu["volumes"]}
    assert mounts == {"/usr/local/dcmi", "/usr/local/bin/npu-smi", "/usr/local/Ascend/driver",
                      "/etc/ascend_install.info"}


def test_ray_token_authentication_is_on_for_every_ray_process() -> None:
    services = _compose()["services"]
    for name in ("ray-head", "service", *WORKERS):
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_AUTH_TOKEN"].startswith("${RAY_AUTH_TOKEN:?"), name  # required, never a default
    assert "127.0.0.1:8265:8265" in services["ray-head"]["ports"]  # the dashboard stays on the host


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="the docker compose plugin is not installed (the YAML checks above still run)",
)
def test_docker_compose_config_accepts_every_profile() -> None:
    out = subprocess.run(
        ["docker", "compose", "-f", str(DOCKER / "compose.yaml"), "--profile", "cuda", "--profile", "npu",
         "--profile", "cpu", "config", "--quiet"],
        capture_output=True, text=True, env={**os.environ, **COMPOSE_ENV}, timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_every_repository_path_named_by_compose_and_the_dockerfiles_exists() -> None:
    pairs = _dockerfiles()
    assert {df.name for _, df in pairs} == {"Dockerfile.service", "Dockerfile.cuda"} | {"Dockerfile.npu"}
    for context, dockerfile in pairs:
        assert context == ROOT and dockerfile.is_file(), dockerfile
        assert (dockerfile.parent / f"{dockerfile.name}.dockerignore").is_file()
        for line in dockerfile.read_text().splitlines():
            m = re.match(r"^COPY\s+(?!--from)(.+)\s+\S+$", line.strip())
            if m:
                for src in m.group(1).split():
                    assert (context / src).exists(), f"{dockerfile.name}: COPY source {src} is missing"
    for name, svc in _compose()["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).resolve().exists(), f"{name}: volume source {source} is missing"


def test_deploy_doc_covers_the_cluster() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    for needle in ("ray start --head", "ray start --address", "GDNVAL_RAY_ADDRESS", "GDNVAL_DB_URL",
                   "num-gpus", "NPU", "GDNVAL_REPO", "Upgrading", "RAY_AUTH_TOKEN", "cpu_node",
                   "GDNVAL_PLACEMENT", "postgresql+psycopg", "runtime_env", "docs/npu.md"):
        assert needle in doc, needle
