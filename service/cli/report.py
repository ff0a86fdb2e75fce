"""`gdnval report JOB [JOB...] [--base JOB]`: the Markdown test report of stored jobs.

Reads the store named by GDNVAL_DB_URL (or `--db`), or asks a running service (`--server`).
Numbers link to the job pages under `--link-base` (default: the configured public URL,
GDNVAL_PUBLIC_URL); a loopback address gives no links, since a reader of the report cannot open it.
"""

from __future__ import annotations

from pathlib import Path

import click

from service.cli.client import fail
from service.cli.local_store import db_option, open_store


@click.command()
@click.argument("jobs", nargs=-1, required=True, type=click.IntRange(1))
@click.option(
    "--base", "bases", multiple=True, type=click.IntRange(1), help="base job to compare with (one per suite)"
)
@db_option
@click.option(
    "--server", envvar="GDNVAL_SERVER", default=None, help="ask this service instead of opening the store"
)
@click.option("--token", envvar="GDNVAL_API_TOKEN", default=None, help="bearer token [env GDNVAL_API_TOKEN]")
@click.option("--link-base", default=None,
              help="public URL prefix of the job pages the numbers link to [default: GDNVAL_PUBLIC_URL; "
                   "a loopback address gives no links]")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write here, not stdout"
)
def report(
    jobs: tuple[int, ...], bases: tuple[int, ...], db_url: str | None, server: str | None, token: str | None,
    link_base: str | None, out: Path | None,
) -> None:
    """Render the test report of JOBS (one per suite), compared with --base jobs when given."""
    if server:
        text = _from_server(server, token, jobs, bases)
    else:
        text = _from_store(db_url, jobs, bases, link_base)
    if out is not None:
        out.write_text(text)
        click.echo(f"wrote {out}", err=True)
    else:
        click.echo(text)


def _from_store(
    db_url: str | None, jobs: tuple[int, ...], bases: tuple[int, ...], link_base: str | None
) -> str:
    from sqlalchemy.orm import Session

    from service.domain.baselines import NotFound
    from service.presentation.report import build_report

    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            text, _ = build_report(s, list(jobs), list(bases), link_base)
    except (NotFound, ValueError) as exc:
        fail(str(exc))
    finally:
        engine.dispose()
    return text


def _from_server(server: str, token: str | None, jobs: tuple[int, ...], bases: tuple[int, ...]) -> str:
    from service.cli.client import connected, fail_on_error

    with connected(server, token) as http:
        resp = http.get("/api/v1/report", params=[("job", j) for j in jobs] + [("base", b) for b in bases])
        if resp.status_code >= 300:
            fail_on_error(resp)
    return resp.text
