"""`gatetime`: a test-only suite whose timing is set by the code of the commit under test.

The gate tests copy the project into a temporary git repository and commit it twice, the second
time with `SLOW_FACTOR` rewritten; the executor runs each job on its commit's snapshot, so the
head really is slower. `GDNVAL_TEST_NOISE_FILE`: when that file exists, the next run deletes it
and is slow once (a one-off noisy run that `--confirm` must not count).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import ClassVar

from workers.context import RankContext
from workers.suite import Case, Metric, Sample, Suite, SuiteParams

SLOW_FACTOR = 1.0  # rewritten by the gate tests in a temporary repository
NOISE_ENV = "GDNVAL_TEST_NOISE_FILE"


class GateTimeParams(SuiteParams):
    repeats: int = 12
    base_ms: float = 25.0


class GateTimeSuite(Suite):
    name = "gatetime"
    description = "sleep-timed case whose duration is a constant of the commit (tests only)"
    params_model = GateTimeParams
    presets: ClassVar = {"quick": {"repeats": 8}, "gate": {}, "full": {"repeats": 20}}
    metrics = (
        Metric("sleep_ms", "ms", "time", description="one timed sleep"),
        Metric("err", "", "accuracy", bound=1e-2, description="a constant error"),
    )

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, GateTimeParams)
        return [Case(self.name, "sleep", params.model_dump())]

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        factor = SLOW_FACTOR
        flag = os.environ.get(NOISE_ENV)
        if flag and os.path.exists(flag):
            os.remove(flag)
            factor *= 1.6  # this run only
        seconds = float(case.params["base_ms"]) * factor / 1000.0
        for i in range(int(case.params["repeats"])):
            t0 = time.perf_counter()
            time.sleep(seconds)
            yield Sample(case.name, "sleep_ms", (time.perf_counter() - t0) * 1000.0, rank=ctx.rank, idx=i)
        yield Sample(case.name, "err", 1e-4, rank=ctx.rank)


SUITE = GateTimeSuite()
