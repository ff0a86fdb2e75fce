"""The contract between the service (queue/dispatcher) and the executors that run jobs on ranks.

The service builds a `JobSpec`, hands it with a `JobSink` to `Executor.run`, and stores whatever
arrives through the sink. Executors never touch the database. Imports no torch.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from workers.suite import CaseStatus, Sample

# "interrupted": what ran the job went away under it (its cluster lost or restarted), not the
# job's fault: the service re-queues it without spending an attempt
JobOutcomeStatus = Literal["succeeded", "failed", "cancelled", "interrupted"]
# How a job's ranks spread over nodes (Ray's placement-group strategies): the service's default
# comes from its settings, a job may override it with the label `placement`.
PLACEMENT_STRATEGIES: tuple[str, ...] = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
PLACEMENT_LABEL = "placement"


def check_placement(value: str) -> str:
    """`value` if it names a placement strategy; ValueError naming the choices otherwise."""
    if value not in PLACEMENT_STRATEGIES:
        raise ValueError(
            f"unknown placement strategy {value!r}; expected one of {', '.join(PLACEMENT_STRATEGIES)}"
        )
    return value


class ExecutorUnavailable(RuntimeError):
    """The executor cannot reach what runs its jobs (a cluster down, refused credentials): the
    service answers 503 with this reason and claims nothing until it answers again."""


@dataclass(frozen=True)
class JobSpec:
    job_id: int
    suite: str
    preset: str = "quick"
    params: Mapping[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    world_size: int = 1
    commit: str | None = None  # None: run the installed code
    deadline_s: float | None = None  # wall-clock limit for the whole job
    stall_s: float | None = None  # how long a rank may stay silent (stopped, frozen); None: no limit
    deterministic: bool = False
    cases: tuple[str, ...] | None = None  # None: every case of the preset; else only these names
    placement: str | None = None  # None: the executor's default strategy
    backend_source: str | None = None  # a backend under test from elsewhere (workers.backend_source)
    # cases an earlier run of the job finished (kept by the service): the ranks do not run them
    skip_cases: tuple[str, ...] = ()


class JobSink(Protocol):
    """Where an executor reports; called from executor threads, implementations must be thread-safe."""

    def samples(self, batch: Sequence[Sample]) -> None: ...

    def case_result(self, case: str, status: CaseStatus, error: str | None = None) -> None: ...

    def progress(self, done: int, total: int, message: str = "") -> None: ...

    def info(self, info: Mapping[str, Any]) -> None: ...

    def log(self, line: str) -> None: ...

    def waiting(self, reason: str | None) -> None:
        """The claimed job waits for its resources (`reason` says which; the service shows it
        queued), or, with None, has them and its ranks start (it shows running again)."""
        ...

    def artifact(self, name: str, media_type: str, data: bytes) -> None:
        """A file the job produced (profiler trace, report); stored with the job."""
        ...


@dataclass(frozen=True)
class JobOutcome:
    status: JobOutcomeStatus
    error: str | None = None  # for failed jobs: which rank and why (traceback tail)


class Executor(ABC):
    """Runs a job's cases on `world_size` ranks of one device kind."""

    kind: str

    @abstractmethod
    def run(self, spec: JobSpec, sink: JobSink, cancel: threading.Event) -> JobOutcome:
        """Run the job to the end; returns when it succeeded, failed or was cancelled."""

    @abstractmethod
    def max_world_size(self, device: str) -> int:
        """The largest world size this executor could ever give `device` (0 = never)."""

    def most_ranks(self, device: str, placement: str | None = None) -> int:
        """The largest world size a job with this placement strategy could ever get on `device`
        (executors without placement strategies ignore it)."""
        return self.max_world_size(device)

    def alive_ranks(self, device: str, placement: str | None = None) -> int | None:
        """Ranks of `device` the machines present now could hold (None: they cannot grow, so this
        is `most_ranks`). A job wider than this but within `most_ranks` is claimed and waits in
        the executor, which asks for the machines it needs."""
        return None

    def free_ranks(self, device: str, placement: str | None = None) -> int | None:
        """How many ranks of `device` could be placed right now (None: this executor cannot tell,
        so the dispatcher claims within its device limits only and the executor waits)."""
        return None

    def cluster(self) -> Mapping[str, Any] | None:
        """What runs the jobs, for readiness: alive nodes and resources per kind (None: nothing
        to reach). Raises ExecutorUnavailable naming why it cannot be reached."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release long-lived resources (clusters, pools)."""
