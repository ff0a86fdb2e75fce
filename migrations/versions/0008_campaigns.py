"""Campaigns: the jobs one report needs, queued together from a plan, and their link to the jobs.

Revision ID: 0008_campaigns
Revises: 0007
Create Date: 2026-12-02 05:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_campaigns"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "campaign",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("plan_name", sa.String(length=60), nullable=False),
        sa.Column("plan_version", sa.Integer(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("device", sa.String(length=10), nullable=False),
        sa.Column("world_sizes", sa.JSON(), nullable=False),
        sa.Column("commit_id", sa.Integer(), nullable=True),
        sa.Column("backends", sa.JSON(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["commit_id"], ["commit.id"], name=op.f("fk_campaign_commit_id_commit"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaign")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_campaign_idempotency_key")),
    )
    op.create_index(op.f("ix_campaign_plan_name"), "campaign", ["plan_name"])
    op.create_table(
        "campaign_job",
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=100), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaign.id"], name=op.f("fk_campaign_job_campaign_id_campaign"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_campaign_job_job_id_job"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("campaign_id", "job_id", name=op.f("pk_campaign_job")),
        sa.UniqueConstraint("campaign_id", "key", name=op.f("uq_campaign_job_campaign_id_key")),
    )
    op.create_index("ix_campaign_job_job_id", "campaign_job", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_campaign_job_job_id", table_name="campaign_job")
    op.drop_table("campaign_job")
    op.drop_index(op.f("ix_campaign_plan_name"), table_name="campaign")
    op.drop_table("campaign")
