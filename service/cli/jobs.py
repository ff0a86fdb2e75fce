"""`gdnval jobs`: list the service's jobs (newest first)."""

from __future__ import annotations

import click

from service.cli.client import connected, fail_on_error, server_option, token_option
from service.cli.output import console, dumps
from workers.refs import HEX_SHA


def _short(commit: str | None) -> str:
    """A full sha as its first 12 digits; a ref (or a short sha) whole."""
    if commit is None:
        return "-"
    return commit[:12] if HEX_SHA.match(commit) and len(commit) > 12 else commit


@click.command()
@click.option(
    "--status", default=None, type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled"])
)
@click.option("--suite", default=None)
@click.option("--commit", default=None, help="sha prefix or ref")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@click.option("--json", "as_json", is_flag=True, help="print the API's JSON")
@server_option
@token_option
def jobs(
    status: str | None, suite: str | None, commit: str | None, limit: int, as_json: bool, server: str,
    token: str | None,
) -> None:
    """List jobs with their status and progress; a queued job its executor already holds says
    what it waits for."""
    params = {
        k: v for k, v in {"status": status, "suite": suite, "commit": commit, "limit": limit}.items() if v
    }
    with connected(server, token) as http:
        page = fail_on_error(http.get("/api/v1/jobs", params=params))
    if as_json:
        click.echo(dumps(page))
        return
    from rich.table import Table

    table = Table("id", "status", "verdict", "suite", "preset", "device", "commit", "progress", "created")
    for j in page["items"]:
        p = j["progress"]
        progress = f"{p['done']}/{p['total']}" if p["total"] else "-"
        if j.get("waiting_for"):
            progress = j["waiting_for"]
        table.add_row(
            str(j["id"]), j["status"], j.get("verdict") or "-", j["suite"], j["preset"],
            f"{j['device']}x{j['world_size']}",
            _short(j.get("code_commit") or j["commit"]), progress,
            j["created_at"][:19].replace("T", " "),
        )
    console().print(table)
