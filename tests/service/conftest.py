"""Fixtures of the service tests: the session's PostgreSQL server and a fresh results store per
test, on SQLite and on PostgreSQL unless a test's `stores` marker names fewer kinds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.stores import STORES, migrated_engine, store_url


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that needs `db_url` (directly or through `engine`) runs once per store kind;
    the PostgreSQL runs are `slow` (a server for the session, a database per test): the fast tier
    keeps SQLite's."""
    if "db_url" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("stores")
    kinds = marker.args if marker else STORES
    unknown = [k for k in kinds if k not in STORES]
    if unknown:
        raise ValueError(f"stores marker names {unknown}; expected kinds from {STORES}")
    params = [pytest.param(k, marks=pytest.mark.slow) if k == "postgresql" else k for k in kinds]
    metafunc.parametrize("db_url", params, indirect=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """One PostgreSQL server for the session (see tests/support/postgres_server.py); skipped only
    where the server binaries or the driver are not installed."""
    from tests.support.postgres_server import PostgresUnavailable, start_server

    pytest.importorskip("psycopg", reason="the PostgreSQL driver (extra `postgres`) is not installed")
    try:
        server = start_server()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh, empty store of the kind this test instance runs on."""
    with store_url(request, request.param, tmp_path / "store.db") as url:
        yield url


@pytest.fixture
def engine(db_url: str) -> Iterator[Any]:
    """An engine on a fresh store at `db_url`, migrated to the latest revision."""
    with migrated_engine(db_url) as eng:
        yield eng
