"""Service settings: `GDNVAL_*` environment variables, overridable by CLI flags.

One object carries everything the store, dispatcher and API need, so a test or the CLI can build
an isolated service by constructing `Settings(...)` instead of mutating the environment.

Secrets may come from files instead of the environment (`GDNVAL_SECRETS_DIR`: a folder holding
`gdnval_api_token`, `gdnval_db_url`, `gdnval_session_secret`, the way Docker and Kubernetes
mount secrets), so the process's environment, which other processes may read, never holds them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

from workers.executors.base import check_placement

DEVICES: tuple[str, ...] = ("cuda", "npu", "cpu")
BUILTIN_EXECUTORS: tuple[str, ...] = ("local", "ray")
_FACTORY_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
LINKABLE_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")
SECRETS_DIR_ENV = "GDNVAL_SECRETS_DIR"  # a folder of secret files, one per setting (see the docstring)


def is_loopback_url(url: str) -> bool:
    """Whether `url` points at this machine (localhost, 127.0.0.0/8, ::1, 0.0.0.0): a link a
    reader elsewhere cannot open."""
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", "") or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


class Settings(BaseSettings):
    """Everything configurable about one service process."""

    model_config = SettingsConfigDict(env_prefix="GDNVAL_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment, then the files of `GDNVAL_SECRETS_DIR`."""
        folder = os.environ.get(SECRETS_DIR_ENV)
        if folder and not Path(folder).is_dir():
            raise ValueError(f"{SECRETS_DIR_ENV}={folder!r} is not a folder; expected one holding a file per "
                             "secret setting (gdnval_api_token, gdnval_db_url, gdnval_session_secret)")
        files = SecretsSettingsSource(settings_cls, secrets_dir=folder) if folder else file_secret_settings
        return init_settings, env_settings, files

    db_url: str = Field("sqlite:///gdnval.db", description="SQLAlchemy URL of the results store")
    api_token: SecretStr | None = Field(None, description="bearer token required by write calls")
    protect_reads: bool = Field(False, description="also require the token for read calls")
    executor: str = Field(
        "local",
        description="executor kind: local | ray, or a 'module:factory' path (plugins, tests)",
    )
    ray_address: str | None = Field(None, description="Ray cluster address for the ray executor")
    ray_driver: str | None = Field(
        None,
        description="HOST:PORT of a Ray driver listener on a node of the cluster "
        "(`python -m workers.executors.ray_driver --listen`), for a service outside the cluster; "
        "unset: the driver is a child process of the service on this machine",
    )
    placement: str = Field(
        "PACK",
        description="how a job's ranks spread over Ray nodes: PACK | SPREAD | STRICT_PACK | STRICT_SPREAD "
        "(a job's label `placement` overrides it)",
    )
    ray_cpu_resource: str | None = Field(
        "cpu_node",
        description="marker resource of the Ray nodes that take CPU ranks (empty: CPU ranks on any node)",
    )
    ray_max_resources: list[dict[str, float]] = Field(
        default_factory=list,
        description="resources of each node the Ray cluster may grow to (JSON list, e.g. "
        '[{"CPU": 16, "GPU": 8}]): jobs that fit are queued and asked of the autoscaler',
    )
    ray_node_wait_s: float = Field(600.0, gt=0, description="how long a job waits for requested Ray nodes")
    device_limits: dict[str, int] = Field(
        default_factory=lambda: {"cuda": 1, "npu": 1, "cpu": 1},
        description="max concurrently running jobs per device kind (JSON in the environment)",
    )
    max_body_bytes: int = Field(1 << 20, ge=1, description="largest accepted request body")
    read_concurrency: int = Field(
        4, ge=1, le=256, description="reads (GET/HEAD) served at once; more wait up to read_wait_s, then 503"
    )
    read_wait_s: float = Field(1.0, gt=0, le=30, description="longest wait for a turn before a 503")
    artifacts_dir: Path = Field(Path("gdnval-artifacts"), description="where job artifacts are written")
    dispatch: bool = Field(True, description="run a dispatcher in the service process")
    poll_interval_s: float = Field(0.5, gt=0, description="how often the dispatcher looks for work")
    lease_s: float = Field(30.0, gt=0, description="a running job whose heartbeat is older is orphaned")
    max_attempts: int = Field(2, ge=1, description="runs of a job before an interruption fails it")
    job_deadline_s: float | None = Field(None, gt=0, description="wall-clock limit per job")
    stall_s: float | None = Field(
        None, gt=0,
        description="how long a rank of a running job may stay silent (its process stopped or frozen) "
        "before the job fails naming it (unset: the suite's time per case of the job's preset)",
    )
    session_secret: SecretStr | None = Field(
        None, description="signs web login sessions (unset: random per process; set it on every replica)"
    )
    session_ttl_s: float = Field(12 * 3600.0, gt=0, le=30 * 86400, description="web login session lifetime")
    trusted_proxies: str = Field(
        "",
        description="comma-separated addresses or networks of the reverse proxies whose X-Forwarded-For "
        "(and -Proto) `gdnval serve` believes; empty (the default): none, every client is the "
        "address that connected (what the wrong-token limit counts)",
    )
    server: str = Field("http://127.0.0.1:8000", description="base URL the CLI clients talk to")
    public_url: str | None = Field(
        None,
        description="public base URL of the pages, for the links of a paste-ready report "
        "(unset: the report has no links; a loopback host is refused)",
    )

    @field_validator("executor")
    @classmethod
    def _check_executor(cls, value: str) -> str:
        if value not in BUILTIN_EXECUTORS and not _FACTORY_PATH.match(value):
            raise ValueError(
                f"unknown executor {value!r}; expected one of {list(BUILTIN_EXECUTORS)} "
                "or a 'package.module:factory' path"
            )
        return value

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not LINKABLE_URL.match(value):
            raise ValueError(f"public_url {value!r} is not an http(s) URL; expected e.g. https://gdnval.example.org")
        if is_loopback_url(value):
            raise ValueError(f"public_url {value!r} names a loopback host, which a reader of the report "
                             "cannot open; expected the URL the pages are reached at from elsewhere")
        return value.rstrip("/")

    @field_validator("placement")
    @classmethod
    def _check_placement(cls, value: str) -> str:
        return check_placement(value)

    @field_validator("ray_cpu_resource")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None

    @field_validator("device_limits")
    @classmethod
    def _check_limits(cls, value: dict[str, int]) -> dict[str, int]:
        bad = {k: v for k, v in value.items() if k not in DEVICES or v < 0}
        if bad:
            raise ValueError(f"bad device limits {bad}; expected keys in {list(DEVICES)} with values >= 0")
        return {**{d: 1 for d in DEVICES}, **value}

    def token(self) -> str | None:
        return self.api_token.get_secret_value() if self.api_token else None
