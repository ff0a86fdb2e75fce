"""`gdnval serve`: the service (API, dispatcher, pages) under uvicorn.

fastapi, uvicorn, sqlalchemy and pydantic-settings are imported inside the command only: the
CLI also runs on device machines that have none of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from workers.executors.base import PLACEMENT_STRATEGIES

SWITCH_INTERVAL_S = 0.001


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to listen on")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--db-url", default=None, help="SQLAlchemy URL [env GDNVAL_DB_URL; sqlite:///gdnval.db]")
@click.option("--api-token", default=None, help="bearer token for writes [env GDNVAL_API_TOKEN]")
@click.option("--executor", default=None, help="local | ray [env GDNVAL_EXECUTOR; local]")
@click.option("--ray-address", default=None, help="Ray cluster address [env GDNVAL_RAY_ADDRESS]")
@click.option("--placement", default=None,
              type=click.Choice(PLACEMENT_STRATEGIES),
              help="how a job's ranks spread over Ray nodes; a job's label `placement` overrides it "
                   "[env GDNVAL_PLACEMENT; PACK]")
@click.option(
    "--artifacts-dir", default=None, type=click.Path(path_type=Path), help="[env GDNVAL_ARTIFACTS_DIR]"
)
@click.option("--max-body-bytes", default=None, type=click.IntRange(1), help="[env GDNVAL_MAX_BODY_BYTES]")
@click.option("--device-limit", "device_limits", multiple=True, metavar="KIND=N",
              help="concurrent jobs per device kind, e.g. cuda=2 [env GDNVAL_DEVICE_LIMITS as JSON]")
@click.option("--no-dispatch", is_flag=True, help="serve results only; run no jobs in this process")
@click.option("--demo", is_flag=True,
              help="queue capability, gdn-op and cp-layer quick CPU jobs when the store has no jobs")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(
    host: str, port: int, db_url: str | None, api_token: str | None, executor: str | None,
    ray_address: str | None, placement: str | None, artifacts_dir: Path | None, max_body_bytes: int | None,
    device_limits: tuple[str, ...], no_dispatch: bool, demo: bool, log_level: str,
) -> None:
    """Serve the API and pages; upgrades the store's schema and starts the dispatcher on start."""
    import uvicorn
    from pydantic import ValidationError

    from service.access_log import log_config
    from service.app import create_app
    from service.settings import Settings
    from workers.job_env import protect_process

    flags = {
        "db_url": db_url, "api_token": api_token, "executor": executor, "ray_address": ray_address,
        "placement": placement, "artifacts_dir": artifacts_dir, "max_body_bytes": max_body_bytes,
        "dispatch": False if no_dispatch else None,
        "device_limits": _limits(device_limits) if device_limits else None,
    }
    try:
        settings = Settings(**{k: v for k, v in flags.items() if v is not None})
    except (ValidationError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    protect_process()  # job code of this user cannot read our /proc environ or memory
    if settings.token() is None:
        click.echo("warning: no API token set (GDNVAL_API_TOKEN / --api-token): writes are open", err=True)
    # Requests run in threads; the event loop answers probes and 503s. A short GIL switch interval
    # hands the loop the interpreter within a millisecond of a busy request thread, not five.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # forwarded-for headers only from the proxies named (uvicorn itself trusts loopback's)
    proxies = settings.trusted_proxies.strip()
    uvicorn.run(create_app(settings, demo=demo), host=host, port=port, log_level=log_level,
                log_config=log_config(), proxy_headers=bool(proxies), forwarded_allow_ips=proxies or None)


def _limits(pairs: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pair in pairs:
        kind, sep, n = pair.partition("=")
        if not sep or not n.strip().isdigit():
            raise click.BadParameter(f"expected KIND=N (e.g. cuda=2), got {pair!r}", "--device-limit")
        out[kind.strip()] = int(n)
    return out
