"""Test-wide setup. Without a GPU, Triton kernels run under its CPU interpreter."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

if shutil.which("nvidia-smi") is None:
    # Must be set before anything imports triton; GPU machines run the compiled kernels.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Intra-op threads spin against the other processes on a shared 2-core machine (30x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


STORES = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """One PostgreSQL server for the session (see tests/postgres_server.py); skipped only where
    the server binaries or the driver are not installed."""
    from tests.postgres_server import PostgresUnavailable, start_server

    pytest.importorskip("psycopg", reason="the PostgreSQL driver (extra `postgres`) is not installed")
    try:
        server = start_server()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


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


@pytest.fixture(params=STORES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store per test, once on SQLite and once on PostgreSQL."""
    with store_url(request, request.param, tmp_path / "store.db") as url:
        yield url
