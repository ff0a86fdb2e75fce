"""What the engine compares: one side is a job's reference, its cases, its suite's metric
definitions and its raw samples as columns (`service.domain.baselines` loads them from the store)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.suite import CaseStatus, Metric


@dataclass(frozen=True)
class CaseInfo:
    """One case of one job: identity, parameters and how its run ended."""

    fingerprint: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    status: CaseStatus | None = None  # None: no case result recorded (treated as passed)
    error: str | None = None
    source_job_id: int | None = None  # the job that measured it, when this job took it from one


@dataclass(frozen=True)
class JobRef:
    """What a side is, for the record and for links (job page `/jobs/{job_id}`)."""

    job_id: int | None = None
    suite: str = ""
    preset: str = ""
    commit: str | None = None
    device: str = ""
    world_size: int = 1
    status: str | None = None
    device_name: str | None = None  # the hardware the job ran on (rank 0's device name)
    suite_version: int | None = None  # the suite's definition version the job ran with
    code: str | None = None  # the code under test's content identity (workers.provenance.code_identity)


@dataclass
class SampleTable:
    """Columnar raw samples of one job: parallel arrays, case and metric as integer codes."""

    case: np.ndarray  # int codes into `case_keys`
    metric: np.ndarray  # int codes into `metric_keys`
    rank: np.ndarray
    idx: np.ndarray
    value: np.ndarray  # float64
    case_keys: list[str]  # fingerprints
    metric_keys: list[str]
    # rows already reduced over ranks (the store's SQL rank reduction): how many ranks each row
    # stands for, and `rank` is meaningless; None: raw rows, one per rank
    ranks: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.value)
        for name in ("case", "metric", "rank", "idx"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"SampleTable.{name} has {len(getattr(self, name))} rows; expected {n}")

    def __len__(self) -> int:
        return len(self.value)

    @classmethod
    def from_records(cls, records: Iterable[tuple[str, str, int, int, float]]) -> SampleTable:
        """From (fingerprint, metric, rank, idx, value) tuples."""
        case_ids: dict[str, int] = {}
        metric_ids: dict[str, int] = {}
        cols: list[tuple[int, int, int, int, float]] = []
        for fp, metric, rank, idx, value in records:
            c = case_ids.setdefault(fp, len(case_ids))
            m = metric_ids.setdefault(metric, len(metric_ids))
            cols.append((c, m, rank, idx, value))
        arr = np.array(cols, dtype=np.float64).reshape(-1, 5)
        return cls(
            case=arr[:, 0].astype(np.int64),
            metric=arr[:, 1].astype(np.int64),
            rank=arr[:, 2].astype(np.int64),
            idx=arr[:, 3].astype(np.int64),
            value=arr[:, 4],
            case_keys=list(case_ids),
            metric_keys=list(metric_ids),
        )


@dataclass
class JobSide:
    """One side of a comparison: a job's cases, its suite's metrics and its raw samples."""

    ref: JobRef
    cases: Mapping[str, CaseInfo]  # fingerprint -> case
    metrics: Mapping[str, Metric]  # metric name -> definition
    samples: SampleTable
