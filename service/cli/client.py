"""Shared bits of the CLI commands that talk to a running service over HTTP (httpx, lazily)."""

from __future__ import annotations

import json
from typing import Any

import click

server_option = click.option(
    "--server", envvar="GDNVAL_SERVER", default="http://127.0.0.1:8000", show_default=True,
    help="base URL of the service [env GDNVAL_SERVER]",
)  # fmt: skip
token_option = click.option(
    "--token", envvar="GDNVAL_API_TOKEN", default=None, help="bearer token [env GDNVAL_API_TOKEN]"
)


def client(server: str, token: str | None) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=30.0)


def fail_on_error(resp: Any) -> Any:
    """The decoded JSON of a 2xx answer; otherwise exit 2 with the server's reason."""
    if resp.status_code < 300:
        return resp.json()
    try:
        detail = resp.json().get("detail")
    except (json.JSONDecodeError, AttributeError):
        detail = resp.text
    if not isinstance(detail, str):
        detail = json.dumps(detail, indent=1)
    click.echo(
        f"error: {resp.request.method} {resp.request.url.path} -> {resp.status_code}: {detail}", err=True
    )
    raise SystemExit(2)


def parse_pairs(pairs: tuple[str, ...], what: str, as_json: bool) -> dict[str, Any]:
    """`k=v` pairs; with `as_json`, values are JSON when they parse (8, true, [1,2]) else strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=what)
        if as_json:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value
        else:
            out[key] = value
    return out
