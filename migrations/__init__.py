"""Alembic migrations of the results store (the schema changes only through these)."""
