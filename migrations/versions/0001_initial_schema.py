"""Initial schema: commits, jobs and their events, cases, results, metrics, samples, artifacts, baselines.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 12:37:17.526744
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "case",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("suite", sa.String(length=100), nullable=False),
        sa.Column("name", sa.String(length=300), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("device", sa.String(length=10), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("expected_error", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_case")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_case_fingerprint")),
    )
    with op.batch_alter_table("case", schema=None) as batch_op:
        batch_op.create_index("ix_case_suite_name", ["suite", "name"], unique=False)

    op.create_table(
        "commit",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha", sa.String(length=255), nullable=False),
        sa.Column("repo", sa.String(length=500), nullable=True),
        sa.Column("branch", sa.String(length=255), nullable=True),
        sa.Column("parent", sa.String(length=255), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_commit")),
        sa.UniqueConstraint("sha", name=op.f("uq_commit_sha")),
    )
    op.create_table(
        "metric",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(length=100), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("unit", sa.String(length=50), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("direction", sa.String(length=10), nullable=False),
        sa.Column("bound", sa.Float(), nullable=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("min_effect", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric")),
        sa.UniqueConstraint("suite", "name", name=op.f("uq_metric_suite_name")),
    )
    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(length=100), nullable=False),
        sa.Column("preset", sa.String(length=50), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("commit_id", sa.Integer(), nullable=True),
        sa.Column("device", sa.String(length=10), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("progress_done", sa.Integer(), nullable=False),
        sa.Column("progress_total", sa.Integer(), nullable=False),
        sa.Column("progress_message", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("claimed_by", sa.String(length=200), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["commit_id"], ["commit.id"], name=op.f("fk_job_commit_id_commit"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_job_idempotency_key")),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_commit_id"), ["commit_id"], unique=False)
        batch_op.create_index("ix_job_status_priority", ["status", "priority", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_suite"), ["suite"], unique=False)

    op.create_table(
        "artifact",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=300), nullable=False),
        sa.Column("media_type", sa.String(length=200), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(length=1000), nullable=True),
        sa.Column("blob", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_artifact_job_id_job"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifact")),
        sa.UniqueConstraint("job_id", "name", name=op.f("uq_artifact_job_id_name")),
    )
    op.create_table(
        "baseline",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("commit_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["commit_id"], ["commit.id"], name=op.f("fk_baseline_commit_id_commit"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_baseline_job_id_job"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_baseline")),
        sa.UniqueConstraint("name", name=op.f("uq_baseline_name")),
    )
    op.create_table(
        "case_result",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["case_id"], ["case.id"], name=op.f("fk_case_result_case_id_case"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_case_result_job_id_job"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_case_result")),
        sa.UniqueConstraint("job_id", "case_id", name=op.f("uq_case_result_job_id_case_id")),
    )
    with op.batch_alter_table("case_result", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_case_result_case_id"), ["case_id"], unique=False)

    op.create_table(
        "job_event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_job_event_job_id_job"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_event")),
    )
    with op.batch_alter_table("job_event", schema=None) as batch_op:
        batch_op.create_index("ix_job_event_job_id_id", ["job_id", "id"], unique=False)

    op.create_table(
        "sample",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.Integer(), nullable=False),
        sa.Column("metric_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["case_id"], ["case.id"], name=op.f("fk_sample_case_id_case"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_sample_job_id_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["metric_id"], ["metric.id"], name=op.f("fk_sample_metric_id_metric"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sample")),
    )
    with op.batch_alter_table("sample", schema=None) as batch_op:
        batch_op.create_index("ix_sample_case", ["case_id", "metric_id", "job_id"], unique=False)
        batch_op.create_index(
            "ix_sample_job",
            ["job_id", "attempt", "case_id", "metric_id", "idx", "rank", "value"],
            unique=False,
        )

    op.create_table(
        "summary",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.Integer(), nullable=False),
        sa.Column("metric_id", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column("median", sa.Float(), nullable=True),
        sa.Column("p90", sa.Float(), nullable=True),
        sa.Column("min", sa.Float(), nullable=True),
        sa.Column("max", sa.Float(), nullable=True),
        sa.Column("mean", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["case_id"], ["case.id"], name=op.f("fk_summary_case_id_case"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_summary_job_id_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["metric_id"], ["metric.id"], name=op.f("fk_summary_metric_id_metric"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_summary")),
        sa.UniqueConstraint(
            "job_id", "case_id", "metric_id", name=op.f("uq_summary_job_id_case_id_metric_id")
        ),
    )


def downgrade() -> None:
    op.drop_table("summary")
    with op.batch_alter_table("sample", schema=None) as batch_op:
        batch_op.drop_index("ix_sample_job")
        batch_op.drop_index("ix_sample_case")

    op.drop_table("sample")
    with op.batch_alter_table("job_event", schema=None) as batch_op:
        batch_op.drop_index("ix_job_event_job_id_id")

    op.drop_table("job_event")
    with op.batch_alter_table("case_result", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_case_result_case_id"))

    op.drop_table("case_result")
    op.drop_table("baseline")
    op.drop_table("artifact")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_suite"))
        batch_op.drop_index("ix_job_status_priority")
        batch_op.drop_index(batch_op.f("ix_job_commit_id"))

    op.drop_table("job")
    op.drop_table("metric")
    op.drop_table("commit")
    with op.batch_alter_table("case", schema=None) as batch_op:
        batch_op.drop_index("ix_case_suite_name")

    op.drop_table("case")
