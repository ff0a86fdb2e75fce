"""Read indexes that keep pages flat in the size of the store.

`ix_job_status_id`: the newest jobs of one status (the compare page's recent jobs, a series'
succeeded jobs) walk the index newest-first instead of sorting every job of that status
(`ix_job_status_priority` puts priority between status and id). `ix_summary_series`: one
series' stored summaries across jobs (the history page) are read from the index instead of
probing every job's summaries.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 12:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_job_status_id", "job", ["status", "id"])
    op.create_index("ix_summary_series", "summary", ["case_id", "metric_id", "job_id"])


def downgrade() -> None:
    op.drop_index("ix_summary_series", table_name="summary")
    op.drop_index("ix_job_status_id", table_name="job")
