"""Test-only suite `env-probe`: every rank writes its whole environment as an artifact
(`rank<r>/environ.json`), so a test reads exactly what job code could read."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import ClassVar

from workers.context import RankContext
from workers.suite import Case, Metric, Sample, Suite, SuiteParams

NAME = "env-probe"


class EnvProbeSuite(Suite):
    name = NAME
    description = "writes each rank's environment as an artifact (tests only)"
    params_model = SuiteParams
    presets: ClassVar = {"quick": {}}
    metrics = (Metric("ok", "bool", "check", direction="higher", bound=1.0),)
    devices = ("cpu",)

    def cases(self, params: SuiteParams) -> list[Case]:
        return [Case(NAME, "environ", {})]

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        if ctx.artifacts_dir is not None:
            (ctx.artifacts_dir / "environ.json").write_text(json.dumps(dict(os.environ)))
        yield Sample(case.name, "ok", 1.0, rank=ctx.rank)


SUITE = EnvProbeSuite()
