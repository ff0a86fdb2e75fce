"""The campaign report of jobs run here: `gdnval run capability` and `gdnval run gdn-op` (quick
presets, CPU), each stored through the dispatcher's sink; the report's capability and
single-device sections print the stored statistics of every case."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session

from service.persistence import db
from service.persistence import summaries as summary_store
from service.presentation.campaign_report import campaign_report_markdown
from service.presentation.numbers import fmt
from tests.support.report_markdown import joined, linked_rows, sections
from tests.support.run_json import store_run

pytestmark = pytest.mark.slow  # two suites run in rank processes


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from service.cli import main

    tmp = tmp_path_factory.mktemp("campaign-runs")
    engine = db.make_engine(f"sqlite:///{tmp / 'store.db'}")
    db.upgrade(engine)
    ids = []
    for suite in ("capability", "gdn-op"):
        run = tmp / f"{suite}.json"
        res = CliRunner().invoke(main, ["run", suite, "--preset", "quick", "--json", str(run)])
        assert res.exit_code == 0, res.output
        ids.append(store_run(engine, run))
    with Session(engine) as s:
        md = campaign_report_markdown(s, ids, base_url="https://gdnval.example.org")
        cases = {j: summary_store.case_summaries(s, j) for j in ids}
    engine.dispose()
    return {"md": md, "ids": ids, "cases": cases}


def test_sections_of_a_cpu_capability_and_gdn_op_campaign(stored: dict[str, Any]) -> None:
    got = sections(stored["md"])
    assert list(got) == [
        "Environment and backends",
        "Capability and fail-fast",
        "Single-device GDN accuracy",
        "Single-device GDN speed and memory",
        "Not run",
        "Conclusions",
    ]
    assert "_No" not in stored["md"] and "0.0 MiB" not in stored["md"]
    assert "Every bound holds; no case errored." in got["Conclusions"]
    # only eager is timed on a CPU, which tracks no memory: two sections say why they have no rows
    assert "- Single-device speed-up: only eager timed" in got["Not run"]
    assert "- Single-device memory: the device keeps no allocator statistics (cpu)." in got["Not run"]


def test_capability_outcomes_are_the_stored_ones(stored: dict[str, Any]) -> None:
    cap = {c.fingerprint: c for c in stored["cases"][stored["ids"][0]]}
    rows = linked_rows(sections(stored["md"])["Capability and fail-fast"])
    assert len(rows) == len(cap)
    for (_, fingerprint), row in rows:
        c = cap[fingerprint]
        if c.expected_error:
            assert row["outcome"] == f"raised {c.expected_error}", c.name
        bounded = [m for m in c.metrics.values() if m.bound is not None]
        assert row["bounded checks holding"] == (f"{len(bounded)}/{len(bounded)}" if bounded else "–"), c.name


def test_gdn_numbers_are_the_stored_statistics(stored: dict[str, Any]) -> None:
    gdn = {c.fingerprint: c for c in stored["cases"][stored["ids"][1]]}
    got = sections(stored["md"])
    accuracy = linked_rows(got["Single-device GDN accuracy"])
    assert len(accuracy) == len(gdn) == 4
    for (_, fingerprint), row in accuracy:
        ms = gdn[fingerprint].metrics
        assert row["o"] == fmt(ms["o_rel_l2"].max) and row["dg"] == fmt(ms["dg_rel_l2"].max)
        assert row["final state"] == (fmt(ms["ht_rel_l2"].max) if "ht_rel_l2" in ms else "–")
        assert row["finite"] == "yes"
    speed = linked_rows(got["Single-device GDN speed and memory"])
    assert speed and len(speed) == sum("fwd_bwd_ms" in c.metrics for c in gdn.values())
    for (_, fingerprint), row in speed:
        fb, f = gdn[fingerprint].metrics["fwd_bwd_ms"], gdn[fingerprint].metrics["fwd_ms"]
        assert (row["fwd"], row["fwd+bwd"], row["fwd+bwd p90"], row["fwd+bwd min"]) == (
            f"{f.median:.3f}",
            f"{fb.median:.3f}",
            f"{fb.p90:.3f}",
            f"{fb.min:.3f}",
        )
        assert row["bwd estimate"] == f"{fb.median - f.median:.3f}"
    header, _ = joined(got["Single-device GDN speed and memory"])
    # only eager is timed and a CPU keeps no allocator statistics: the timing table alone (the Not
    # run lines say why there is no speed-up and no memory)
    assert header[-1] == "bwd estimate" and "speed-up vs eager" not in header and "incr. peak" not in header
    assert re.search(r"eager warm-up \d+, repeat \d+", got["Single-device GDN speed and memory"])


def test_the_report_reads_the_store_path(tmp_path: Path) -> None:
    """A report of a job id the store does not hold names it."""
    from service.domain.baselines import NotFound

    engine = db.make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    db.upgrade(engine)
    with Session(engine) as s, pytest.raises(NotFound, match="no job 7"):
        campaign_report_markdown(s, [7])
    engine.dispose()


def test_a_suite_without_report_code_appears_through_the_generic_section(tmp_path: Path) -> None:
    """A new suite registered with no module in service/presentation/suite_sections: its run,
    stored, shows every judged metric in the report (and on the report page, the same blocks)."""
    from service.cli import main
    from workers.registry import SUITE_MODULES, get_suite

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(SUITE_MODULES, "toy-generic", "tests.support.toy_suite")
        get_suite.cache_clear()
        run = tmp_path / "toy.json"
        res = CliRunner().invoke(main, ["run", "toy-generic", "--json", str(run)])
        assert res.exit_code == 0, res.output
        engine = db.make_engine(f"sqlite:///{tmp_path / 'store.db'}")
        db.upgrade(engine)
        job = store_run(engine, run)
        with Session(engine) as s:
            md = campaign_report_markdown(s, [job], base_url="https://gdnval.example.org")
        engine.dispose()
    get_suite.cache_clear()
    got = sections(md)
    assert list(got) == ["Environment and backends", "Suite toy-generic", "Conclusions"]
    generic = got["Suite toy-generic"]
    headers = [ln for ln in generic.splitlines() if ln.startswith("| ") and "---" not in ln and "[" not in ln]
    assert headers == ["| size | bounded checks holding |", "| size | out |", "| size | step |",
                       "| size | loss rel err |"]
    # the worst value of each judged metric, the median of the time, each row linked to its case
    assert "| 1.600e-04 |" in generic and re.search(r"\| 16\.\d+ ms \|", generic)
    assert generic.count(f"](https://gdnval.example.org/jobs/{job}#case-") == 8
    assert "Every bound holds; no case errored." in got["Conclusions"]
