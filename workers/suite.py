"""Suite metadata: metrics, cases, samples and the Suite base class. Imports no torch.

A suite is a package in `workers/suites/` of two modules: its spec (name, presets, parameter
schema, case matrix, metrics: the `Suite` subclass and its `SUITE`), read by the service on a head
node without torch, and its run module (`Suite.run_module`), the code the ranks run, which imports
torch at its top and is imported only when a rank first runs a case.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from workers.context import RankContext

MetricKind = Literal["accuracy", "time", "memory", "trajectory", "check"]
Direction = Literal["lower", "higher"]
CaseStatus = Literal["passed", "failed", "error", "expected_error", "skipped"]
PRESETS: tuple[str, ...] = ("quick", "gate-cpu", "gate", "full")
# Suites with a CPU-sized gate preset: the gate on a CPU machine uses it
CPU_GATE_PRESETS: Mapping[str, str] = {"cuda": "gate", "npu": "gate", "cpu": "gate-cpu"}


@dataclass(frozen=True)
class Metric:
    """A measured quantity. `bound` is the acceptance threshold in the metric's direction
    (lower-is-better metrics pass when value <= bound; higher-is-better when value >= bound),
    judged on the statistic `workers.verdict.JUDGED_ON` names for the kind.

    `min_effect`: the smallest relative change that counts in a comparison (None: the kind's
    default, `workers.verdict.MIN_EFFECT`). `repeated` False: one value per case (a ratio derived
    from other metrics, a one-shot reading), which no significance test can judge: compare shows
    its change and judges only its bound, the metrics it derives from carry the verdict.

    `diagnostic` True: recorded and shown, never judged (no bound, never failing a case, a job or
    a gate, never an improvement): an element-wise max-relative or max-abs error, whose size is
    set by reference values near zero and moves with any change of reduction order. The judged
    accuracy of a tensor is its relative L2 error (`service.domain.compare.judgment`)."""

    name: str
    unit: str
    kind: MetricKind
    direction: Direction = "lower"
    bound: float | None = None
    description: str = ""
    min_effect: float | None = None
    repeated: bool = True
    diagnostic: bool = False

    def __post_init__(self) -> None:
        if self.diagnostic and self.bound is not None:
            raise ValueError(
                f"metric {self.name!r} is a diagnostic with bound {self.bound!r}; expected no bound "
                "(a diagnostic is never judged: make it a judged metric to give it a bound)"
            )

    def passes(self, value: float) -> bool:
        """One value against the bound (NaN and infinities never pass)."""
        from workers.verdict import bound_holds

        return bound_holds(float(value), self.bound, self.direction)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metric:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


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


# CP modes that shard a sequence over the job's ranks (`mode` of a case of cp-layer, network,
# stability, profile); `none` and `p2p_emulated` run in one process at any world size.
DISTRIBUTED_CP_MODES: tuple[str, ...] = ("ulysses", "p2p", "all_gather")


def cp_misfit(params: Mapping[str, Any], world_size: int) -> str | None:
    """Why a case whose `mode` shards its `seq_len` over the ranks cannot run at `world_size`
    (the reasons gdn.cp raises, found from the parameters alone), or None."""
    mode = params.get("mode")
    if mode not in DISTRIBUTED_CP_MODES:
        return None
    if world_size < 2:
        return f"CP mode {mode!r} needs a job with world size >= 2 (got {world_size})"
    seq_len = params.get("seq_len")
    if isinstance(seq_len, int) and seq_len % world_size:
        return f"sequence length {seq_len} is not divisible by the CP size {world_size}"
    return None


def select_cases(cases: list[Case], only: list[str] | None) -> list[Case]:
    """The job's cases, or only those named (the gate's re-measurements); an unknown name is an error."""
    if not only:
        return cases
    names = {c.name for c in cases}
    unknown = sorted(set(only) - names)
    if unknown:
        raise UnknownSuiteInput(f"unknown case(s) {unknown}; expected names from {sorted(names)}")
    wanted = set(only)
    return [c for c in cases if c.name in wanted]


# Parameter value types shared by the suites' schemas, so a bad value (`dtype=float7`,
# `seq_lens=[-5]`) is refused when the job is validated (`--dry-run`, the API) rather than
# when a rank first uses it.
DType = Literal["float64", "float32", "float16", "bfloat16"]
Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]


# A core backend as a suite parameter names it: a registered name or `module:function`
# (gdn.backends). Only the form is checked here, where no torch is loaded; the ranks resolve it.
BACKEND_NAME = re.compile(r"[A-Za-z0-9_.\-]+(:[A-Za-z_][\w.]*)?")


def check_backend_names(names: Sequence[str]) -> None:
    """ValueError naming the malformed backend names, if any."""
    bad = [b for b in names if not BACKEND_NAME.fullmatch(b)]
    if bad:
        raise ValueError(f"bad backend name(s) {bad}; expected a registered name or 'module:function'")


class SuiteParams(BaseModel):
    """Base of every suite's parameter schema: unknown parameters are an error, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CaseFailed(Exception):
    """Raised by a case's rank code after its samples, when the code under test failed a check
    the suite can say in words (a broken backend contract): the case is `failed` with this
    message, which reaches the case, the job page and the gate, beside the metric that broke."""


class UnknownSuiteInput(ValueError):
    """Bad suite, preset or parameter: the message names the valid choices."""


class RankCode(Protocol):
    """A suite's run module: what its ranks execute (it may import torch at its top)."""

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        """Run one case on one rank (every rank runs it) and yield its samples."""
        ...


