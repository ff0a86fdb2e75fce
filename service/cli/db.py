"""`gdnval db`: schema migrations of the results store (sqlalchemy/alembic imported lazily)."""

from __future__ import annotations

import click


@click.group()
def db() -> None:
    """The results store's schema."""


def _engine(db_url: str | None):
    from service.persistence import db as store_db
    from service.settings import Settings

    settings = Settings(**({"db_url": db_url} if db_url else {}))
    return store_db, store_db.make_engine(settings.db_url), settings.db_url


@db.command()
@click.option("--db-url", default=None, help="SQLAlchemy URL [env GDNVAL_DB_URL; sqlite:///gdnval.db]")
@click.option("--revision", default="head", show_default=True)
def upgrade(db_url: str | None, revision: str) -> None:
    """Migrate the store to REVISION (creates it if it does not exist)."""
    store_db, engine, url = _engine(db_url)
    before = store_db.current_revision(engine)
    store_db.upgrade(engine, revision)
    click.echo(f"{url}: {before or 'empty'} -> {store_db.current_revision(engine)}")
    engine.dispose()


@db.command()
@click.option("--db-url", default=None, help="SQLAlchemy URL [env GDNVAL_DB_URL]")
def current(db_url: str | None) -> None:
    """Print the store's schema revision and the newest one this code knows."""
    store_db, engine, url = _engine(db_url)
    click.echo(f"{url}: at {store_db.current_revision(engine) or 'empty'}, head {store_db.head_revision()}")
    engine.dispose()
