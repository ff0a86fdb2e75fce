"""`gdnval report JOB [JOB...] [--base JOB]`: the Markdown test report of stored jobs.

Reads the store named by GDNVAL_DB_URL (or `--db`), or asks a running service (`--server`).
Numbers link to the job pages under `--link-base` (default: the configured public URL,
GDNVAL_PUBLIC_URL); a loopback address gives no links, since a reader of the report cannot open it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from service.cli.client import fail


@click.command()
@click.argument("jobs", nargs=-1, required=True, type=click.IntRange(1))
@click.option(
    "--base", "bases", multiple=True, type=click.IntRange(1), help="base job to compare with (one per suite)"
)
@click.option(
    "--db", "db_url", envvar="GDNVAL_DB_URL", default=None,
    help="store URL or SQLite file [env GDNVAL_DB_URL]",
)
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


def _open_store(db_url: str | None) -> Any:
    """An engine on an existing, migrated store; one line and exit 2 otherwise. A SQLite file that
    is not there is never created (a typo in --db must not leave an empty database behind)."""
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from service.persistence.db import make_engine
    from service.settings import Settings

    url = Settings(**({"db_url": db_url} if db_url else {})).db_url
    if "://" not in url:  # a plain path names a SQLite file
        url = f"sqlite:///{Path(url).resolve()}"
    try:
        parsed = make_url(url)
    except (SQLAlchemyError, ValueError) as exc:
        fail(f"--db {url!r} is not a database URL: {exc}")
    file_db = parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")
    if file_db and not Path(str(parsed.database)).is_file():
        fail(f"no results store at {parsed.database} (from --db / GDNVAL_DB_URL {url!r})")
    engine = make_engine(url)
    try:
        if not inspect(engine).has_table("job"):
            fail(f"{parsed.render_as_string(hide_password=True)} holds no gdnval results (no 'job' table)")
    except SQLAlchemyError as exc:
        fail(f"cannot open the results store {parsed.render_as_string(hide_password=True)}: {exc}")
    return engine


def _from_store(
    db_url: str | None, jobs: tuple[int, ...], bases: tuple[int, ...], link_base: str | None
) -> str:
    from sqlalchemy.orm import Session

    from service.domain.baselines import NotFound
    from service.presentation.report import build_report

    engine = _open_store(db_url)
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
