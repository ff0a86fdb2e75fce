"""What a suite's `run(ctx, case)` gets on each rank: who it is, its device and its process group."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


@dataclass
class RankContext:
    rank: int
    world_size: int
    device: torch.device
    device_kind: str  # "cuda" | "npu" | "cpu"
    group: dist.ProcessGroup | None = None  # the job's group (None when world_size == 1 and no PG)
    deterministic: bool = False
    seed: int = 0
    artifacts_dir: Path | None = None  # files written here are collected as job artifacts
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def distributed(self) -> bool:
        return self.group is not None and self.world_size > 1
