"""Campaign plans: the jobs one report needs, as data. Imports no torch.

A plan is one TOML file in this folder (`<name>.toml`), versioned like a metric definition: bump
`version` when a change makes an earlier campaign of the plan incomparable. Each `[[jobs]]` entry
names a suite, a preset and parameter overrides; an entry without `world_size` becomes one job per
world size of the campaign, with `at_world_size.<N>` overrides for the lengths that depend on it.
`expand` turns a plan, a device and world sizes into job specs; the service validates each one
through the path every submitted job takes (`service.domain.submission`).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

PLAN_DIR = Path(__file__).parent
Device = Literal["cuda", "npu", "cpu"]
EntryName = Annotated[str, Field(min_length=1, max_length=60, pattern=r"^[a-z0-9][a-z0-9_.\-]*$")]
# the labels every campaign job carries: which plan entry it is, so a report can find its section
PLAN_LABEL = "plan"
ENTRY_LABEL = "plan_entry"
SECTION_LABEL = "plan_section"


class PlanError(ValueError):
    """A plan that cannot be loaded or expanded; the message names the bad value and the choices."""


class PlanEntry(BaseModel):
    """One suite run of a plan: a job, or one job per world size of the campaign."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: EntryName
    section: str = Field(min_length=1, max_length=60, description="the report section it feeds")
    suite: str = Field(min_length=1, max_length=100)
    preset: str = Field("quick", min_length=1, max_length=50)
    params: dict[str, JsonValue] = Field(default_factory=dict)
    world_size: int | None = Field(None, ge=1, description="fixed; unset: one job per campaign world size")
    at_world_size: dict[int, dict[str, JsonValue]] = Field(
        default_factory=dict, description="overrides per campaign world size (lengths per CP size)"
    )
    peers_param: str | None = Field(
        None, description="the sequence parameter the campaign's named peer backends are appended to"
    )

    @model_validator(mode="after")
    def _fixed_or_per_size(self) -> PlanEntry:
        if self.world_size is not None and self.at_world_size:
            raise ValueError(f"entry {self.name!r}: at_world_size needs world_size unset (one job per size)")
        return self


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=60)
    version: int = Field(ge=1)
    description: str = ""
    devices: tuple[Device, ...] = Field(min_length=1)
    world_sizes: tuple[Annotated[int, Field(ge=1)], ...] = Field(min_length=1)
    jobs: tuple[PlanEntry, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_entries(self) -> Plan:
        names = [e.name for e in self.jobs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"entries named twice: {twice}")
        return self

    def expand(
        self, device: str, world_sizes: Sequence[int] | None = None, backends: Sequence[str] = ()
    ) -> list[PlannedJob]:
        """The plan's jobs for `device` at `world_sizes` (the plan's own when None), with `backends`
        (peers of the backend under test) added where an entry takes them."""
        if device not in self.devices:
            raise PlanError(f"plan {self.name!r} runs on {list(self.devices)}, not on device {device!r}")
        sizes = tuple(dict.fromkeys(world_sizes or self.world_sizes))
        if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
            raise PlanError(f"world sizes must be integers >= 1, got {list(sizes)}")
        out: list[PlannedJob] = []
        for entry in self.jobs:
            for n in (entry.world_size,) if entry.world_size is not None else sizes:
                out.append(self._job(entry, device, n, backends, per_size=entry.world_size is None))
        return out

    def _job(
        self, entry: PlanEntry, device: str, world_size: int, backends: Sequence[str], *, per_size: bool
    ) -> PlannedJob:
        params: dict[str, Any] = dict(entry.params)
        if entry.at_world_size:
            if world_size not in entry.at_world_size:
                raise PlanError(
                    f"plan {self.name!r} entry {entry.name!r} sets its lengths for world sizes "
                    f"{sorted(entry.at_world_size)}, not for {world_size}; use some of those"
                )
            params.update(entry.at_world_size[world_size])
        from workers.device_presets import adapt_preset

        params = adapt_preset(params, device)  # the plan's backends are its defaults, like a preset's
        if backends and entry.peers_param:
            have = list(params.get(entry.peers_param) or [])
            params[entry.peers_param] = list(dict.fromkeys([*have, *backends]))
        params = json.loads(json.dumps(params))  # tuples from adapt_preset become JSON lists
        key = f"{entry.name}@{world_size}" if per_size else entry.name
        labels = {PLAN_LABEL: f"{self.name}@v{self.version}", ENTRY_LABEL: key, SECTION_LABEL: entry.section}
        return PlannedJob(key, entry.section, entry.suite, entry.preset, params, device, world_size, labels,
                          runs_peers=bool(backends and entry.peers_param))

    def document(self) -> dict[str, Any]:
        """The plan as stored with a campaign (JSON)."""
        return self.model_dump(mode="json")


@dataclass(frozen=True)
class PlannedJob:
    """One job of a campaign before it is queued: what `POST /api/v1/jobs` takes, and its key."""

    key: str  # unique in the campaign: entry name, and @world size for per-size entries
    section: str
    suite: str
    preset: str
    params: Mapping[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    world_size: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    runs_peers: bool = False  # the campaign's named peer backends were added to its parameters

    def check_cases(self) -> int:
        """How many cases the job expands to; raises naming the reason when it expands to none or
        its parameters cannot expand (the suite's own rules, `Suite.cases`)."""
        from workers.registry import get_suite

        suite = get_suite(self.suite)
        cases = suite.cases(suite.resolve_params(self.preset, self.params, device=self.device))
        if not cases:
            raise PlanError(f"job {self.key!r} ({self.suite}) expands to no case")
        return len(cases)

    def job_body(self) -> dict[str, Any]:
        """The job's submission body (`service.domain.submission.JobCreate`)."""
        return {
            "suite": self.suite, "preset": self.preset, "params": dict(self.params), "device": self.device,
            "world_size": self.world_size, "labels": dict(self.labels),
        }


def plan_names() -> list[str]:
    return sorted(p.stem for p in PLAN_DIR.glob("*.toml"))


def parse_plan(data: Mapping[str, Any], where: str = "plan") -> Plan:
    try:
        return Plan.model_validate(dict(data))
    except ValidationError as exc:
        raise PlanError(f"{where} is not a valid plan: {exc}") from exc


def load_plan(name: str) -> Plan:
    """The plan `name` of this folder; an unknown name raises naming the plans there."""
    names = plan_names()
    if name not in names:
        raise PlanError(f"unknown plan {name!r}; expected one of {names}")
    path = PLAN_DIR / f"{name}.toml"
    with path.open("rb") as f:
        plan = parse_plan(tomllib.load(f), where=f"{path.name}")
    if plan.name != name:
        raise PlanError(f"{path.name} names its plan {plan.name!r}; the file and the plan name must match")
    return plan
