"""Test-only suites for the runtime and executor tests; registered by the tests that use them.

`probe`: a few cheap cases that exercise the runtime's contract (bounds, expected errors, errors,
collectives on the job's group) and, through the `fault` parameter, a rank that raises, kills
itself, kills its parent (a Ray actor) or hangs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import ClassVar

from workers.context import RankContext
from workers.suite import Case, Metric, Sample, Suite, SuiteParams

MARKER = 1.0  # the commit-snapshot test rewrites this constant in a temporary repository


class ProbeParams(SuiteParams):
    fault: str = "none"  # none | raise | kill | kill_parent | hang | case_error
    fault_rank: int = 1
    repeats: int = 3
    bound_violation: bool = False


class ProbeSuite(Suite):
    name = "probe"
    description = "runtime/executor probe (tests only)"
    params_model = ProbeParams
    presets: ClassVar = {"quick": {}, "gate": {"repeats": 5}, "full": {"repeats": 10}}
    metrics = (
        Metric("allreduce_sum", "count", "check", direction="higher", bound=0.0),
        Metric("value", "unit", "accuracy", direction="lower", bound=1.0),
        Metric("marker", "unit", "check", direction="higher"),
    )

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, ProbeParams)
        p = params.model_dump()
        return [
            Case(self.name, "collective", p),
            Case(self.name, "bounded", p),
            Case(self.name, "expects_value_error", p, expected_error="ValueError"),
            Case(self.name, "fault", p),
            Case(self.name, "after_fault", p),
        ]

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        import torch
        import torch.distributed as dist

        p = case.params
        if case.name == "collective":
            for i in range(int(p["repeats"])):
                t = torch.tensor([float(ctx.rank + 1)])
                if ctx.distributed:
                    dist.all_reduce(t, group=ctx.group)
                yield Sample(case.name, "allreduce_sum", float(t.item()), rank=ctx.rank, idx=i)
            yield Sample(case.name, "marker", MARKER, rank=ctx.rank)
        elif case.name == "bounded":
            value = 2.0 if p["bound_violation"] else 0.5
            yield Sample(case.name, "value", value, rank=ctx.rank)
        elif case.name == "expects_value_error":
            raise ValueError("raised on purpose")
        elif case.name == "fault" and ctx.rank == int(p["fault_rank"]) % ctx.world_size:
            fault = p["fault"]
            if fault in ("raise", "case_error"):
                raise RuntimeError(f"probe fault on rank {ctx.rank}")
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "kill_parent":
                os.kill(os.getppid(), signal.SIGKILL)
                time.sleep(60)
            if fault == "hang":
                time.sleep(3600)
        elif case.name == "fault" and p["fault"] == "case_error":
            raise RuntimeError(f"probe fault on rank {ctx.rank}")  # every rank: a recorded case error
        elif case.name == "after_fault":
            yield Sample(case.name, "value", 0.0, rank=ctx.rank)


SUITE = ProbeSuite()
