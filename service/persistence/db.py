"""Engine, sessions and migrations of the results store.

SQLite is the default store, shared by the API, the dispatcher and (in tests) a second process.
Two things make that safe: WAL (readers never block the writer) with a busy timeout, and
taking over transaction control from pysqlite (SQLAlchemy's documented recipe): pysqlite
otherwise delays BEGIN until the first write, so a "read then update" claim would not be atomic.
Write transactions that must see a stable snapshot (`write_tx`) start with BEGIN IMMEDIATE,
which takes the write lock up front instead of failing on lock upgrade. On PostgreSQL the same
transactions take one transaction-scoped advisory lock first, so several service or dispatcher
replicas on one database serialise their read-modify-write steps exactly as SQLite does (two
first jobs of a suite would otherwise both insert its metric rows and one would fail).

A store that goes away for a while (a PostgreSQL restart, a failover, a locked SQLite file) is
waited out by the writes that must not be lost (`until_stored`): the dispatcher's job threads
retry them until the store answers again, so an outage never ends a job's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

BUSY_TIMEOUT_MS = 30_000
_IMMEDIATE = "gdnval_begin_immediate"
WRITE_LOCK_KEY = 0x6764_6E76_616C  # PostgreSQL advisory lock of `write_tx` ("gdnval")
CONNECT_TIMEOUT_S = 5  # a PostgreSQL server that does not answer a connect: an outage, not a hang
RETRY_FIRST_S, RETRY_MAX_S = 0.25, 2.0  # `until_stored`'s waits between tries, doubling
log = logging.getLogger("gdnval.store")
T = TypeVar("T")


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url`; SQLite files get WAL, foreign keys, busy timeout and explicit BEGIN."""
    if not is_sqlite(url):
        if make_url(url).get_backend_name() == "postgresql":
            kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S, **kwargs.get("connect_args", {})}
        return create_engine(url, pool_pre_ping=True, **kwargs)
    u = make_url(url)
    if u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}, **kwargs
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see module docstring)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(_IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def is_memory(url: str) -> bool:
    """An in-process SQLite database: one database per engine, so one engine must serve all."""
    u = make_url(url)
    return is_sqlite(url) and (not u.database or u.database == ":memory:")


def request_pool(url: str, reads: int) -> dict[str, Any]:
    """Pool options of the engine that requests use: room for `reads` concurrent reads (a
    streamed one holds two connections) and as many writes again, and a bounded wait so a
    shortage is answered (503), not queued for long."""
    if is_memory(url):
        return {}
    return {"pool_size": 2 * reads, "max_overflow": 2 * reads + 8, "pool_timeout": 10}


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def immediate(engine: Engine) -> Engine:
    """`engine` whose transactions begin with BEGIN IMMEDIATE on SQLite (a no-op elsewhere).

    In WAL mode a deferred transaction that reads and then writes fails at once with
    "database is locked" when another writer committed in between; taking the lock at BEGIN
    makes it wait (busy timeout) instead.
    """
    return engine.execution_options(**{_IMMEDIATE: True})


@contextmanager
def write_tx(engine: Engine) -> Iterator[Session]:
    """A session whose transaction holds the write lock from its start (SQLite: BEGIN IMMEDIATE;
    PostgreSQL: an advisory lock taken first, released at commit or rollback).

    Use it for read-modify-write steps (claims, idempotent submits) so two processes cannot both
    read the same state and act on it. Commits on success, rolls back on error.
    """
    with Session(immediate(engine), expire_on_commit=False) as session, session.begin():
        if engine.dialect.name == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": WRITE_LOCK_KEY})
        yield session


class StoreUnavailable(RuntimeError):
    """The store did not come back before the process stopped waiting (it is shutting down)."""


def first_line(exc: BaseException) -> str:
    """The driver's own message of a store error, its first line (no SQL, no parameters)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` says the store could not be reached or was busy (a connection refused or
    lost, a server shutting down or starting, a pool or lock timeout), rather than refusing what
    was asked: such a write is tried again once the store answers."""
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeout)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def until_stored(do: Callable[[], T], what: str, stop: threading.Event | None = None) -> T:
    """`do()`, tried again while the store is unreachable (`is_unreachable`) until it answers;
    `StoreUnavailable` once `stop` is set while waiting. Other errors pass through at once.

    `do` must be safe to repeat: a commit whose answer was lost with its connection may have
    happened, so a caller that appends rows checks what is there first (see StoreSink)."""
    wait, since = RETRY_FIRST_S, None
    while True:
        try:
            result = do()
        except Exception as exc:
            if not is_unreachable(exc):
                raise
            if since is None:
                since = time.monotonic()
                log.warning("the store is unreachable while %s (%s); retrying until it answers", what,
                            first_line(exc))
            if stop is None:
                time.sleep(wait)
            elif stop.wait(wait):
                raise StoreUnavailable(f"stopped waiting for the store while {what}") from exc
            wait = min(RETRY_MAX_S, wait * 2)
            continue
        if since is not None:
            log.warning("the store answers again: %s after %.1f s", what, time.monotonic() - since)
        return result


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Any:
    """Alembic configured in code (no alembic.ini), so migrations run from an installed wheel."""
    from alembic.config import Config

    import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).resolve().parent))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` (the service calls this on start). Processes that open
    one store at once (`gdnval run`s side by side on a new file) each migrate holding the
    store's write lock, as `write_tx` does: the later ones wait, then find the work done."""
    from alembic import command

    with immediate(engine).begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": WRITE_LOCK_KEY})
        command.upgrade(alembic_config(conn), revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()