class Suite(ABC):
    """Base class of a suite; subclasses set the class attributes, implement `cases` and name their
    run module (`run_module`) or override `run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    params_model: ClassVar[type[SuiteParams]]
    presets: ClassVar[Mapping[str, Mapping[str, Any]]]
    metrics: ClassVar[tuple[Metric, ...]]
    devices: ClassVar[tuple[str, ...]] = ("cuda", "npu", "cpu")
    min_world_size: ClassVar[int] = 1
    # The definition version: bump it when a change makes earlier results of the suite
    # incomparable (a metric's meaning, its inputs); compare refuses across versions.
    version: ClassVar[int] = 1
    # The preset the gate uses on each device kind (`gdnval gate` without --preset).
    gate_presets: ClassVar[Mapping[str, str]] = {"cuda": "gate", "npu": "gate", "cpu": "gate"}
    # The module of the code the ranks run (`RankCode`): imported on a rank's first `run`, so the
    # spec that declares the suite stays torch-free. None: the subclass overrides `run` itself.
    run_module: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """An accuracy or trajectory metric is judged only against a declared bound: one without
        a bound must say it is a diagnostic, so no error with no scale is ever judged by a factor."""
        super().__init_subclass__(**kwargs)
        unbounded = [m.name for m in getattr(cls, "metrics", ())
                     if m.kind in ("accuracy", "trajectory") and m.bound is None and not m.diagnostic]
        if unbounded:
            raise TypeError(
                f"suite {getattr(cls, 'name', cls.__name__)!r}: accuracy/trajectory metric(s) {unbounded} "
                "have no bound; expected a bound (judged) or diagnostic=True (recorded, never judged)"
            )

    def time_repeats(self, params: SuiteParams) -> int | None:
        """The fewest samples per repeated time metric and case that `params` produce (0: none;
        None: the suite does not say). A preset whose repeats cannot reach significance
        (`workers.verdict.repeats_for_significance`) is a definition error (tests check it)."""
        if any(m.kind == "time" and m.repeated for m in self.metrics):
            return None
        return 0

    def resolve_params(
        self, preset: str, overrides: Mapping[str, Any] | None = None, device: str | None = None
    ) -> SuiteParams:
        """The preset's parameters with `overrides` applied and validated; with `device`, the
        preset's backends that device cannot run are replaced first (workers.device_presets)."""
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
            values: Mapping[str, Any] = self.presets[preset]
            if device is not None:
                from workers.device_presets import DEVICE_BACKENDS, adapt_preset

                if device in DEVICE_BACKENDS:  # elsewhere the preset stays exactly as written
                    values = adapt_preset(self.params_model(**values).model_dump(), device)
            return self.params_model(**{**values, **overrides})
        except ValidationError as exc:
            raise UnknownSuiteInput(f"invalid parameters for suite {self.name!r}: {exc}") from exc

    def backends(self, params: SuiteParams) -> tuple[str, ...]:
        """The core backends a job with `params` runs; the ranks record where each one's code
        comes from (workers.provenance.backend_provenance)."""
        return ()

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(f"suite {self.name!r} declares no metric {name!r}")

    @abstractmethod
    def cases(self, params: SuiteParams) -> list[Case]:
        """Expand the parameter matrix into cases (metadata only, no torch)."""

    def misfit(self, case: Case, world_size: int) -> str | None:
        """Why `case` cannot run at `world_size`, found from its parameters alone (no torch: the
        service asks it when a job is submitted, the ranks before each case), or None."""
        return None

    def not_applicable(self, case: Case, world_size: int) -> str | None:
        """Why `case` cannot apply at `world_size` (it is recorded as skipped with the reason,
        never run and never an error), or None. Called on the ranks: the parameter-only reasons
        are `misfit`'s, those that need torch (a model's head counts) the run module's
        `not_applicable(case, world_size)`, where it defines one."""
        if self.run_module is None:
            return None
        check: Callable[[Case, int], str | None] | None = getattr(self.rank_code(), "not_applicable", None)
        return None if check is None else check(case, world_size)

    def why_not_here(self, case: Case, world_size: int) -> str | None:
        """The ranks' whole rule: `misfit`, then `not_applicable`."""
        return self.misfit(case, world_size) or self.not_applicable(case, world_size)

    def misfits(self, cases: Sequence[Case], world_size: int) -> dict[str, str]:
        """case name -> why it cannot run at `world_size`, for the cases that cannot (`misfit`)."""
        out = {}
        for case in cases:
            why = self.misfit(case, world_size)
            if why is not None:
                out[case.name] = why
        return out

    def nothing_runs(self, cases: Sequence[Case], world_size: int) -> str | None:
        """Why none of `cases` can run at `world_size` (each case's `misfit`), or None when one
        can: a job of only such cases would only skip, so it is refused (submit, run, the gate)."""
        misfits = self.misfits(cases, world_size)
        if not cases or len(misfits) < len(cases):
            return None
        reasons = "; ".join(f"{name}: {why}" for name, why in list(misfits.items())[:3])
        more = f" (+{len(misfits) - 3} more)" if len(misfits) > 3 else ""
        return f"none of its {len(cases)} case(s) can run at world size {world_size}: {reasons}{more}"

    def rank_code(self) -> RankCode:
        """The suite's run module, imported on first use (on the ranks, where torch is)."""
        if self.run_module is None:
            raise TypeError(f"suite {self.name!r} names no run_module and does not override run()")
        return cast(RankCode, importlib.import_module(self.run_module))

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        """Run one case on one rank (every rank runs it) and yield its samples: the run module's `run`."""
        return self.rank_code().run(ctx, case)

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
