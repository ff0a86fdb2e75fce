"""A throwaway PostgreSQL server for the tests: Debian's `postgresql` package, started in a temp dir.

One server per test session (initdb + start take a few seconds), a fresh database per test
(`CREATE DATABASE` is a file copy of template1: milliseconds). PostgreSQL refuses to run as
root, so as root the server runs as the `postgres` user the package creates. It listens on a
free loopback port and on a unix socket in its own directory, with trust authentication for
local connections only, and is stopped (`pg_ctl stop -m immediate`) and deleted at the end.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port

DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"  # Debian's layout: one bin dir per major version


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine (the package is not installed)."""


def find_bindir() -> Path:
    """The newest Debian `postgresql-N` bin directory, or the one holding `pg_ctl` on PATH."""
    dirs = sorted(glob.glob(DEBIAN_BIN_GLOB), key=lambda d: int(Path(d).parent.name or 0))
    for d in reversed(dirs):
        if (Path(d) / "pg_ctl").is_file() and (Path(d) / "initdb").is_file():
            return Path(d)
    found = shutil.which("pg_ctl")
    if found and (Path(found).resolve().parent / "initdb").is_file():
        return Path(found).resolve().parent
    raise PostgresUnavailable(
        f"no PostgreSQL server binaries (looked in {DEBIAN_BIN_GLOB} and PATH); "
        "install Debian's `postgresql` package (scripts/bootstrap.sh test does)"
    )


@dataclass
class PostgresServer:
    """A running server; `url(db)` is the SQLAlchemy URL of one of its databases."""

    bindir: Path
    root: Path
    port: int
    options: str = ""

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self) -> str:
        """A new empty database; returns its name."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def halt(self) -> None:
        """Stop the server the way an operator or a failover does (connections are cut), keeping
        its data for `resume`."""
        _as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"])

    def resume(self) -> None:
        """Start a halted server again on the same port, with the same data."""
        log = str(self.root / "server.log")
        _as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", log, "-o", self.options,
                      "-w", "-t", "60", "start"])
        _wait_ready(self)

    def stop(self) -> None:
        _as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w", "stop"],
                     check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _as_postgres(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `cmd` as the `postgres` user when we are root (the server refuses root)."""
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            raise PostgresUnavailable("running as root but `runuser` is missing to drop to user postgres")
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    # cwd: a directory user postgres may enter (the test's cwd may be closed to it)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir())
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {res.returncode}: {res.stderr[-2000:]}")
    return res


def start_server() -> PostgresServer:
    """initdb into a new temp dir and start the server; raises PostgresUnavailable without binaries."""
    bindir = find_bindir()
    if os.geteuid() == 0:
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise PostgresUnavailable("running as root, and no `postgres` user to run the server") from exc
    root = Path(tempfile.mkdtemp(prefix="gdnval-pg-"))
    if os.geteuid() == 0:
        os.chown(root, pw.pw_uid, pw.pw_gid)
    port = free_port()
    opts = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
            "-c shared_buffers=32MB")
    server = PostgresServer(bindir, root, port, opts)
    try:
        _as_postgres([str(bindir / "initdb"), "-D", str(server.datadir), "-U", "postgres", "-A", "trust",
                      "-E", "UTF8", "--no-sync", "--no-instructions"])
        server.resume()
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: PostgresServer, timeout: float = 30.0) -> None:
    import psycopg

    end = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres"):
                return
        except psycopg.OperationalError:
            if time.monotonic() > end:
                log = (server.root / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"postgres on {server.port} not ready in {timeout:g} s: {log}") from None
            time.sleep(0.2)
