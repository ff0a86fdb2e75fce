"""Verdicts: a job's verdict and case counts, a job's case selection, and the definition a
summary was judged with.

`job.verdict` (passed | failed | errored) and `job.case_counts` tell whether the code passed,
apart from `job.status` (whether the job ran). `job.cases` restricts a job to some cases of its
preset (the gate's re-measurements). `summary.kind`, `direction`, `bound` and `nonfinite` are
copied from the metric when the summary is written, so changing a bound later never re-judges
old jobs; existing rows take their metric's current definition (what they were shown with).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FROM_METRIC = "(SELECT metric.{col} FROM metric WHERE metric.id = summary.metric_id)"


# Plain ADD/DROP COLUMN (SQLite >= 3.35 has both): a batch rebuild of `job` would drop the
# table its children reference, and SQLite's cascade would delete their rows.
_JOB_COLUMNS = (
    ("verdict", sa.String(length=10)),
    ("case_counts", sa.JSON()),
    ("cases", sa.JSON()),
)
_SUMMARY_COLUMNS = (
    ("kind", sa.String(length=20)),
    ("direction", sa.String(length=10)),
    ("bound", sa.Float()),
)


def upgrade() -> None:
    for name, type_ in _JOB_COLUMNS:
        op.add_column("job", sa.Column(name, type_, nullable=True))
    for name, type_ in _SUMMARY_COLUMNS:
        op.add_column("summary", sa.Column(name, type_, nullable=True))
    op.add_column("summary", sa.Column("nonfinite", sa.Integer(), nullable=False, server_default="0"))
    for name, _ in _SUMMARY_COLUMNS:
        op.execute(f"UPDATE summary SET {name} = {_FROM_METRIC.format(col=name)}")
    # the old summaries stored NaN statistics when any value was NaN: count those as non-finite
    op.execute("UPDATE summary SET nonfinite = 1 WHERE median IS NULL AND count > 0")


def downgrade() -> None:
    op.drop_column("summary", "nonfinite")
    for name, _ in reversed(_SUMMARY_COLUMNS):
        op.drop_column("summary", name)
    for name, _ in reversed(_JOB_COLUMNS):
        op.drop_column("job", name)
