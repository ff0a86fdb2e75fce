"""The environment of code the service runs on a job's behalf: rank processes (both executors)
and backend-source installs.

That code is whatever a commit or a third-party backend holds, so it must never see the
service's secrets (the API token, the database URL with its password, the session secret).
The environment is therefore built from an allow-list, not by copying the service's: the
variables a Python process, the accelerator stacks, the collectives and the compilers read,
plus what the operator names in `GDNVAL_RANK_ENV` (comma-separated names, e.g. a licence
server a backend needs). The secrets are refused even when named there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

EXTRA_ENV = "GDNVAL_RANK_ENV"
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


CANCEL_POLL_S = 0.2  # how often a job command's wait looks at its cancel event


class CommandCancelled(RuntimeError):
    """A job command was ended because its job was cancelled."""


def run_job_command(
    cmd: Sequence[str], *, timeout: float, cancel: threading.Event | None = None, install: bool = False,
    cwd: str | Path | None = None, extra_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run code fetched or built for a job (git, pip, uv, a build backend) to its end, with
    output captured as text: in the job environment (`install` adds what fetchers need,
    `extra_env` goes on top), in a session of its own whose whole process group is killed when
    `cancel` is set (`CommandCancelled`, within `CANCEL_POLL_S`) or `timeout` passes
    (`subprocess.TimeoutExpired`)."""
    env = {**job_environment(install=install), **(extra_env or {})}
    proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env, start_new_session=True)
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
