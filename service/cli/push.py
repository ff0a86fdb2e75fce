"""`gdnval push JOB`: send a run kept in the local results store (`gdnval run`) to a service,
which stores it as a job of its own (`POST /api/v1/runs`); a run pushed twice is stored once."""

from __future__ import annotations

import click

from service.cli.client import connected, fail, fail_on_error, server_option, token_option
from service.cli.local_store import db_option, open_store


@click.command()
@click.argument("job", type=click.IntRange(1))
@db_option
@server_option
@token_option
def push(job: int, db_url: str | None, server: str, token: str | None) -> None:
    """Send stored job JOB (a `gdnval run`) with its cases and samples to the service."""
    from sqlalchemy.orm import Session

    from service.persistence.runs import export_run

    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            doc = export_run(s, job)
    finally:
        engine.dispose()
    if doc is None:
        fail(f"no job {job} in the results store {engine.url.render_as_string(hide_password=True)}")
    if doc["status"] not in ("succeeded", "failed", "cancelled"):
        fail(f"job {job} is {doc['status']}: only a finished run can be pushed")
    with connected(server, token) as http:
        resp = http.post("/api/v1/runs", json=doc)
        stored = fail_on_error(resp)
    what = "stored" if resp.status_code == 201 else "already there"
    click.echo(f"job {job} -> {server.rstrip('/')}/jobs/{stored['id']} ({what})")
