"""Fresh results stores for the tests: a SQLite file, or a new database on the session's
PostgreSQL server (tests/support/postgres_server.py), migrated to the latest revision."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

STORES = ("sqlite", "postgresql")


@contextmanager
def store_url(request: pytest.FixtureRequest, kind: str, sqlite_file: Path) -> Iterator[str]:
    """The URL of a fresh, empty store of `kind`: a SQLite file, or a new PostgreSQL database."""
    if kind == "sqlite":
        yield f"sqlite:///{sqlite_file}"
        return
    if kind != "postgresql":
        raise ValueError(f"unknown store kind {kind!r}; expected one of {STORES}")
    server = request.getfixturevalue("postgres")
    name = server.create_database()
    try:
        yield server.url(name)
    finally:
        server.drop_database(name)


@contextmanager
def migrated_engine(url: str) -> Iterator[Any]:
    """An engine on the store at `url`, upgraded to the latest migration; disposed on exit."""
    from service.persistence import db

    eng = db.make_engine(url)
    db.upgrade(eng)
    try:
        yield eng
    finally:
        eng.dispose()


def sqlite_job_row(db: Path, job_id: int) -> tuple[str, int, str | None]:
    """(status, attempts, error) of a job, read from a SQLite store through a read-only
    connection (a server may be writing it)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT status, attempts, error FROM job WHERE id = ?", (job_id,)).fetchone()
    finally:
        con.close()
