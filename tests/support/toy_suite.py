"""`toy-generic`: a suite with no report code of its own (no module in
service/presentation/suite_sections): the report shows it through the generic section. Its ranks
yield planted numbers of every judged kind, without torch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from workers.context import RankContext
from workers.suite import Case, Metric, Sample, Suite, SuiteParams


class ToyParams(SuiteParams):
    sizes: tuple[int, ...] = (8, 16)
    repeat: int = 5


class ToySuite(Suite):
    name = "toy-generic"
    description = "a suite without report code (tests only)"
    params_model = ToyParams
    presets: ClassVar = {"quick": {}, "gate": {}, "full": {}}
    metrics = (
        Metric("step_ms", "ms", "time", description="a planted time, every repetition"),
        Metric("out_rel_l2", "ratio", "accuracy", bound=1e-3, description="a planted error"),
        Metric("ok", "bool", "check", "higher", bound=1.0, description="a planted check"),
        Metric("loss_rel_err", "ratio", "trajectory", bound=1e-2, description="a planted error per step"),
    )

    def time_repeats(self, params: SuiteParams) -> int:
        assert isinstance(params, ToyParams)
        return params.repeat

    def cases(self, params: SuiteParams) -> list[Case]:
        assert isinstance(params, ToyParams)
        return [Case(self.name, f"size{n}", {"size": n, "repeat": params.repeat}) for n in params.sizes]

    def run(self, ctx: RankContext, case: Case) -> Iterator[Sample]:
        n = case.params["size"]
        for i in range(case.params["repeat"]):
            yield Sample(case.name, "step_ms", n * (1.0 + 0.01 * i), rank=ctx.rank, idx=i)
        yield Sample(case.name, "out_rel_l2", 1e-5 * n, rank=ctx.rank)
        yield Sample(case.name, "ok", 1.0, rank=ctx.rank)
        for step in range(3):
            yield Sample(case.name, "loss_rel_err", 1e-4 * (step + 1), rank=ctx.rank, idx=step)


SUITE = ToySuite()
