"""Job code never sees the service's secrets: rank processes (local and Ray) and backend-source
installs get the allow-listed environment of `workers.job_env`."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.suites import RecordingSink
from workers.backend_source import install_backend_source
from workers.executors.base import JobSpec
from workers.executors.local import LocalExecutor
from workers.executors.ray_actor import actor_rank_env
from workers.job_env import EXTRA_ENV, job_environment
from workers.registry import SUITE_MODULES

TOKEN = "tok-3f9a-never-in-a-rank"
DB_URL = "postgresql+psycopg://gdnval:pg-pass-77c1@127.0.0.1:5432/gdnval"
SECRET = "session-secret-5d2e"
SERVICE_ENV = {
    "GDNVAL_API_TOKEN": TOKEN, "GDNVAL_DB_URL": DB_URL, "GDNVAL_SESSION_SECRET": SECRET,
    "GDNVAL_EXECUTOR": "local", "AWS_SECRET_ACCESS_KEY": "aws-9e1b", "PATH": "/usr/bin:/bin",
    "HOME": "/home/svc", "LC_ALL": "C.UTF-8", "CUDA_HOME": "/usr/local/cuda", "NCCL_DEBUG": "WARN",
    "PIP_INDEX_URL": "http://127.0.0.1:1/simple", "GDNVAL_COLLECTIVES": "native",
}
SECRET_VALUES = (TOKEN, DB_URL, "pg-pass-77c1", SECRET, "aws-9e1b")


def _leaks(env: dict[str, str]) -> list[str]:
    """Names of variables that carry a secret (by name or by value)."""
    named = {"GDNVAL_API_TOKEN", "GDNVAL_DB_URL", "GDNVAL_SESSION_SECRET", "AWS_SECRET_ACCESS_KEY"}
    return sorted(k for k, v in env.items() if k in named or any(s in v for s in SECRET_VALUES))


def test_the_allow_list_keeps_what_ranks_need_and_drops_the_rest() -> None:
    env = job_environment(SERVICE_ENV)
    assert _leaks(env) == []
    assert env == {"PATH": "/usr/bin:/bin", "HOME": "/home/svc", "LC_ALL": "C.UTF-8",
                   "CUDA_HOME": "/usr/local/cuda", "NCCL_DEBUG": "WARN",
                   "GDNVAL_COLLECTIVES": "native"}
    install = job_environment(SERVICE_ENV, install=True)
    assert install["PIP_INDEX_URL"] == "http://127.0.0.1:1/simple" and _leaks(install) == []


def test_the_operator_may_name_more_variables_but_never_a_secret() -> None:
    source = {**SERVICE_ENV, "LICENSE_SERVER": "lic:27000",
              EXTRA_ENV: "LICENSE_SERVER, GDNVAL_API_TOKEN,GDNVAL_DB_URL"}
    env = job_environment(source)
    assert env["LICENSE_SERVER"] == "lic:27000" and _leaks(env) == []
    assert _leaks(job_environment(source, extra=["GDNVAL_SESSION_SECRET"])) == []


def test_a_ray_ranks_environment_holds_no_secret_of_the_actor() -> None:
    """The actor inherits the environment of the service that started the cluster."""
    env = actor_rank_env("cpu", {"world_size": 2}, {"RANK": "1", "MASTER_ADDR": "10.0.0.2"}, {},
                         ["/snap/abc"], base={**SERVICE_ENV, "PYTHONPATH": "/opt/extra"})
    assert _leaks(env) == []
    assert env["RANK"] == "1" and env["MASTER_ADDR"] == "10.0.0.2" and env["HOME"] == "/home/svc"
    assert env["PYTHONPATH"] == "/snap/abc:/opt/extra" and env["TRITON_INTERPRET"] == "1"


@pytest.mark.slow
def test_a_local_rank_sees_neither_the_token_nor_the_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real two-rank job; each rank writes its whole environment as an artifact."""
    monkeypatch.setitem(SUITE_MODULES, "env-probe", "tests.support.env_probe")
    for name in ("GDNVAL_API_TOKEN", "GDNVAL_DB_URL", "GDNVAL_SESSION_SECRET", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, SERVICE_ENV[name])
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    sink = RecordingSink()
    spec = JobSpec(job_id=1, suite="env-probe", world_size=2, deadline_s=120.0)
    outcome = LocalExecutor(cpu_max_world_size=2).run(spec, sink, threading.Event())
    assert outcome.status == "succeeded", outcome.error
    envs = {name: json.loads(data) for name, _, data in sink.artifacts}
    assert sorted(envs) == ["rank0/environ.json", "rank1/environ.json"]
    for name, env in envs.items():
        assert _leaks(env) == [], name
        assert env["NCCL_DEBUG"] == "WARN" and env["WORLD_SIZE"] == "2" and env["PATH"]


SETUP_PY = """import json, os
from setuptools import setup
with open({out!r}, "w") as f:
    json.dump(dict(os.environ), f)
setup(name="envpeek", version="0.1", py_modules=[])
"""


@pytest.mark.slow
def test_a_backend_install_builds_without_the_services_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source's own build script (third-party code) records the environment it ran in."""
    out = tmp_path / "build-env.json"
    repo = tmp_path / "envpeek"
    repo.mkdir()
    (repo / "setup.py").write_text(SETUP_PY.format(out=str(out)))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "peek"], check=True)
    for name in ("GDNVAL_API_TOKEN", "GDNVAL_DB_URL", "GDNVAL_SESSION_SECRET", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, SERVICE_ENV[name])
    site = install_backend_source(f"git+{repo}@HEAD", tmp_path / "backends")
    assert site.is_dir()
    env = json.loads(out.read_text())
    assert _leaks(env) == [] and env["PATH"]
