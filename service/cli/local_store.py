"""The results store the CLI opens itself (`gdnval run`, `compare`, `push`, `report`): the one
`--db` / `GDNVAL_DB_URL` names (the service's default, the SQLite file `gdnval.db`). A plain
path names a SQLite file. Every failure to open it is one line and exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from service.cli.client import fail

db_option = click.option(
    "--db", "db_url", envvar="GDNVAL_DB_URL", default=None,
    help="results store: SQLAlchemy URL or SQLite file [env GDNVAL_DB_URL; default gdnval.db]",
)


def store_installed() -> bool:
    """Whether this machine has what the results store needs (SQLAlchemy, Alembic)."""
    from importlib.util import find_spec

    try:
        return all(find_spec(name) is not None for name in ("sqlalchemy", "alembic"))
    except ImportError:  # a finder that refuses the name outright
        return False


def store_url(db_url: str | None) -> str:
    """The store's URL: `db_url`, else the settings' (GDNVAL_DB_URL, else sqlite:///gdnval.db),
    a relative SQLite file made absolute (so the CLI can say where it wrote)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from service.settings import Settings

    url = Settings(**({"db_url": db_url} if db_url else {})).db_url
    if "://" not in url:  # a plain path names a SQLite file
        return f"sqlite:///{Path(url).resolve()}"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        fail(f"--db {url!r} is not a database URL: {exc}")
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return f"sqlite:///{Path(str(parsed.database)).resolve()}"
    return url


def shown(url: str) -> str:
    """The URL as it may be printed (no password)."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def open_store(db_url: str | None, *, create: bool = False) -> Any:
    """An engine on the store, migrated to this code's schema. Without `create`, the store must
    exist and hold gdnval results (a typo in --db must not leave an empty database behind); with
    it, a missing SQLite file is created and migrated (what `gdnval db upgrade` does)."""
    if not store_installed():
        fail("the results store needs sqlalchemy and alembic, which are not installed here; "
             "install gdnval's service dependencies (pip install gdnval)")
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from service.persistence.db import make_engine, upgrade

    url = store_url(db_url)
    parsed = make_url(url)
    file_db = parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")
    if not create and file_db and not Path(str(parsed.database)).is_file():
        fail(f"no results store at {parsed.database} (from --db / GDNVAL_DB_URL)")
    try:
        engine = make_engine(url)
        if create:
            upgrade(engine)
        elif not inspect(engine).has_table("job"):
            fail(f"{shown(url)} holds no gdnval results (no 'job' table)")
    except (SQLAlchemyError, OSError) as exc:
        fail(f"cannot open the results store {shown(url)}: {' '.join(str(exc).split())[:300]}")
    return engine
