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

JobOutcomeStatus = Literal["succeeded", "failed", "cancelled"]


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
    deterministic: bool = False
    cases: tuple[str, ...] | None = None  # None: every case of the preset; else only these names


class JobSink(Protocol):
    """Where an executor reports; called from executor threads, implementations must be thread-safe."""

    def samples(self, batch: Sequence[Sample]) -> None: ...

    def case_result(self, case: str, status: CaseStatus, error: str | None = None) -> None: ...

    def progress(self, done: int, total: int, message: str = "") -> None: ...

    def info(self, info: Mapping[str, Any]) -> None: ...

    def log(self, line: str) -> None: ...

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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release long-lived resources (clusters, pools)."""
