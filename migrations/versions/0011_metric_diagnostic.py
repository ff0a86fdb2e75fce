"""Whether a metric is judged or a diagnostic, stored with its definition and its summaries.

`metric.diagnostic`: the suite's declaration (`workers.suite.Metric.diagnostic`): a diagnostic
(an element-wise max-relative or max-abs error, a raw trajectory) is recorded and shown, never
judged. `summary.diagnostic`: the declaration a job was judged with, copied like its kind and
bound (NULL on rows written before: the metric's is read). Existing definitions are filled by
the rule the suites now declare explicitly: an accuracy or trajectory metric without a bound is
a diagnostic; every job refreshes its suite's definitions anyway.

Revision ID: 0011_metric_diagnostic
Revises: 0010_campaign_backend_source
Create Date: 2026-12-05 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_metric_diagnostic"
down_revision: str | None = "0010_campaign_backend_source"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("metric", sa.Column("diagnostic", sa.Boolean(), nullable=True))
    op.add_column("summary", sa.Column("diagnostic", sa.Boolean(), nullable=True))
    op.execute(
        "UPDATE metric SET diagnostic = CASE WHEN kind IN ('accuracy', 'trajectory') AND bound IS NULL "
        "THEN TRUE ELSE FALSE END"
    )


def downgrade() -> None:
    op.drop_column("summary", "diagnostic")
    op.drop_column("metric", "diagnostic")
