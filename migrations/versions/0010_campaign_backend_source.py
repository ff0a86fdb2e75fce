"""The backend source of a campaign's peers, stored with the campaign.

`campaign.backend_source`: where the campaign's peer backends were installed from
(`git+<repo>@<commit>` or a pip requirement; null = already installed). Its jobs that run the peers
carry it as their `backend_source` label; on the campaign it makes a repeated idempotency key
with another source a conflict instead of the earlier campaign, and the API shows it.

Revision ID: 0010_campaign_backend_source
Revises: 0009_gates
Create Date: 2026-12-02 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_campaign_backend_source"
down_revision: str | None = "0009_gates"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("campaign", sa.Column("backend_source", sa.String(length=500), nullable=True))


def downgrade() -> None:
    op.drop_column("campaign", "backend_source")
