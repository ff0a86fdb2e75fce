"""The environment of code the service runs on a job's behalf: rank processes (both executors)
and backend-source installs.

That code is whatever a commit or a third-party backend holds, so it must never see the
service's secrets (the API token, the database URL with its password, the session secret).
The environment is therefore built from an allow-list, not by copying the service's: the
variables a Python process, the accelerator stacks, the collectives and the compilers read,
plus what the operator names in `GDNVAL_RANK_ENV` (comma-separated names, e.g. a licence
server a backend needs). The secrets are refused even when named there.

An environment without secrets is not enough where job code can read its parent: a process of
the same user may read the service's `/proc/<pid>/environ` (the environment it was started with,
secrets included) and memory. Two more walls, here:

- `protect_process` makes the service (and the Ray driver) non-dumpable: its `/proc/<pid>/environ`
  and `mem` then belong to root, so no other process of its user reads them and none can ptrace it;
- `GDNVAL_JOB_USER` (honoured where the process runs as root): job code (the ranks, a backend
  source's build and its dependency check) runs as that user instead, which can read neither a
  root process's `/proc` files nor root's secret files. `JobUser` hands that user the folders it
  writes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXTRA_ENV = "GDNVAL_RANK_ENV"
JOB_USER_ENV = "GDNVAL_JOB_USER"
PR_SET_DUMPABLE = 4
SECRETS = frozenset({"GDNVAL_API_TOKEN", "GDNVAL_DB_URL", "GDNVAL_SESSION_SECRET"})

# A process, its locale and temporary files; the interpreter; compilers Triton and builds call.
NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "LANG", "LANGUAGE",
    "TMPDIR", "TEMP", "TMP", "XDG_CACHE_HOME",
    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS",
    "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "CC", "CXX",
    "CUBLAS_WORKSPACE_CONFIG", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    # the runtime's own, non-secret settings
    "GDNVAL_COLLECTIVES", "GDNVAL_SNAPSHOT_CACHE", "FLA_FLASH_QLA",
})
# Accelerator stacks, collectives, rendezvous, Triton, torch and OpenMP.
PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "ASCEND_", "HCCL_", "NCCL_", "GLOO_", "MASTER_", "TRITON_",
            "TORCH_", "PYTORCH_", "OMP_", "KMP_")
# What pip and git need to fetch a backend source (proxies, indexes, certificates, ssh agent).
INSTALL_NAMES = frozenset({
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "SSH_AUTH_SOCK",
})
INSTALL_PREFIXES = ("PIP_", "GIT_", "UV_")


def _extra_names(source: Mapping[str, str]) -> set[str]:
    return {n.strip() for n in source.get(EXTRA_ENV, "").split(",") if n.strip()}


def job_environment(
    source: Mapping[str, str] | None = None, *, install: bool = False, extra: Iterable[str] = ()
) -> dict[str, str]:
    """The allow-listed part of `source` (default: this process's environment) for job code;
    `install` adds what pip and git need; `extra` names further variables to keep. Never a
    secret of the service, whatever asks for it."""
    source = os.environ if source is None else source
    names = NAMES | (INSTALL_NAMES if install else frozenset()) | _extra_names(source) | set(extra)
    prefixes = PREFIXES + (INSTALL_PREFIXES if install else ())
    return {
        k: v for k, v in source.items()
        if k not in SECRETS and (k in names or k.startswith(prefixes))
    }


@dataclass(frozen=True)
class JobUser:
    """The user job code runs as (`GDNVAL_JOB_USER`), when this process may switch to it."""

    name: str
    uid: int
    gid: int
    home: str

    def popen(self) -> dict[str, Any]:
        """`subprocess.Popen` arguments that start the child as this user (no other groups)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def hand_over(self, *paths: str | Path) -> None:
        """Make `paths` (and everything under them) this user's, so its processes write there."""
        for path in paths:
            os.chown(path, self.uid, self.gid)
            for root, dirs, files in os.walk(path):
                for name in (*dirs, *files):
                    os.chown(os.path.join(root, name), self.uid, self.gid, follow_symlinks=False)

    def home_or(self, fallback: str | Path) -> str:
        """The user's home when it can write there, else `fallback` (a folder handed to it)."""
        home = Path(self.home)
        if home.is_dir() and home.stat().st_uid == self.uid:
            return str(home)
        return str(fallback)


def job_user(source: Mapping[str, str] | None = None) -> JobUser | None:
    """The user named by `GDNVAL_JOB_USER` (a name or a uid), None when unset; ValueError when it
    does not exist or this process, not running as root, cannot start processes as it."""
    name = (os.environ if source is None else source).get(JOB_USER_ENV, "").strip()
    if not name:
        return None
    import pwd

    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"{JOB_USER_ENV}={name!r} names no user of this machine; expected a user name "
                         "or uid (e.g. nobody)") from None
    if os.geteuid() != 0:
        raise ValueError(f"{JOB_USER_ENV}={name!r}, but this process runs as uid {os.geteuid()}, not "
                         "root: it cannot start job code as another user; unset it or run as root")
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def protect_process() -> bool:
    """Make this process non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): its `/proc/<pid>/environ`
    and `mem` become root's and other processes of its user can neither read them nor ptrace
    it. False where the platform has no prctl."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


CANCEL_POLL_S = 0.2  # how often a job command's wait looks at its cancel event


class CommandCancelled(RuntimeError):
    """A job command was ended because its job was cancelled."""


def run_job_command(
    cmd: Sequence[str], *, timeout: float, cancel: threading.Event | None = None, install: bool = False,
    cwd: str | Path | None = None, extra_env: Mapping[str, str] | None = None, user: JobUser | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run code fetched or built for a job (git, pip, uv, a build backend) to its end, with
    output captured as text: in the job environment (`install` adds what fetchers need,
    `extra_env` goes on top), as `user` when given, in a session of its own whose whole process
    group is killed when `cancel` is set (`CommandCancelled`, within `CANCEL_POLL_S`) or
    `timeout` passes (`subprocess.TimeoutExpired`)."""
    env = {**job_environment(install=install), **(extra_env or {})}
    proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env, start_new_session=True,
                            **(user.popen() if user is not None else {}))
    end = time.monotonic() + timeout
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=CANCEL_POLL_S)
                return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                if cancel is not None and cancel.is_set():
                    name = Path(cmd[0]).name
                    raise CommandCancelled(f"{name} was stopped: its job was cancelled") from None
                if time.monotonic() > end:
                    raise subprocess.TimeoutExpired(proc.args, timeout) from None
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
