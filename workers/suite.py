"""Suite metadata: metrics, cases, samples and the Suite base class. Imports no torch.

A suite is one module in `workers/suites/`. Its metadata (name, presets, parameter schema, case
matrix, metrics) is read by the service on a head node without torch; only `Suite.run` (executed
on the ranks) imports torch, inside the function.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from workers.runtime import RankContext

MetricKind = Literal["accuracy", "time", "memory", "trajectory", "check"]
Direction = Literal["lower", "higher"]
CaseStatus = Literal["passed", "failed", "error", "expected_error", "skipped"]
PRESETS: tuple[str, ...] = ("quick", "gate", "full")


@dataclass(frozen=True)
class Metric:
    """A measured quantity. `bound` is the acceptance threshold in the metric's direction
    (lower-is-better metrics pass when value <= bound; higher-is-better when value >= bound)."""

    name: str
    unit: str
    kind: MetricKind
    direction: Direction = "lower"
    bound: float | None = None
    description: str = ""
    min_effect: float = 0.05  # relative change below which a time difference never counts

    def passes(self, value: float) -> bool:
        if value != value:  # NaN never passes
            return False
        if self.bound is None:
            return True
        return value <= self.bound if self.direction == "lower" else value >= self.bound


@dataclass(frozen=True)
class Case:
    """One row of a suite's matrix. `params` is JSON-serialisable; `name` is unique in the suite."""

    suite: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    expected_error: str | None = None  # exception class name that counts as a pass

    def fingerprint(self, device: str, world_size: int) -> str:
        """Identity of a series across commits: suite + case name + parameters + device kind + world
        size. The name is part of it because cases may differ by name alone (a check per name)."""
        key = {
            "suite": self.suite,
            "name": self.name,
            "params": dict(self.params),
            "device": device,
            "world_size": world_size,
        }
        blob = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Sample:
    """One measured value: every timing repetition on every rank, every step, every tensor error."""

    case: str
    metric: str
    value: float
    rank: int = 0
    idx: int = 0


# Parameter value types shared by the suites' schemas, so a bad value (`dtype=float7`,
# `seq_lens=[-5]`) is refused when the job is validated (`--dry-run`, the API) rather than
# when a rank first uses it.
DType = Literal["float64", "float32", "float16", "bfloat16"]
Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]


class SuiteParams(BaseModel):
    """Base of every suite's parameter schema: unknown parameters are an error, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class UnknownSuiteInput(ValueError):
    """Bad suite, preset or parameter: the message names the valid choices."""


class Suite(ABC):
    """Base class of a suite; subclasses set the class attributes and implement cases/run."""

    name: ClassVar[str]
    description: ClassVar[str]
    params_model: ClassVar[type[SuiteParams]]
    presets: ClassVar[Mapping[str, Mapping[str, Any]]]
    metrics: ClassVar[tuple[Metric, ...]]
    devices: ClassVar[tuple[str, ...]] = ("cuda", "npu", "cpu")
    min_world_size: ClassVar[int] = 1

    def resolve_params(self, preset: str, overrides: Mapping[str, Any] | None = None) -> SuiteParams:
        """The preset's parameters with `overrides` applied and validated."""
        if preset not in self.presets:
            raise UnknownSuiteInput(
                f"unknown preset {preset!r} for suite {self.name!r}; expected one of {sorted(self.presets)}"
            )
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(self.params_model.model_fields))
        if unknown:
            raise UnknownSuiteInput(
                f"unknown parameter(s) {unknown} for suite {self.name!r}; "
                f"expected a subset of {sorted(self.params_model.model_fields)}"
            )
        try:
            return self.params_model(**{**self.presets[preset], **overrides})
        except ValidationError as exc:
            raise UnknownSuiteInput(f"invalid parameters for suite {self.name!r}: {exc}") from exc

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(f"suite {self.name!r} declares no metric {name!r}")

    @abstractmethod
    def cases(self, params: SuiteParams) -> list[Case]:
        """Expand the parameter matrix into cases (metadata only, no torch)."""

    @abstractmethod
    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        """Run one case on one rank (every rank runs it) and yield its samples."""

    def describe(self) -> dict[str, Any]:
        """The catalogue entry served by the API and the suites page."""
        return {
            "name": self.name,
            "description": self.description,
            "devices": list(self.devices),
            "min_world_size": self.min_world_size,
            "presets": {
                name: {
                    "params": self.resolve_params(name).model_dump(),
                    "cases": [
                        {"name": c.name, "params": dict(c.params), "expected_error": c.expected_error}
                        for c in self.cases(self.resolve_params(name))
                    ],
                }
                for name in self.presets
            },
            "params_schema": self.params_model.model_json_schema(),
            "metrics": [m.__dict__ for m in self.metrics],
        }
