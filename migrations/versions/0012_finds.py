"""Finds as stored entities: the bisection of a first-parent range by the gate's judgment.

`find`: one row per find run (its request, the range it bisects, where its state machine stands,
its verdict, the first bad and last good commits, the metric that moved and the commits it
measured), updated at each step; `find_step`: its steps in order, each a gate (`gate.id`) of
one commit and what that gate made of it (good, bad, skipped).

Revision ID: 0012_finds
Revises: 0011_metric_diagnostic
Create Date: 2026-12-05 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_finds"
down_revision: str | None = "0011_metric_diagnostic"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "find",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("head", sa.String(length=255), nullable=False),
        sa.Column("base", sa.String(length=255), nullable=False),
        sa.Column("backend", sa.String(length=200), nullable=True),
        sa.Column("backend_repo", sa.String(length=1000), nullable=True),
        sa.Column("device", sa.String(length=10), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("commits", sa.JSON(), nullable=False),
        sa.Column("phase", sa.String(length=10), nullable=False),
        sa.Column("verdict", sa.String(length=10), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("first_bad", sa.String(length=255), nullable=True),
        sa.Column("last_good", sa.String(length=255), nullable=True),
        sa.Column("findings", sa.JSON(), nullable=False),
        sa.Column("measured", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_find")),
        sa.UniqueConstraint("run_id", name=op.f("uq_find_run_id")),
    )
    op.create_index(op.f("ix_find_head"), "find", ["head"])
    op.create_table(
        "find_step",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("find_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column("commit", sa.String(length=255), nullable=False),
        sa.Column("gate_id", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=10), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["find_id"], ["find.id"], name=op.f("fk_find_step_find_id_find"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["gate_id"], ["gate.id"], name=op.f("fk_find_step_gate_id_gate"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_find_step")),
        sa.UniqueConstraint("find_id", "position", name=op.f("uq_find_step_find_id_position")),
    )
    op.create_index(op.f("ix_find_step_gate_id"), "find_step", ["gate_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_find_step_gate_id"), table_name="find_step")
    op.drop_table("find_step")
    op.drop_index(op.f("ix_find_head"), table_name="find")
    op.drop_table("find")
