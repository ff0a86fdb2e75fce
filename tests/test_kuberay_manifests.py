"""The KubeRay manifests hang together: a RayCluster with an autoscaler, a CPU worker group and
a GPU group that scales from zero, token auth on every Ray process and the service, the
service's declared maximum equal to what the worker groups may grow to, the service's Ray driver
in the head pod (beside the head's raylet, reached through the head's Service), and every Secret
the manifests read created in docs/deploy.md."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from service.settings import Settings

KUBERAY = Path(__file__).resolve().parents[1] / "deploy" / "kuberay"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((KUBERAY / name).read_text()) if d]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _authed(env: dict[str, Any]) -> bool:
    return env.get("RAY_AUTH_MODE") == "token" and env.get("RAY_AUTH_TOKEN") == {
        "secretKeyRef": {"name": "gdnval-ray-auth", "key": "token"}}


def test_the_ray_cluster_autoscales_a_gpu_group_from_zero_with_auth_on() -> None:
    (cluster,) = _docs("raycluster.yaml")
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True and _authed(_env(spec["autoscalerOptions"]))
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no ranks on the head
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    assert json.loads(json.loads(groups["cpu"]["rayStartParams"]["resources"])) == {"cpu_node": 1}
    assert (groups["gpu"]["minReplicas"], groups["gpu"]["replicas"]) == (0, 0)  # scales from zero
    assert groups["gpu"]["maxReplicas"] > 0
    gpu = groups["gpu"]["template"]["spec"]["containers"][0]["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == gpu["requests"]["nvidia.com/gpu"] == "8"
    pods = [spec["headGroupSpec"], *groups.values()]
    assert all(_authed(_env(c)) for p in pods for c in p["template"]["spec"]["containers"])


def test_the_service_declares_what_the_worker_groups_may_grow_to() -> None:
    kinds = [(d["kind"], d["metadata"]["name"]) for d in _docs("service.yaml")]
    assert kinds == [("StatefulSet", "gdnval-postgres"), ("Service", "gdnval-postgres"),
                     ("Deployment", "gdnval"), ("Service", "gdnval")]
    deployment = next(d for d in _docs("service.yaml") if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    assert _authed(env) and env["GDNVAL_EXECUTOR"] == "ray"
    assert env["GDNVAL_DB_URL"].endswith("@gdnval-postgres:5432/gdnval")
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    declared = Settings(ray_max_resources=json.loads(env["GDNVAL_RAY_MAX_RESOURCES"])).ray_max_resources
    (cluster,) = _docs("raycluster.yaml")
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    cpu = [n for n in declared if "cpu_node" in n]
    gpu = [n for n in declared if "GPU" in n]
    assert (len(cpu), len(gpu)) == (groups["cpu"]["maxReplicas"], groups["gpu"]["maxReplicas"])
    gpu_limits = groups["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert all(n["GPU"] == float(gpu_limits["nvidia.com/gpu"]) for n in gpu)


def _secret_refs(doc: Any) -> set[str]:
    """The names of the Secrets a manifest reads (secretKeyRef), anywhere in it."""
    if isinstance(doc, dict):
        found = {doc["secretKeyRef"]["name"]} if "secretKeyRef" in doc else set()
        return found.union(*(_secret_refs(v) for v in doc.values()))
    if isinstance(doc, list):
        return set().union(*(_secret_refs(v) for v in doc))
    return set()


def test_the_service_reaches_its_ray_driver_in_the_head_pod() -> None:
    (cluster,) = _docs("raycluster.yaml")
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    containers = {c["name"]: c for c in head["containers"]}
    assert set(containers) == {"ray-head", "gdnval-driver"}
    driver = containers["gdnval-driver"]
    assert driver["args"][:4] == ["python", "-m", "workers.executors.ray_driver", "--listen"]
    port = int(driver["args"][4].rpartition(":")[2])
    on_service = containers["ray-head"]["ports"]  # KubeRay puts the head container's ports on its Service
    assert {"name": "gdnval-driver", "containerPort": port} in on_service
    assert _env(driver)["GDNVAL_RAY_ADDRESS"] == "127.0.0.1:6379"
    for c in containers.values():  # the driver finds the head's raylet and object store
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts == {"/tmp/ray": "ray-session", "/dev/shm": "ray-shm"}, c["name"]
    assert {v["name"] for v in head["volumes"]} == {"ray-session", "ray-shm"}
    deployment = next(d for d in _docs("service.yaml") if d["kind"] == "Deployment")
    env = _env(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["GDNVAL_RAY_DRIVER"] == f"{cluster['metadata']['name']}-head-svc:{port}"
    assert "GDNVAL_RAY_ADDRESS" not in env
    assert env["GDNVAL_API_TOKEN"] == {"secretKeyRef": {"name": "gdnval-api", "key": "token"}}


def test_every_secret_the_manifests_read_is_created_in_the_docs() -> None:
    docs = [d for name in ("raycluster.yaml", "service.yaml") for d in _docs(name)]
    refs = set().union(*(_secret_refs(d) for d in docs))
    assert refs == {"gdnval-ray-auth", "gdnval-db", "gdnval-api"}
    doc = (KUBERAY.parents[1] / "docs" / "deploy.md").read_text()
    created = set(re.findall(r"kubectl create secret generic (\S+)", doc))
    assert refs <= created, refs - created
