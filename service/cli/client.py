"""Shared bits of the CLI commands that talk to a running service over HTTP (httpx, lazily).

Every failure to get an answer is one line on stderr and exit 2 ("could not run"): a service
that is down or unreachable (`connected`), or one that refused the request (`fail_on_error`,
which prints the problem's `detail`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click

from service.domain.exit_codes import COULD_NOT_RUN

server_option = click.option(
    "--server", envvar="GDNVAL_SERVER", default="http://127.0.0.1:8000", show_default=True,
    help="base URL of the service [env GDNVAL_SERVER]",
)
token_option = click.option(
    "--token", envvar="GDNVAL_API_TOKEN", default=None, help="bearer token [env GDNVAL_API_TOKEN]"
)


def fail(message: str) -> NoReturn:
    """One line on stderr, exit 2: the command could not do its work."""
    click.echo(f"error: {' '.join(message.split())}", err=True)
    raise SystemExit(COULD_NOT_RUN)


def client(server: str, token: str | None) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=30.0)


@contextmanager
def connected(server: str, token: str | None) -> Iterator[Any]:
    """`client(...)` whose transport errors (refused, unreachable, timed out) end the command
    with one line and exit 2 instead of a traceback."""
    import httpx

    try:
        with client(server, token) as http:
            yield http
    except httpx.TransportError as exc:
        reason = str(exc) or type(exc).__name__
        fail(f"cannot reach the service at {server.rstrip('/')}: {reason} (is `gdnval serve` running?)")


def fail_on_error(resp: Any) -> Any:
    """The decoded JSON of a 2xx answer; otherwise exit 2 with the server's reason."""
    if resp.status_code < 300:
        return resp.json()
    try:
        detail = resp.json().get("detail")
    except (json.JSONDecodeError, AttributeError):
        detail = resp.text
    if not isinstance(detail, str):
        detail = json.dumps(detail)
    fail(f"{resp.request.method} {resp.request.url.path} -> {resp.status_code}: {detail}")


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
