"""Gates as stored entities, and the backend commit a job tests.

`gate`: one row per gate run (its request, phase, verdict, reason, rounds, confirmation pairs
and the reason per changed metric), updated at each step of the gate's state machine;
`gate_job`: the jobs it ran or reused, by role. `job.backend_commit`: the commit of a backend
from another repository (the job label `backend_source`), so that commit is what pages show and
lookups find; a plain column (no foreign key), so adding and dropping it never rebuilds `job`.

Revision ID: 0009_gates
Revises: 0008_campaigns
Create Date: 2026-12-02 05:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_gates"
down_revision: str | None = "0008_campaigns"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job", sa.Column("backend_commit", sa.String(length=255), nullable=True))
    op.create_index(op.f("ix_job_backend_commit"), "job", ["backend_commit"])
    op.create_table(
        "gate",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("head", sa.String(length=255), nullable=False),
        sa.Column("base", sa.String(length=255), nullable=True),
        sa.Column("base_source", sa.String(length=500), nullable=False),
        sa.Column("backend", sa.String(length=200), nullable=True),
        sa.Column("backend_repo", sa.String(length=1000), nullable=True),
        sa.Column("device", sa.String(length=10), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=10), nullable=False),
        sa.Column("verdict", sa.String(length=10), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("confirmations", sa.JSON(), nullable=False),
        sa.Column("findings", sa.JSON(), nullable=False),
        sa.Column("undecided", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gate")),
        sa.UniqueConstraint("run_id", name=op.f("uq_gate_run_id")),
    )
    op.create_index(op.f("ix_gate_head"), "gate", ["head"])
    op.create_table(
        "gate_job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gate_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("suite", sa.String(length=100), nullable=False),
        sa.Column("reused", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["gate_id"], ["gate.id"], name=op.f("fk_gate_job_gate_id_gate"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_gate_job_job_id_job"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gate_job")),
        sa.UniqueConstraint("gate_id", "job_id", "role", name=op.f("uq_gate_job_gate_id_job_id_role")),
    )
    op.create_index(op.f("ix_gate_job_job_id"), "gate_job", ["job_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_gate_job_job_id"), table_name="gate_job")
    op.drop_table("gate_job")
    op.drop_index(op.f("ix_gate_head"), table_name="gate")
    op.drop_table("gate")
    op.drop_index(op.f("ix_job_backend_commit"), table_name="job")
    op.drop_column("job", "backend_commit")
