"""Summaries per attempt: a case's summary is stored when the case ends, tagged with the job's run.

Earlier rows were all stored at a job's end from its latest attempt, so they take the job's
attempt count. Downgrading keeps only each job's latest-attempt rows (the old key has no attempt).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 15:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# max(1, job.attempts), portable (SQLite's two-argument max is PostgreSQL's greatest)
_JOB_ATTEMPT = (
    "(SELECT CASE WHEN job.attempts > 1 THEN job.attempts ELSE 1 END FROM job WHERE job.id = summary.job_id)"
)


def upgrade() -> None:
    with op.batch_alter_table("summary", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
        batch_op.drop_constraint("uq_summary_job_id_case_id_metric_id", type_="unique")
        batch_op.create_unique_constraint(
            op.f("uq_summary_job_id_attempt_case_id_metric_id"), ["job_id", "attempt", "case_id", "metric_id"]
        )
    op.execute(f"UPDATE summary SET attempt = {_JOB_ATTEMPT}")


def downgrade() -> None:
    op.execute(f"DELETE FROM summary WHERE attempt <> {_JOB_ATTEMPT}")
    with op.batch_alter_table("summary", schema=None) as batch_op:
        batch_op.drop_constraint("uq_summary_job_id_attempt_case_id_metric_id", type_="unique")
        batch_op.create_unique_constraint(
            op.f("uq_summary_job_id_case_id_metric_id"), ["job_id", "case_id", "metric_id"]
        )
        batch_op.drop_column("attempt")
