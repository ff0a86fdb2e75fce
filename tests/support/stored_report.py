"""Jobs for the report's tests stored through the store (`service.persistence.runs.store_run`,
as `gdnval run` keeps its runs): a `gdnval-run/1` document built from cases and their values per
repetition, stored, and the campaign report of the stored jobs rendered from the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from service.persistence import db
from service.persistence.runs import RunDocument, store_run
from service.presentation.campaign_report import campaign_report_markdown
from tests.support.report_markdown import sections
from workers.suite import Case

REPEAT = 11


def samples(case: str, metric: str, values: list[float], world: int) -> list[dict[str, Any]]:
    """Every rank reports the same repetitions (the report reduces to the worst rank)."""
    return [
        {"case": case, "metric": metric, "rank": r, "idx": i, "value": v}
        for r in range(world)
        for i, v in enumerate(values)
    ]


def repetitions(median: float, spread: float) -> list[float]:
    """`REPEAT` values symmetric around `median`, half-width `spread`."""
    return [median + spread * x for x in np.linspace(-1.0, 1.0, REPEAT)]


Cases = dict[str, tuple[dict[str, Any], dict[str, list[float]]]]  # name -> (params, metric -> values)


def document(
    suite: str,
    world: int,
    commit: str,
    cases: Cases,
    backends: list[dict[str, Any]] | None = None,
    rank_versions: list[dict[str, str]] | None = None,
) -> RunDocument:
    """A `gdnval-run/1` document of `cases` run at `commit`, with the ranks' provenance."""
    info: dict[str, Any] = {
        "device_kind": "cuda", "device_name": "NVIDIA H200", "torch": "2.11.0", "python": "3.12.3",
        "commit": commit,
        "backends": backends
        or [{"backend": "triton", "distribution": "gdnval", "version": "0.1.0", "commit": commit}],
        "ranks": [
            {"rank": r, **({"backends": rank_versions[r]} if rank_versions else {})} for r in range(world)
        ],
    }
    out: list[dict[str, Any]] = []
    for name, (_, metrics) in cases.items():
        for m, values in metrics.items():
            out += samples(name, m, values, world)
    return RunDocument.model_validate({
        "format": "gdnval-run/1", "suite": suite, "preset": "full", "device": "cuda", "world_size": world,
        "commit": commit, "snapshot": True, "status": "succeeded", "info": info,
        "cases": [
            {"name": n, "status": "passed", "params": p,
             "fingerprint": Case(suite, n, p).fingerprint("cuda", world)}
            for n, (p, _) in cases.items()
        ],
        "samples": out,
    })


def report(tmp: Path, docs: list[RunDocument]) -> dict[str, str]:
    engine = db.make_engine(f"sqlite:///{tmp / 'store.db'}")
    db.upgrade(engine)
    ids = [store_run(engine, d)[0].id for d in docs]
    with Session(engine) as s:
        md = campaign_report_markdown(s, ids, base_url="https://gdnval.example.org")
    engine.dispose()
    return {k: " ".join(v.split()) for k, v in sections(md).items()}
