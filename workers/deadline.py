"""Every job has a deadline: the service's setting when one is given, else the suite's default.

A rank that hangs (a lost collective, a deadlock, a sleep) must end its job and free its devices
on its own, so no job runs without a limit. The default is

    startup_s + per_case_s[preset] x cases x (1 + log2(world_size) / 2)

with the suite's `deadline_startup_s` and `deadline_per_case_s` (class attributes; the defaults
below are generous for the presets' shapes on one GPU): longer matrices and larger worlds get
proportionally more time. The collective timeout of the ranks is derived from the same value
(`collective_timeout_s`), so a rank blocked in a collective gives up just after the executor
has failed the job naming the rank that hung.

Within that deadline a rank must not stay silent (no beat, message or output: its process is
stopped or frozen, see `workers.executors._process`) for longer than its job's stall limit,
`stall_limit_s`: the preset's time per case, so a stopped rank ends its job within one case's
time instead of at the deadline, naming the rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.suite import Suite

DEFAULT_STARTUP_S = 300.0  # interpreter, imports, Triton compilation, process-group set-up
DEFAULT_PER_CASE_S: Mapping[str, float] = {"quick": 120.0, "gate-cpu": 120.0, "gate": 600.0, "full": 1800.0}
COLLECTIVE_MARGIN_S = 30.0  # collectives outlive the deadline by this much: the executor names the rank
MIN_STALL_S = 30.0  # the shortest default stall limit: a rank's guard beats once a second


def default_deadline_s(suite: Suite, preset: str, params: Mapping[str, Any] | None, world_size: int) -> float:
    """The suite's default wall-clock limit for one job of `preset` with `params` on `world_size` ranks."""
    startup = float(getattr(suite, "deadline_startup_s", DEFAULT_STARTUP_S))
    per_case_table: Mapping[str, float] = getattr(suite, "deadline_per_case_s", DEFAULT_PER_CASE_S)
    per_case = float(per_case_table.get(preset, max(per_case_table.values())))
    cases = len(suite.cases(suite.resolve_params(preset, params)))
    world = 1.0 + math.log2(max(1, world_size)) / 2.0
    return startup + per_case * max(1, cases) * world


def job_deadline_s(
    suite: Suite, preset: str, params: Mapping[str, Any] | None, world_size: int, override: float | None
) -> float:
    """The deadline a job runs under: `override` (the service's `job_deadline_s`) or the default."""
    return float(override) if override else default_deadline_s(suite, preset, params, world_size)


def stall_limit_s(suite: Suite, preset: str, override: float | None = None) -> float:
    """How long a rank of a job may stay silent: `override` (the service's `stall_s`), else the
    suite's time per case of `preset` (at least `MIN_STALL_S`)."""
    if override:
        return float(override)
    per_case_table: Mapping[str, float] = getattr(suite, "deadline_per_case_s", DEFAULT_PER_CASE_S)
    return max(MIN_STALL_S, float(per_case_table.get(preset, max(per_case_table.values()))))


def collective_timeout_s(deadline_s: float) -> float:
    """The ranks' process-group timeout for a job with this deadline."""
    return deadline_s + COLLECTIVE_MARGIN_S
