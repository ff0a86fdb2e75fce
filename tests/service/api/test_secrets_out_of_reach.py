"""Job code cannot read the service's secrets. A backend source written here tries, in its build
(`setup.py`, run by the isolated build) and at import (in the rank): it reads its own
environment, the `environ`, `cmdline` and `mem` of every process above it, and the secret file
of the service; it reports what it could read and which secret it found. Against real servers
(`gdnval serve`, SQLite, the local executor) holding an API token and a session secret:

- the service as root, its API token in a secret file (`GDNVAL_SECRETS_DIR`, mode 0600) and its
  session secret in its environment, job code as another user (`GDNVAL_JOB_USER=nobody`);
- the service itself as an unprivileged user, its secrets in its environment, job code as the
  same user: the service is non-dumpable, so its `/proc` files are not that user's to read.

Neither the build nor the import finds a secret or reads the service's environment or memory.
The other user runs an interpreter of its own (this project's packages on its path): the
machine's may live where only root can reach it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.api_support import make_server

pytestmark = pytest.mark.slow  # real servers, a backend build, a rank
API_TOKEN = "api-token-7d1c0e5b"  # distinctive: searched for in every byte the probe reads
SESSION_SECRET = "session-secret-91f3a2c4"
CASE = "T65_stateless_hqk1_hv2_b1_eager"

PROBE = '''
import errno, json, os

SECRETS = {secrets!r}
REPORT, SECRET_FILE = {report!r}, {secret_file!r}


def probe(where):
    found, read = [], []

    def look(name, data):
        read.append(name)
        found.extend(f"{{s}} in {{name}}" for s in SECRETS if s.encode() in data)

    look("own environment", "\\n".join(f"{{k}}={{v}}" for k, v in os.environ.items()).encode())
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{{pid}}/stat", "rb") as f:
            parent = int(f.read().rsplit(b")", 1)[1].split()[1])
        if pid != os.getpid():
            for part in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{{pid}}/{{part}}", "rb") as f:
                        look(f"{{pid}}/{{part}}", f.read())
                except OSError:
                    pass
            try:
                with open(f"/proc/{{pid}}/mem", "rb"):
                    read.append(f"{{pid}}/mem")
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM):
                    read.append(f"{{pid}}/mem ({{exc}})")
        pid = parent
    try:
        with open(SECRET_FILE, "rb") as f:
            look("the secret file", f.read())
    except OSError:
        pass
    with open(REPORT, "a") as f:
        f.write(json.dumps({{"where": where, "uid": os.getuid(), "pid": os.getpid(), "found": found,
                            "read": read}}) + "\\n")
'''
SETUP = "import probe\nprobe.probe('build')\nfrom setuptools import setup\nsetup()\n"
PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "secret-probe"
version = "0.1.0"

[project.entry-points."gdnval.backends"]
secretprobe = "secretprobe:core"

[tool.setuptools]
py-modules = ["probe"]
packages = ["secretprobe"]
"""
CORE = "import probe\nprobe.probe('import')\n\n\ndef core(*args, **kwargs):\n    raise NotImplementedError\n"


@pytest.fixture
def nobody() -> pwd.struct_passwd:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux): to run job code, or the service, as another user")
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")


def _as(user: pwd.struct_passwd) -> tuple[str, ...]:
    """A command prefix that runs what follows as `user`, environment kept."""
    return ("setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--")


