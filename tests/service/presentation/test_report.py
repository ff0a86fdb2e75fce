"""The Markdown test report from stored jobs: every section, real stored numbers, links to samples.

The stored jobs mimic one GPU run of each table of the user's report: capability checks, the GDN
accuracy matrix, Triton-vs-eager speed and memory, P2P-vs-Ulysses CP tables and a training
trajectory (the real suites' quick jobs render through the same code; see test_gate_http for a
report of jobs a real executor ran).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session

from service.persistence import cases as case_store
from service.persistence import commits
from service.persistence import samples as sample_store
from service.persistence.models import JobRow
from service.presentation.gate_report import gate_markdown
from service.presentation.markdown import comparison_markdown
from service.presentation.report import build_report
from workers.suite import Case, Metric

pytestmark = pytest.mark.stores("sqlite")  # the `engine` of these tests is a SQLite file

SUITE = "reportdemo"
MIB = 1024 * 1024
METRICS = (
    Metric("triton_available", "bool", "check", "higher", bound=1.0),
    Metric("o_rel_l2", "ratio", "accuracy", bound=1e-2),
    Metric("o_max_abs", "abs", "accuracy", diagnostic=True),
    Metric("o_max_rel", "ratio", "accuracy", diagnostic=True),
    Metric("o_finite", "bool", "accuracy", "higher", bound=1.0),
    Metric("dq_rel_l2", "ratio", "accuracy", bound=1e-2),
    Metric("fwd_bwd_ms", "ms", "time"),
    Metric("peak_bytes", "bytes", "memory"),
    Metric("loss_rel_err", "ratio", "trajectory", bound=4e-4),
)
CASES = {
    "capability": Case(SUITE, "capability", {"kind": "capability"}),
    "acc": Case(SUITE, "acc_T8192", {"kind": "accuracy", "seq_len": 8192}),
    "eager": Case(SUITE, "speed_T8192_eager", {"seq_len": 8192, "backend": "eager"}),
    "triton": Case(SUITE, "speed_T8192_triton", {"seq_len": 8192, "backend": "triton"}),
    "ulysses": Case(SUITE, "cp4_T16384_ulysses", {"seq_len": 16384, "mode": "ulysses"}),
    "p2p": Case(SUITE, "cp4_T16384_p2p", {"seq_len": 16384, "mode": "p2p"}),
    "train": Case(SUITE, "net4_p2p_train", {"layers": 4, "mode": "p2p", "steps": 10}),
}
INFO = {"device_name": "NVIDIA H200", "driver": "cuda 12.8", "torch": "2.13.0", "triton": "3.9.0",
        "python": "3.11.7"}


def add_job(
    engine, sha: str, *, triton_ms: float = 10.0, rel_l2: float = 5.86e-3, nan_step: int | None = None
) -> int:
    with Session(engine) as s, s.begin():
        commit = commits.ensure_commit(s, sha)
        job = JobRow(suite=SUITE, preset="full", params={}, commit_id=commit.id, device="cuda", world_size=4,
                  status="succeeded", info={**INFO, "commit": sha})
        s.add(job)
        s.flush()
        mids = sample_store.ensure_metrics(s, SUITE, METRICS)
        cids = case_store.ensure_cases(s, CASES.values(), "cuda", 4)
        for c in CASES.values():
            case_store.set_case_result(s, job.id, cids[c.name], "passed", None)
        job_id = job.id
    rows: list[tuple[int, int, int, int, float]] = []

    def put(case: str, metric: str, values: list[float], ranks: int = 4) -> None:
        for r in range(ranks):
            cid, mid = cids[CASES[case].name], mids[metric]
            rows.extend((cid, mid, r, i, v * (1 + 0.001 * r)) for i, v in enumerate(values))

    put("capability", "triton_available", [1.0], ranks=1)
    put("acc", "o_rel_l2", [rel_l2 / 1.003])
    put("acc", "o_max_abs", [0.0156])
    put("acc", "o_max_rel", [0.38])
    put("acc", "o_finite", [1.0])
    put("acc", "dq_rel_l2", [4.1e-3])
    put("eager", "fwd_bwd_ms", [126.5 + 0.1 * i for i in range(20)], ranks=1)
    put("triton", "fwd_bwd_ms", [triton_ms + 0.01 * i for i in range(20)], ranks=1)
    put("eager", "peak_bytes", [3.84 * 100 * MIB], ranks=1)
    put("triton", "peak_bytes", [100 * MIB], ranks=1)
    put("ulysses", "fwd_bwd_ms", [114.4 + 0.1 * i for i in range(20)])
    put("p2p", "fwd_bwd_ms", [100.0 + 0.1 * i for i in range(20)])
    put("ulysses", "peak_bytes", [2000 * MIB])
    put("p2p", "peak_bytes", [2012 * MIB])
    steps = [1e-4 + 1e-5 * i for i in range(10)]
    if nan_step is not None:
        steps[nan_step] = float("nan")
    put("train", "loss_rel_err", steps)
    sample_store.insert_samples(engine, job_id, rows)
    return job_id


def section(md: str, title: str) -> str:
    start = md.index(f"## {title}\n")
    nxt = md.find("\n## ", start + 3)
    return md[start: nxt if nxt != -1 else len(md)]


def rows_of(text: str, first: str) -> list[list[str]]:
    """The rows of the table in `text` whose header starts with `first`, as cell texts."""
    block = next(b for b in text.split("\n\n") if b.startswith(f"| {first} |"))
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in block.splitlines()[2:]]


def test_report_renders_every_judged_metric_with_stored_numbers_and_links(engine) -> None:
    """A suite without report code of its own: the generic section holds every judged metric."""
    job = add_job(engine, "1" * 40)
    with Session(engine) as s:
        md, cmps = build_report(s, [job], base_url="https://svc.example.org")
    assert cmps == [] and "_No" not in md
    link = f"(https://svc.example.org/jobs/{job}#case-"
    env = section(md, "Environment and backends")
    for fact in ("NVIDIA H200 (cuda × 4)", "2.13.0", "3.9.0", "`111111111111`"):
        assert fact in env, fact
    generic = section(md, f"Suite {SUITE}")
    assert rows_of(generic, "case")[0][1] == "1/1"  # the capability check holds
    acc = next(r for r in rows_of(generic, "case | o") if r[0].startswith("[acc_T8192]"))
    # the worst rank (rank 3) carries the report's worst relative-L2, 5.86e-3, within its bound
    assert acc[1] == "5.860e-03" and re.fullmatch(r"4\.\d+e-03", acc[2]) and acc[3] == "yes"
    assert "0.01565" not in generic  # max abs stays on the job page
    speed = {r[1] if r[1] != "–" else r[0].split("]")[0][1:]: r for r in rows_of(generic, "mode")}
    # eager 127.45 / triton 10.095 ms, and the time saved (U − P) / U of ulysses 115.70 and p2p 101.25 ms,
    # each with the interval of the repetitions (the pivots' cells)
    assert any(re.fullmatch(r"12\.6× \[12\.\d+, 12\.\d+\]", c) for c in speed["triton"]), speed["triton"]
    assert "3.84× lower" in speed["triton"] and "12.0 MiB higher (+0.6%)" in speed["p2p"]
    assert any(re.fullmatch(r"\+12\.5% \[\+\d+\.\d, \+\d+\.\d\]", c) for c in speed["p2p"]), speed["p2p"]
    assert "net4_p2p_train" in generic and "✗" not in generic
    assert "Every bound holds; no case errored." in section(md, "Conclusions")
    # one link per row, on its first cell, to the case on the job page
    rows = [ln for ln in generic.splitlines() if ln.startswith("| [")]
    assert rows and all(ln.count(link) == 1 and ln.index(link) < ln.index(" | ") for ln in rows)


def test_report_with_a_base_shows_the_comparison_and_failures(engine) -> None:
    base = add_job(engine, "2" * 40)
    head = add_job(engine, "3" * 40, triton_ms=12.0, rel_l2=2e-2, nan_step=4)
    with Session(engine) as s:
        md, (cmp,) = build_report(s, [head], [base], base_url="https://svc.example.org")
    assert not cmp.passed
    comp = section(md, "Against the base")
    assert f"| {SUITE} | [#{head}](https://svc.example.org/jobs/{head}) | [#{base}]" in comp
    assert "| FAIL |" in comp
    assert "🔴 regressed" in comp and "fwd_bwd_ms" in comp  # triton 10 -> 12 ms
    assert "🔴 failed" in comp and "breaks bound" in comp  # rel-L2 2e-2 > 1e-2
    assert "non-finite value at idx 4" in comp and "| unchanged |" not in comp
    assert f"(https://svc.example.org/jobs/{head}#case-" in comp
    generic = section(md, f"Suite {SUITE}")
    assert "0.02 ✗" in generic and "NaN ✗ not finite" in generic
    assert f"Failed: {SUITE} #{head} acc_T8192: out of bound (o_rel_l2)." in section(md, "Conclusions")
    assert comparison_markdown(cmp).count("\n| ") >= 3


def test_a_job_set_report_has_the_cross_run_sections_and_no_loopback_link(engine, tmp_path: Path) -> None:
    """`gdnval report J1 J2` of a cp-layer job at CP4 and one at CP8: one report, with the weak
    scaling between them; a loopback --link-base gives no links at all."""
    from service.cli import main
    from tests.support.planted_report import plant_job

    ids = []
    for world, T in ((4, 65536), (8, 131072)):
        cases = {f"{mode}_triton_T{T}_B1": (
            {"mode": mode, "backend": "triton", "dtype": "bfloat16", "batch": 1, "seq_len": T,
             "valid_len": None, "shards": None, "warmup": 5, "repeat": 20},
            {"fwd_bwd_ms": [[ms * (1 + 0.002 * i) for i in range(20)]] * world,
             "fwd_ms": [[ms / 3] * 20] * world})
            for mode, ms in (("ulysses", 160.0 * world / 4), ("p2p", 133.0 + world))}
        ids.append(plant_job(engine, "cp-layer", world, "cuda", cases))
    url = str(engine.url)
    for base, links in (("http://127.0.0.1:8000", False), ("https://results.example.org", True)):
        out = tmp_path / "r.md"
        res = CliRunner().invoke(main, ["report", *map(str, ids), "--db", url, "--link-base", base,
                                        "--out", str(out)])
        assert res.exit_code == 0, res.output
        md = out.read_text()
        assert md.startswith("# gdnval test report: cp-layer @ ")
        assert ("](https://results.example.org/jobs/" in md) is links and "127.0.0.1" not in md
        assert "_No" not in md
        scaling = section(md, "CP weak scaling")
        assert "| CP4 → CP8 | 16K | p2p |" in re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", scaling)


def test_report_errors_name_the_job(engine) -> None:
    job = add_job(engine, "4" * 40)
    with Session(engine) as s, pytest.raises(LookupError, match="no job 77"):
        build_report(s, [77])
    with Session(engine) as s, pytest.raises(ValueError, match="ran suite"):
        with Session(engine) as s2, s2.begin():
            other = JobRow(suite="other", preset="quick", params={}, device="cpu", world_size=1,
                        status="succeeded")
            s2.add(other)
            s2.flush()
            other_id = other.id
        build_report(s, [job], [other_id])


def test_report_cli_reads_the_store(engine, tmp_path: Path) -> None:
    from service.cli import main

    job = add_job(engine, "5" * 40)
    url = str(engine.url)
    out = tmp_path / "r.md"
    args = ["report", str(job), "--db", url, "--link-base", "https://x.example.org", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.startswith("# gdnval test report: reportdemo @ 555555555555")
    assert f"(https://x.example.org/jobs/{job}#case-" in text
    bad = CliRunner().invoke(main, ["report", "999", "--db", url])
    assert bad.exit_code == 2 and "no job 999" in bad.output  # could not run


def test_gate_markdown_of_an_infra_failure_names_the_reason() -> None:
    from service.domain.gate import GateJob, GateState

    job = GateJob("head", "x", 3, "failed", "h" * 40, error="rank 1 died")
    why = "could not run: head job 3 (x) failed: rank 1 died"
    state = GateState("done", 2, "error", why, "h" * 40, "b" * 40, "parent", [job])
    md = gate_markdown(state, "http://svc")
    assert "COULD NOT RUN (exit 2)" in md and "rank 1 died" in md and "[#3](http://svc/jobs/3)" in md
