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

import os
from collections.abc import Iterable, Mapping

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