@pytest.fixture
def base(nobody: pwd.struct_passwd) -> Iterator[Path]:
    """A folder every user may enter (pytest's own may not be), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="gdnval-secrets-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def job_python(base: Path, nobody: pwd.struct_passwd) -> str:
    """An interpreter `nobody` may run, with this environment's packages on its path: a venv of a
    system Python of the same minor version (skipped where there is none)."""
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(minor, path="/usr/bin:/usr/local/bin")
    if system is None:
        pytest.skip(f"no system {minor} that another user may run")
    venv = base / "job-venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (venv / "lib" / minor / "site-packages" / "gdnval-env.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n")
    python = str(venv / "bin" / "python")
    probe = subprocess.run([*_as(nobody), python, "-c", "import torch"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot import this environment's packages: {probe.stderr.strip()[-300:]}")
    return python


def _backend(base: Path, secret_file: Path, requirement: bool = False) -> tuple[str, Path]:
    """The probe's repository (its source `git+<repo>@<sha>`, or with `requirement` a direct
    reference to the folder) and the report it writes to."""
    report = base / "reports" / "report.jsonl"
    report.parent.mkdir()
    report.parent.chmod(0o777)
    repo = base / "repo"
    files = {"probe.py": PROBE.format(secrets=[API_TOKEN, SESSION_SECRET], report=str(report),
                                      secret_file=str(secret_file)),
             "setup.py": SETUP, "pyproject.toml": PYPROJECT, "secretprobe/__init__.py": CORE}
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "probe"]):
        subprocess.run([*git, *args], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    if requirement:
        return f"secret-probe @ file://{repo}", report
    return f"git+{repo}@{head.stdout.strip()}", report


def _run_job(server, source: str) -> dict:  # type: ignore[no-untyped-def]
    body = {"suite": "gdn-op", "params": {"backends": ["eager", "secretprobe"], "baseline": "eager",
                                          "timing": False},
            "cases": [CASE], "labels": {"backend_source": source}}
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    made = httpx.post(f"{server.base}/api/v1/jobs", json=body, headers=auth, timeout=30)
    assert made.status_code == 201, made.text
    end, url = time.monotonic() + 600, f"{server.base}/api/v1/jobs/{made.json()['id']}"
    while (job := httpx.get(url, timeout=30).json())["status"] in ("queued", "running"):
        assert time.monotonic() < end, job
        time.sleep(0.5)
    return job


def _check(report: Path, job_uid: int, service_pid: int) -> None:
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert {r["where"] for r in lines} == {"build", "import"}, lines
    for r in lines:
        assert r["uid"] == job_uid and r["found"] == [], r
        assert "own environment" in r["read"], r
        assert not {f"{service_pid}/environ", f"{service_pid}/mem"} & set(r["read"]), r  # cmdline is public
        assert "the secret file" not in r["read"], r


def _serve(workdir: Path, job_python: str, **env: str):  # type: ignore[no-untyped-def]
    bins = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # uv
    return make_server(workdir, executor="tests.support.api_support:make_job_python_executor",
                       GDNVAL_TEST_JOB_PYTHON=job_python, PATH=bins, **env)


def test_job_code_of_another_user_reads_no_secret(nobody, base: Path, job_python: str) -> None:  # type: ignore[no-untyped-def]
    secrets = base / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "gdnval_api_token").write_text(API_TOKEN)
    (secrets / "gdnval_api_token").chmod(0o600)
    source, report = _backend(base, secrets / "gdnval_api_token")
    (base / "svc").mkdir()
    server = _serve(base / "svc", job_python, GDNVAL_JOB_USER="nobody", GDNVAL_SECRETS_DIR=str(secrets),
                    GDNVAL_SESSION_SECRET=SESSION_SECRET, GDNVAL_BACKEND_CACHE=str(base / "backends"))
    server.env.pop("GDNVAL_API_TOKEN")  # from the secret file only
    server.start()
    try:
        job = _run_job(server, source)
        assert job["status"] == "succeeded", (job["error"], server.log_text())
        _check(report, nobody.pw_uid, server.proc.pid)
    finally:
        server.stop()


def test_job_code_of_the_services_own_user_reads_no_secret(nobody, base: Path, job_python: str) -> None:  # type: ignore[no-untyped-def]
    home = base / "home"
    home.mkdir()
    os.chown(base, nobody.pw_uid, nobody.pw_gid)
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    # a requirement: built straight from its folder (the system interpreter may predate the
    # tarfile filters that extracting a commit's tree uses)
    source, report = _backend(base, base / "no-secret-file", requirement=True)
    subprocess.run(["chown", "-R", f"{nobody.pw_uid}:{nobody.pw_gid}", str(base / "repo")], check=True)
    server = _serve(base, job_python, GDNVAL_API_TOKEN=API_TOKEN, GDNVAL_SESSION_SECRET=SESSION_SECRET,
                    GDNVAL_BACKEND_CACHE=str(base / "backends"), HOME=str(home),
                    GDNVAL_SNAPSHOT_CACHE=str(base / "snapshots"))
    server.python = job_python  # the service itself runs as nobody
    server.prefix = _as(nobody)
    server.start()
    try:
        job = _run_job(server, source)
        assert job["status"] == "succeeded", (job["error"], server.log_text())
        _check(report, nobody.pw_uid, server.proc.pid)
    finally:
        server.stop()
