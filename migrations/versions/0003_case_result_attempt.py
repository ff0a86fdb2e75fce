"""Case results per attempt: a case's status is tagged with the job's run that reported it.

Without it a re-queued job showed its interrupted run's statuses until the new run reported each
case again, and a stale run could overwrite the new one's. Existing rows take the job's attempt
count (the latest run, which is what they showed). Downgrading keeps only each job's
latest-attempt rows (the old key has no attempt).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# max(1, job.attempts), portable (SQLite's two-argument max is PostgreSQL's greatest)
_JOB_ATTEMPT = (
    "(SELECT CASE WHEN job.attempts > 1 THEN job.attempts ELSE 1 END FROM job "
    "WHERE job.id = case_result.job_id)"
)


def upgrade() -> None:
    with op.batch_alter_table("case_result", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
        batch_op.drop_constraint("uq_case_result_job_id_case_id", type_="unique")
        batch_op.create_unique_constraint(
            op.f("uq_case_result_job_id_attempt_case_id"), ["job_id", "attempt", "case_id"]
        )
    op.execute(f"UPDATE case_result SET attempt = {_JOB_ATTEMPT}")


def downgrade() -> None:
    op.execute(f"DELETE FROM case_result WHERE attempt <> {_JOB_ATTEMPT}")
    with op.batch_alter_table("case_result", schema=None) as batch_op:
        batch_op.drop_constraint("uq_case_result_job_id_attempt_case_id", type_="unique")
        batch_op.create_unique_constraint(op.f("uq_case_result_job_id_case_id"), ["job_id", "case_id"])
        batch_op.drop_column("attempt")
