"""Where a job's case came from when the job did not measure it itself.

`case_result.source_job_id`: the job whose run measured the case, when this job took the case's
rows from it instead of running it (a backend gate's head job takes the reference backend's
cases from the base job when only the backend changed: `service.persistence.resume.take_cases`).
NULL: the job measured the case itself. A plain id, no foreign key: the copied rows stand on
their own if the source job is deleted.

Revision ID: 0013_case_result_source_job
Revises: 0012_finds
Create Date: 2026-12-05 14:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_case_result_source_job"
down_revision: str | None = "0012_finds"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("case_result", sa.Column("source_job_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("case_result", "source_job_id")
