"""docker/: the compose file parses, and every repository path it or its Dockerfiles name exists.

No Docker engine runs here; absolute paths (host devices, the Ascend driver) belong to the
deployment host and are documented in docs/deploy.md instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
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


def test_compose_has_a_head_the_service_and_workers() -> None:
    services = _compose()["services"]
    assert {"ray-head", "service", "worker", "worker-npu"} <= set(services)
    assert "--head" in services["ray-head"]["command"]
    env = services["service"]["environment"]
    assert env["GDNVAL_EXECUTOR"] == "ray" and env["GDNVAL_RAY_ADDRESS"] == "ray-head:6379"
    assert env["GDNVAL_DB_URL"].startswith("sqlite:////data/")  # on the named volume
    for worker in ("worker", "worker-npu"):
        assert "--address=ray-head:6379" in services[worker]["command"]
    gpus = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpus["capabilities"] == ["gpu"]


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
                   "num-gpus", "NPU", "GDNVAL_REPO", "Upgrading"):  # fmt: skip
        assert needle in doc, needle
