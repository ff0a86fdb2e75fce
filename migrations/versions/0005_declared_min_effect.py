"""A metric's minimum effect is stored as declared: NULL when the suite declares none.

Until now the store kept the kind's default in its place, so a reader could not tell a declared
5 % from the default one, and the rule that depends on it (on cpu an undeclared time counts only
beyond `workers.verdict.CPU_TIME_MIN_EFFECT`; a declared one is the metric's own) could not be
applied to stored definitions. Existing rows equal to their kind's default become NULL (every
job refreshes its suite's definitions, so a declared value that happened to equal the default is
written back by the suite's next job).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the kinds' defaults when this revision was written (workers.verdict.MIN_EFFECT then)
_KIND_DEFAULTS = {"time": 0.05, "memory": 0.01, "accuracy": 1.0, "trajectory": 1.0, "check": 0.0}
_NOT_DEFAULT = " OR ".join(f"(kind = '{k}' AND min_effect = {v})" for k, v in _KIND_DEFAULTS.items())


# A new column swapped in by plain ADD / DROP / RENAME COLUMN (SQLite >= 3.35 has them): a batch
# rebuild of `metric` would drop the table the samples and summaries reference, and SQLite's
# cascade would delete their rows.
def _swap(fill_sql: str, nullable: bool) -> None:
    op.add_column("metric", sa.Column("min_effect_new", sa.Float(), nullable=True))
    op.execute(f"UPDATE metric SET min_effect_new = {fill_sql}")
    op.drop_column("metric", "min_effect")
    op.execute("ALTER TABLE metric RENAME COLUMN min_effect_new TO min_effect")
    if not nullable and op.get_bind().dialect.name != "sqlite":  # SQLite cannot add NOT NULL later
        op.alter_column("metric", "min_effect", existing_type=sa.Float(), nullable=False)


def upgrade() -> None:
    _swap(f"CASE WHEN {_NOT_DEFAULT} THEN NULL ELSE min_effect END", nullable=True)


def downgrade() -> None:
    cases = " ".join(f"WHEN kind = '{k}' THEN {v}" for k, v in _KIND_DEFAULTS.items())
    _swap(f"COALESCE(min_effect, CASE {cases} ELSE 0.05 END)", nullable=False)
