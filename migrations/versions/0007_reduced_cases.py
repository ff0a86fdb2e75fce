"""The rank-reduced samples of each ended case, stored as one array per (job, run, case).

Comparing two stored jobs reduced every sample over ranks in SQL and built one Python row per
(case, metric, idx): most of the compare time. A case's samples never change once it ended, so
the reduction is stored then, next to its summary rows (`service.persistence.reduced_cases`). Jobs
stored before this revision have no reduced rows and are still reduced from their samples.

`ix_summary_judged`: the definitions a run was judged with (copied onto its summary rows) are
read from the index alone, not from every summary row of the job.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 18:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "reduced_case",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_reduced_case_job_id_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["case_id"], ["case.id"], name=op.f("fk_reduced_case_case_id_case"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reduced_case")),
        sa.UniqueConstraint(
            "job_id", "attempt", "case_id", name=op.f("uq_reduced_case_job_id_attempt_case_id")
        ),
    )
    judged = ["job_id", "attempt", "metric_id", "kind", "direction", "bound"]
    op.create_index("ix_summary_judged", "summary", judged)


def downgrade() -> None:
    op.drop_index("ix_summary_judged", table_name="summary")
    op.drop_table("reduced_case")
