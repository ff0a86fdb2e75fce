"""The results pages in a real browser: Debian's chromium driven by Playwright against a real
server (uvicorn subprocess, SQLite file) holding realistic jobs ingested through the store.

One server and one browser for the whole module (the machine is small and shared). Screenshots
go to test-artifacts/web/ (git-ignored): desktop at 1280 px and phone width.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import Browser, Page, expect, sync_playwright
from sqlalchemy.orm import Session

from service.persistence import artifacts as artifact_store
from service.persistence import baselines, commits, db
from service.persistence import cases as case_store
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store
from service.persistence.models import CaseRow, JobRow
from tests.support.browser import ARTIFACTS, CHROMIUM
from tests.support.paths import ROOT
from tests.support.ports import free_port
from workers.suite import Case, Metric

TOKEN = "web-test-token"
MIB = 1024 * 1024
REPS = 20
STEPS = 30

pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
    pytest.mark.slow,  # a real server and a browser
]

# Realistic jobs of the real `gdn-op` suite (its metrics and case matrix: workers/suites/gdn_op/spec.py):
# one case per shape and backend; per tensor the errors per seed, every timing repetition,
# incremental peak memory, and the ratios to the baseline (fla); numbers shaped like the report's.
GDN = "gdn-op"
GDN_PARAMS = {"seq_lens": [8192, 16384], "packed": [], "modes": ["stateful"], "qk_heads": [16]}
TRITON_MS = {8192: 9.8, 16384: 17.0}
EAGER_X = {8192: 12.65, 16384: 22.37}
REL_L2 = {"o": 2.1e-3, "ht": 1.2e-3, "dq": 3.3e-3, "dk": 4.1e-3, "dv": 2.2e-3, "dg": 3.9e-3,
          "dbeta": 2.8e-3, "dh0": 1.6e-3}
BROKEN = (16384, "dk", 7.2e-3)  # head only: Triton dk out of its 5e-3 bound
SLOW = 1.3  # head only: Triton fwd+bwd 30% slower (the planted time regression)

# A multi-rank CP job (test-local metadata: no cp suite is registered yet): every rank's timings
# and memory, and per-step trajectory errors of a short training run.
CP = "cp-demo"
CP_WORLD = 4
CP_METRICS: tuple[Metric, ...] = (
    Metric("layer_fwd_bwd_ms", "ms", "time"),
    Metric("peak_allocated", "bytes", "memory"),
    Metric("loss_max_rel", "", "trajectory", bound=4e-4),
    Metric("grad_norm_max_rel", "", "trajectory", bound=1e-2),
    Metric("no_order_mismatch", "bool", "check", direction="higher", bound=1.0),
)


def _gdn_cases() -> list[Case]:
    from workers.registry import get_suite

    suite = get_suite(GDN)
    return suite.cases(suite.resolve_params("full", GDN_PARAMS))


def _cp_cases() -> list[Case]:
    return [
        Case(CP, f"{mode}-T16k", {"mode": mode, "seq_len": 16384}) for mode in ("ulysses", "p2p")
    ] + [Case(CP, "train-p2p-4l", {"mode": "p2p", "layers": 4, "steps": STEPS, "train": True})]


@dataclass
class Seeded:
    base: int
    head: int
    running: int
    failed: int
    cp: int
    fingerprints: dict[str, str]
    shas: dict[str, str]  # the base and head commits of the git repository the server knows


def _job(engine: Any, suite: str, world: int, commit: str, status: str, minutes_ago: int,
         metrics: tuple[Metric, ...], cases: list[Case], statuses: dict[str, str]) -> tuple[int, dict, dict]:
    """A job row with its metric and case rows, as the service writes them when a job runs."""
    now = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    with Session(engine) as s, s.begin():
        c = commits.ensure_commit(s, commit)
        job = JobRow(suite=suite, preset="full", params=GDN_PARAMS if suite == GDN else {},
                  commit_id=c.id if c else None, device="cuda", world_size=world, status=status,
                  progress_done=len(cases), progress_total=len(cases), attempts=1,
                  info={"device_name": "NVIDIA H200", "driver": "570.86", "torch": "2.13.0",
                        "triton": "3.9.0", "python": "3.11.7"},
                  created_at=now - timedelta(minutes=4), started_at=now - timedelta(minutes=3),
                  finished_at=now if status in ("succeeded", "failed") else None)
        s.add(job)
        s.flush()
        metric_ids = sample_store.ensure_metrics(s, suite, metrics)
        case_ids = case_store.ensure_cases(s, cases, "cuda", world)
        for case in cases:
            status = statuses.get(case.name, "passed")
            case_store.set_case_result(s, job.id, case_ids[case.name], status, None)
        return job.id, metric_ids, case_ids


def _gdn_job(engine: Any, *, commit: str, status: str, minutes_ago: int, rng: np.random.Generator,
             head: bool = False) -> int:
    from workers.registry import get_suite

    cases = _gdn_cases()
    broken = {c.name: "failed" for c in cases
              if head and c.params["seq_len"] == BROKEN[0] and c.params["backend"] == "triton"}
    job_id, mids, cids = _job(engine, GDN, 1, commit, status, minutes_ago, get_suite(GDN).metrics, cases,
                              broken)
    rows: list[tuple[int, int, int, int, float]] = []
    peaks = {"eager": 3.84, "triton": 1.0, "fla": 1.05}
    for case in cases:
        cid, T, b = cids[case.name], case.params["seq_len"], case.params["backend"]
        slow = SLOW if head and T == 8192 else 1.0
        factor = {"eager": EAGER_X[T], "triton": slow, "fla": 1.12}[b]
        fwd_bwd = TRITON_MS[T] * factor
        for metric, share in (("fwd_ms", 0.35), ("fwd_bwd_ms", 1.0)):
            vals = rng.normal(fwd_bwd * share, fwd_bwd * share * 0.015, REPS)
            rows += [(cid, mids[metric], 0, i, float(v)) for i, v in enumerate(vals)]
        rows.append((cid, mids["peak_bytes"], 0, 0, peaks[b] * 400 * MIB * T / 8192))
        for t, rel in REL_L2.items():
            scale = {"eager": 0.2, "triton": 1.0, "fla": 1.1}[b]
            for seed in range(3):
                v = rel * scale * (1 - 0.1 * seed)
                if head and b == "triton" and (T, t) == BROKEN[:2]:
                    v = BROKEN[2]
                rows += [(cid, mids[f"{t}_rel_l2"], 0, seed, v),
                         (cid, mids[f"{t}_max_abs"], 0, seed, v * 4.0),
                         (cid, mids[f"{t}_max_rel"], 0, seed, v * 30.0),
                         (cid, mids[f"{t}_finite"], 0, seed, 1.0)]
        if b != "fla":  # the baseline: the ratios are the other backends'
            rows.append((cid, mids["ratio_to_baseline"], 0, 0, fwd_bwd / (TRITON_MS[T] * 1.12)))
            rows.append((cid, mids["peak_ratio_to_baseline"], 0, 0, peaks[b] / 1.05))
    sample_store.insert_samples(engine, job_id, rows)
    return job_id


def _cp_job(engine: Any, *, commit: str, rng: np.random.Generator) -> int:
    cases = _cp_cases()
    job_id, mids, cids = _job(engine, CP, CP_WORLD, commit, "succeeded", 20, CP_METRICS, cases, {})
    rows: list[tuple[int, int, int, int, float]] = []
    for case in cases[:2]:
        cid = cids[case.name]
        ms = 300.0 if case.params["mode"] == "ulysses" else 256.4  # P2P 17% faster, as in the report
        for r in range(CP_WORLD):
            vals = rng.normal(ms * (1 + 0.01 * r), ms * 0.01, REPS)
            rows += [(cid, mids["layer_fwd_bwd_ms"], r, i, float(v)) for i, v in enumerate(vals)]
            peak = (5200 + 12 * (case.params["mode"] == "p2p")) * MIB  # P2P ~12 MiB higher
            rows.append((cid, mids["peak_allocated"], r, 0, peak))
        rows.append((cid, mids["no_order_mismatch"], 0, 0, 1.0))
    cid = cids["train-p2p-4l"]
    for step in range(STEPS):
        for r in range(CP_WORLD):
            rows.append((cid, mids["loss_max_rel"], r, step, 1e-5 * (1 + step / STEPS) * (1 + r)))
            rows.append((cid, mids["grad_norm_max_rel"], r, step, 2e-3 * (1.2 + np.sin(step)) / (1 + r)))
    sample_store.insert_samples(engine, job_id, rows)
    return job_id


def _finish(engine: Any, job_id: int) -> None:
    """What the service does when a job ends: store its summaries once."""
    with Session(engine) as s, s.begin():
        summary_store.store_summary(s, job_id)


TRACE = b'{"traceEvents": [{"name": "chunk_fwd", "ph": "X", "ts": 0, "dur": 812}]}'
TRACE_NAME = "rank0/trace-p2p.trace.json.gz"  # the runtime prefixes the rank, as the profile suite's are


def make_repo(path: Path) -> dict[str, str]:
    """base, a commit without jobs, head: the first-parent line history places its points on."""
    from tests.support.gate_suite import git

    path.mkdir()
    git(path, "init", "-q")
    shas = {}
    for name in ("base", "between", "head"):
        (path / "kernel.txt").write_text(name)
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", name)
        shas[name] = git(path, "rev-parse", "HEAD")
    return shas


def seed(engine: Any, artifacts_dir: Path, shas: dict[str, str]) -> Seeded:
    rng = np.random.default_rng(7)
    base = _gdn_job(engine, commit=shas["base"], status="succeeded", minutes_ago=40, rng=rng)
    head = _gdn_job(engine, commit=shas["head"], status="succeeded", minutes_ago=30, rng=rng, head=True)
    cp = _cp_job(engine, commit=shas["head"], rng=rng)
    failed = _gdn_job(engine, commit="0badc0ffee", status="failed", minutes_ago=10, rng=rng)
    running = _gdn_job(engine, commit=shas["head"], status="running", minutes_ago=0, rng=rng)
    for job_id in (base, head, cp, failed):
        _finish(engine, job_id)
    with Session(engine) as s, s.begin():  # a profiler trace, as the profile suite stores them
        trace = gzip.compress(TRACE)
        artifact_store.save_artifact(s, head, TRACE_NAME, "application/gzip", trace, artifacts_dir)
    with Session(engine) as s, s.begin():
        j = s.get(JobRow, running)
        j.progress_done, j.progress_total, j.progress_message = 1, 6, "case T8192_stateful_hqk16_hv32_b1"
        # held by another (live) dispatcher: the test server's own dispatcher leaves it alone
        j.claimed_by, j.heartbeat_at = "elsewhere:1:web-test", datetime.now(UTC)
        baselines.set_baseline(s, "release", job_id=base, note="last release")
        j = s.get(JobRow, failed)
        j.error = "rank 0 raised RuntimeError: CUDA error: an illegal memory access was encountered"
    fps = {c.name: c.fingerprint("cuda", 1) for c in _gdn_cases()}
    fps |= {c.name: c.fingerprint("cuda", CP_WORLD) for c in _cp_cases()}
    return Seeded(base, head, running, failed, cp, fps, shas)


# ------------------------------------------------------------------------------------- fixtures


@contextlib.contextmanager
def _serving(
    script: str, db_url: str, artifacts: Path, ready_path: str, timeout: float = 60, **env_vars: str
) -> Iterator[str]:
    """Run `script` (a uvicorn server taking db url, token, port, artifacts dir) in a child
    process, wait until `ready_path` answers 200, yield its base URL, stop it afterwards."""
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_vars}
    proc = subprocess.Popen([sys.executable, "-c", script, db_url, TOKEN, str(port), str(artifacts)],
                            cwd=artifacts.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(base + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out = proc.stdout.read().decode() if proc.stdout else ""
                pytest.fail(f"server did not start:\n{out[-3000:]}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# The real app with its dispatcher and the local executor (the submit test runs a real job).
SERVER = """
import sys, uvicorn
from service.settings import Settings
settings = Settings(db_url=sys.argv[1], api_token=sys.argv[2], artifacts_dir=sys.argv[4],
                    executor="local", lease_s=3600, poll_interval_s=0.2)
from service.app import create_app
uvicorn.run(create_app(settings), host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Seeded, Any]]:
    tmp = tmp_path_factory.mktemp("web")
    url = f"sqlite:///{tmp / 'gdnval.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    seeded = seed(engine, tmp / "artifacts", make_repo(tmp / "repo"))
    try:
        with _serving(SERVER, url, tmp / "artifacts", "/jobs", GDNVAL_REPO=str(tmp / "repo")) as base:
            yield base, seeded, engine
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []  # script errors and server errors; an expected 4xx is not one
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 500 else None)
    pg.on("console", lambda m: errors.append(m.text)
          if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
    yield pg
    ctx.close()
    assert not errors, f"browser errors: {errors}"


def shot(page: Page, name: str, *, full: bool = True) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full)


def _no_horizontal_overflow(page: Page) -> None:
    """The page itself never scrolls sideways (wide tables scroll inside their own box)."""
    width = page.evaluate("document.documentElement.scrollWidth")
    view = page.evaluate("window.innerWidth")
    assert width <= view + 1, f"page is {width}px wide in a {view}px viewport"


# ---------------------------------------------------------------------------------------- tests

T8 = "T8192_stateful_hqk16_hv32_b1_triton"
T16 = "T16384_stateful_hqk16_hv32_b1_triton"
T8_EAGER = "T8192_stateful_hqk16_hv32_b1_eager"
T8_FLA = "T8192_stateful_hqk16_hv32_b1_fla"


def _row(page: Page, table: str, fp: str, **data: str) -> Any:
    sel = "".join(f'[data-{k}="{v}"]' for k, v in data.items())
    return page.locator(f'#{table} tr[data-case="{fp}"]{sel}')


def test_job_page_shows_the_stored_matrices_and_draws_the_plots(site: Any, page: Page) -> None:
    base, seeded, _ = site
    page.goto(f"{base}/jobs/{seeded.head}")
    expect(page.locator("h1")).to_contain_text(f"Job #{seeded.head}: gdn-op")
    expect(page.locator("dl.facts").first).to_contain_text(seeded.shas["head"])
    expect(page.locator("dl.facts").nth(1)).to_contain_text("NVIDIA H200")
    fp8, fp16 = seeded.fingerprints[T8], seeded.fingerprints[T16]
    # accuracy: the stored worst value over seeds, judged by the bound, a word beside the colour
    o = _row(page, "accuracy-table", fp8, tensor="o")
    expect(o.locator("td.num").nth(0)).to_have_text("2.100e-03✓")
    expect(o.locator("td.num").nth(1)).to_have_text("8.400e-03")
    expect(o.locator("td.num").nth(2)).to_have_text("0.063")
    expect(o.locator("td.num").nth(3)).to_have_text("yes✓")
    dk = _row(page, "accuracy-table", fp16, tensor="dk").locator("td.num").first
    expect(dk).to_have_text("7.200e-03✗ > bound")
    expect(dk).to_have_class("num bad")
    expect(dk).to_have_attribute("title", "bound ≤ 5.000e-03")
    # speed and memory: the Triton case against the job's baseline backend (gdn-op's `baseline`,
    # fla); the head's Triton is the planted 1.3x slower one: 1.12 / 1.3 = 0.86x
    sp = _row(page, "speed-table", fp8, metric="fwd_bwd_ms")
    expect(sp).to_contain_text(f"vs fla ({T8_FLA})")
    # a backend's speed-up, baseline median / this one, with the repetitions' 95% interval; coloured
    # (significant: 20 repetitions a side, 1.3x apart)
    gain = re.compile(r"^0\.8[5-7]\d?× \[0\.8\d+, 0\.8\d+\] ?slower$")
    expect(sp.locator("td.num").nth(4)).to_contain_text(gain)
    expect(sp.locator("td.num").nth(4)).to_have_class(re.compile(r"\bbad\b"))
    mem = _row(page, "memory-table", fp8, metric="peak_bytes")
    expect(mem.locator("td.num").nth(0)).to_have_text("400.0 MiB")
    expect(mem.locator("td.num").nth(1)).to_have_text("20.0 MiB lower (-4.8%)")  # 400 against 420 MiB
    # the finite checks sit in the accuracy table, not in a table of their own
    expect(page.locator("#checks-table")).to_have_count(0)
    # plots: every repetition of the case's backend (fwd, fwd+bwd x 20 reps x 1 rank), loaded when
    # the case comes into view
    page.locator(f"#case-{fp8}").scroll_into_view_if_needed()
    timing = page.locator(f"#case-{fp8} figure[data-plot=timing] svg")
    expect(timing.locator("circle.rep")).to_have_count(2 * REPS)
    expect(timing.locator("g.box")).to_have_count(2)
    expect(timing.locator("title").first).to_contain_text(f"Timing distribution of {T8}")
    # downloads: samples from the API, the stored profiler trace, the Markdown report
    def download(text: str) -> Any:
        return page.request.get(base + page.locator("a", has_text=text).first.get_attribute("href"))

    csv = download("CSV")
    assert csv.ok and csv.text().count("\n") > 2 * 3 * 2 * REPS
    with page.expect_download() as dl:  # the profile trace, by its full name, through the page's link
        page.locator("a", has_text=TRACE_NAME).click()
    assert gzip.decompress(Path(dl.value.path()).read_bytes()) == TRACE
    assert dl.value.suggested_filename == "trace-p2p.trace.json.gz"
    report = download("Markdown report")
    assert report.ok and "text/markdown" in report.headers["content-type"]
    # no public URL configured: the report names the case and links nowhere (never a loopback URL)
    assert "T16384_stateful_hqk16_hv32_b1_triton" in report.text() and "127.0.0.1" not in report.text()
    shot(page, "job-desktop")
    # the case's anchor, as a report under a public URL links it, lands on the case
    page.goto(f"{base}/jobs/{seeded.head}#case-{fp16}")
    expect(page.locator(f"#case-{fp16}")).to_be_in_viewport()
    expect(page.locator(f"#case-{fp16} .badge").first).to_have_text("failed")


def test_multi_rank_job_plots_every_rank_and_each_step(site: Any, page: Page) -> None:
    base, seeded, _ = site
    page.goto(f"{base}/jobs/{seeded.cp}")
    fp = seeded.fingerprints["p2p-T16k"]
    sp = _row(page, "speed-table", fp, metric="layer_fwd_bwd_ms")
    expect(sp).to_contain_text("vs ulysses (ulysses-T16k)")
    expect(sp.locator("td.num").nth(4)).to_contain_text("faster")
    expect(sp.locator("td.num").nth(3)).to_have_text(f"{REPS} × {CP_WORLD} ranks")
    page.locator(f"#case-{fp}").scroll_into_view_if_needed()  # its plots load as it comes into view
    timing = page.locator(f"#case-{fp} figure[data-plot=timing] svg")
    expect(timing.locator("circle.rep")).to_have_count(REPS * CP_WORLD)
    for r in range(CP_WORLD):
        expect(timing.locator("text", has_text=f"r{r}")).to_have_count(1)
    page.locator(f"#case-{seeded.fingerprints['train-p2p-4l']}").scroll_into_view_if_needed()
    traj = page.locator(f"#case-{seeded.fingerprints['train-p2p-4l']} figure[data-plot=trajectory] svg")
    expect(traj.locator("circle.step")).to_have_count(2 * STEPS)
    expect(traj.locator("line.bound")).to_have_count(2)
    loss = _row(page, "trajectory-table", seeded.fingerprints["train-p2p-4l"], metric="loss_max_rel")
    expect(loss.locator("td.num").first).to_contain_text("✓")  # worst rank 4e-5 * 2 < 4e-4
    expect(_row(page, "checks-table", fp, metric="no_order_mismatch")).to_contain_text("1✓")
    shot(page, "job-cp-desktop")


PAGE_BUDGET = 250 * 1024  # the job page at ~100k samples (docs/benchmarks.md, the job page)


def _ingest_big_cp_job(engine: Any) -> tuple[int, list[str], int]:
    """A CP-shaped job of ~100k samples through the store: 16 cases x 8 ranks, 4 timed metrics x
    100 repetitions and 2 trajectories x 200 steps each; finished, its summaries stored."""
    suite, ranks, reps, steps = "web-size", 8, 100, 200
    metrics = (*(Metric(f"{b}_{k}_ms", "ms", "time") for b in ("ulysses", "p2p") for k in ("fwd", "fwd_bwd")),
               Metric("loss_max_rel", "", "trajectory", bound=4e-4),
               Metric("grad_norm_max_rel", "", "trajectory", bound=1e-2))
    cases = [Case(suite, f"T{16 * (i + 1)}k", {"seq_len": 16384 * (i + 1)}) for i in range(16)]
    rng = np.random.default_rng(0)
    with db.write_tx(engine) as s:
        job = JobRow(suite=suite, preset="full", params={}, device="cuda", world_size=ranks, status="running",
                  attempts=1)
        s.add(job)
        s.flush()
        mids = sample_store.ensure_metrics(s, suite, metrics)
        cids = case_store.ensure_cases(s, cases, "cuda", ranks)
        for c in cases:
            case_store.set_case_result(s, job.id, cids[c.name], "passed", None)
        job_id = job.id
    rows = []
    for c in cases:
        for m in metrics:
            n = reps if m.kind == "time" else steps
            vals = rng.normal(100, 2, (ranks, n)) if m.kind == "time" else rng.random((ranks, n)) * 1e-4
            rows += [(cids[c.name], mids[m.name], r, i, float(vals[r, i]))
                     for r in range(ranks) for i in range(n)]
    sample_store.insert_samples(engine, job_id, rows)
    summary_store.finish_summary(engine, job_id, 1)
    with db.write_tx(engine) as s:
        s.get(JobRow, job_id).status = "succeeded"
    with Session(engine) as s:
        fps = [s.get(CaseRow, cids[c.name]).fingerprint for c in cases]
    return job_id, fps, len(rows)


def test_job_page_at_100k_samples_stays_small_and_draws_each_case_in_view(site: Any, page: Page) -> None:
    base, _, engine = site
    job_id, fps, n = _ingest_big_cp_job(engine)
    assert n >= 100_000
    resp = page.goto(f"{base}/jobs/{job_id}")
    body = resp.body()
    assert len(body) <= PAGE_BUDGET, f"job page of {n} samples is {len(body) / 1024:.0f} KiB"
    assert b"circle" not in body  # no case's plot inline: each arrives with its case
    # the plots of a case far down the page arrive as it comes into view, drawn in full
    last = page.locator(f"#case-{fps[-1]}")
    last.scroll_into_view_if_needed()
    expect(last.locator("figure[data-plot=timing] svg g.box")).to_have_count(4)
    expect(last.locator("figure[data-plot=trajectory] svg polyline.traj")).to_have_count(2)
    assert last.locator("figure[data-plot=timing] svg circle.rep").count() > 0


def test_pages_fit_a_phone_screen(site: Any, browser: Browser) -> None:
    base, seeded, _ = site
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    pg = ctx.new_page()
    for path, name in ((f"/jobs/{seeded.head}", "job-phone"), ("/jobs", "jobs-phone"),
                       (f"/compare?base={seeded.base}&head={seeded.head}", "compare-phone")):
        pg.goto(base + path)
        expect(pg.locator("h1")).to_be_visible()
        _no_horizontal_overflow(pg)
        shot(pg, name, full=name != "job-phone")
    ctx.close()


def test_jobs_list_filters_and_refreshes_progress_without_reload(site: Any, page: Page) -> None:
    base, seeded, engine = site
    page.goto(f"{base}/jobs")
    rows = page.locator("#job-rows tr")

    def job_row(job_id: int) -> Any:
        return page.locator("#job-rows tr", has=page.locator(f'a[href="/jobs/{job_id}"]'))

    running = job_row(seeded.running)
    expect(running).to_contain_text("running")
    expect(running).to_contain_text("1/6")
    expect(job_row(seeded.head)).to_contain_text("failed (1 of 6 cases)")  # 2 shapes x 3 backends
    expect(job_row(seeded.base)).to_contain_text("passed (6 cases)")
    expect(job_row(seeded.failed).locator("td").nth(1)).to_have_text("failed")
    shot(page, "jobs-desktop")
    page.evaluate("window.__marker = 'same page'")
    # the live server's dispatcher writes too: read-modify-write takes the lock at BEGIN (db.write_tx)
    with db.write_tx(engine) as s:
        s.get(JobRow, seeded.running).progress_done = 4
    expect(running).to_contain_text("4/6", timeout=10_000)
    with db.write_tx(engine) as s:  # a job submitted elsewhere appears by itself
        new = JobRow(suite=GDN, preset="quick", params={}, device="cuda", world_size=1, status="running",
                  claimed_by="elsewhere:1:web-test", heartbeat_at=datetime.now(UTC), progress_total=3)
        s.add(new)
        s.flush()
        new_id = new.id
    expect(job_row(new_id)).to_contain_text("0/3", timeout=10_000)
    with db.write_tx(engine) as s:
        j = s.get(JobRow, seeded.running)
        j.status, j.progress_done, j.finished_at = "cancelled", 6, datetime.now(UTC)
    expect(running).to_contain_text("cancelled", timeout=10_000)
    assert page.evaluate("window.__marker") == "same page"  # refreshed in place, not reloaded
    # filters
    page.select_option("form.filters select[name=status]", "failed")
    page.click("form.filters button")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("0badc0ffee")
    page.goto(f"{base}/jobs?commit={seeded.shas['base'][:6]}")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(seeded.shas["base"][:10])
    page.goto(f"{base}/jobs?suite={CP}")
    expect(rows).to_have_count(1)
    page.goto(f"{base}/jobs?suite=nope")
    expect(rows.first).to_contain_text("No jobs match")


def test_submit_form_needs_the_token_and_runs_a_real_job(site: Any, page: Page) -> None:
    """The form queues a real `capability` quick job (in-process checks only, to stay cheap); the
    service's dispatcher runs it and the job page follows it live until its matrices appear."""
    from workers.registry import get_suite

    params = {"process_checks": False}
    suite = get_suite("capability")
    cases = suite.cases(suite.resolve_params("quick", params))
    base, _, _ = site
    page.goto(f"{base}/jobs")
    page.click("details#submit summary")
    form = page.locator("details#submit form")
    form.locator("select[name=suite]").select_option("capability")
    expect(form.locator("select[name=device]")).to_have_value("cpu")
    form.locator("input[name=params]").fill(json.dumps(params))
    form.locator("input[name=token]").fill("wrong")
    form.locator("button[type=submit]").click()
    expect(page.locator(".notice.bad")).to_contain_text("Wrong or missing API token")
    form = page.locator("details#submit form")
    expect(form.locator("select[name=suite]")).to_have_value("capability")  # the form keeps its values
    form.locator("input[name=params]").fill('{"no_such_param": 1}')
    form.locator("input[name=token]").fill(TOKEN)
    form.locator("button[type=submit]").click()
    expect(page.locator(".notice.bad")).to_contain_text("no_such_param")  # the API's own validation
    form = page.locator("details#submit form")
    form.locator("input[name=params]").fill(json.dumps(params))
    form.locator("input[name=token]").fill(TOKEN)
    form.locator("button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/jobs/\d+$"))
    # the page follows the run and reloads itself when it settles
    expect(page.locator("#job-run-status .badge")).to_have_text("succeeded", timeout=90_000)
    expect(page.locator("#job-verdict")).to_have_text("passed")  # the code passed, apart from the run
    expect(page.locator("section.case")).to_have_count(len(cases))
    expect(page.locator("dl.facts").first).to_contain_text("process_checks=False")
    failfast = next(c for c in cases if c.expected_error)
    section = page.locator(f"#case-{failfast.fingerprint('cpu', 1)}")
    expect(section.locator(".badge")).to_have_text("expected error")
    expect(section.locator("pre")).to_contain_text(failfast.expected_error)
    expect(page.locator("#checks-table tbody tr[data-metric]")).to_have_count(  # 2 checks per backend probe
        sum(1 for c in cases if c.name.startswith("triton_available")) + 2 * sum(
            1 for c in cases if c.name.startswith("backend_")))
    expect(page.locator("dl.facts").nth(1)).to_contain_text("torch")  # versions reported by the run
    shot(page, "job-real-capability")


def test_failed_job_shows_its_error(site: Any, page: Page) -> None:
    base, seeded, _ = site
    page.goto(f"{base}/jobs/{seeded.failed}")
    expect(page.locator(".notice.bad")).to_contain_text("illegal memory access")
    page.goto(f"{base}/jobs/999999")
    expect(page.locator("h1")).to_contain_text("404")


def test_compare_page_shows_the_planted_regression(site: Any, page: Page) -> None:
    base, seeded, _ = site
    page.goto(f"{base}/compare?base={seeded.base}&head={seeded.head}")
    fp8, fp16 = seeded.fingerprints[T8], seeded.fingerprints[T16]
    fp8_eager = seeded.fingerprints[T8_EAGER]
    row = _row(page, "compare-table", fp8, metric="fwd_bwd_ms")
    expect(row).to_have_attribute("data-verdict", "regressed")
    expect(row.locator(".badge")).to_have_text("regressed")
    expect(row.locator("td.num").nth(3)).to_have_text(re.compile(r"^1\.[23]\d\d$"))  # ratio ~1.3
    expect(row.locator("td.num").nth(5)).not_to_have_text("–")  # p-value
    expect(_row(page, "compare-table", fp8_eager, metric="fwd_bwd_ms")).to_have_count(0)  # unchanged: hidden
    case_cell = page.locator(f'#compare-table tr[data-case="{fp8}"] td.casecell')
    expect(case_cell).to_contain_text("unchanged not shown")
    dk = _row(page, "compare-table", fp16, metric="dk_rel_l2")
    expect(dk).to_have_attribute("data-verdict", "failed")
    expect(page.locator("#base-job")).to_have_attribute("href", f"/jobs/{seeded.base}")
    expect(page.locator("#head-job")).to_have_attribute("href", f"/jobs/{seeded.head}")
    expect(page.locator("main")).to_contain_text("FAIL")
    shot(page, "compare-desktop")
    page.click("p.small a:text-is('every metric')")
    expect(_row(page, "compare-table", fp8_eager, metric="fwd_bwd_ms")).to_have_attribute(
        "data-verdict", re.compile("unchanged|inconclusive"))
    page.click("p.small a:text-is('regressions and failures')")
    verdicts = page.locator("#compare-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.verdict)")
    assert verdicts and set(verdicts) <= {"regressed", "failed", "worsened", "errored"}, verdicts
    # by commit: the newest succeeded job of the suite at each commit
    page.goto(f"{base}/compare?base={seeded.shas['base'][:8]}&head={seeded.shas['head'][:8]}&suite={GDN}")
    expect(_row(page, "compare-table", fp8, metric="fwd_bwd_ms")).to_have_attribute(
        "data-verdict", "regressed")
    # by a named baseline, and from the head job's "previous run" link
    page.goto(f"{base}/compare?base=release&head={seeded.head}")
    expect(_row(page, "compare-table", fp8, metric="fwd_bwd_ms")).to_have_attribute(
        "data-verdict", "regressed")
    page.goto(f"{base}/jobs/{seeded.head}")
    page.click("#compare-previous")
    expect(page.locator("#base-job")).to_have_attribute("href", f"/jobs/{seeded.base}")
    page.goto(f"{base}/compare?base={seeded.base}&head={seeded.cp}")
    expect(page.locator(".notice.bad")).to_contain_text("compare jobs of one suite")


def test_history_and_suite_overview(site: Any, page: Page) -> None:
    base, seeded, _ = site
    fp = seeded.fingerprints[T8]
    page.goto(f"{base}/history?fingerprint={fp}&metric=fwd_bwd_ms")
    svg = page.locator("figure[data-plot=history] svg")
    expect(svg.locator("circle.point")).to_have_count(2)  # the measured commits: base and head
    rows = page.locator("#history-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(1)).to_have_attribute("data-verdict", "regressed")  # the compare engine's verdict
    expect(rows.nth(1)).to_contain_text(re.compile(r"median \+(29|30|31)\.\d%"))
    commits = page.locator("#commit-table tbody tr")  # every first-parent commit once, oldest first
    expect(commits).to_have_count(3)
    expect(commits.nth(1)).to_contain_text("not measured")
    expect(commits.nth(2)).to_have_attribute("data-commit", seeded.shas["head"])
    shot(page, "history-desktop")
    page.goto(f"{base}/history/{GDN}?kind=time")
    rows = page.locator("#overview-table tbody tr")
    # 2 shapes x 3 backends x (fwd, fwd+bwd), + ratio_to_baseline of the 2 x 2 non-baseline cases
    expect(rows).to_have_count(2 * 3 * 2 + 2 * 2)
    expect(page.locator("#overview-table svg.spark")).to_have_count(16)
    moved = page.locator(f'#overview-table tr[data-case="{fp}"][data-metric="fwd_bwd_ms"]')
    expect(moved).to_have_attribute("data-verdict", "regressed")
    shot(page, "history-suite-desktop")


def test_suites_page_lists_presets_cases_and_bounds(site: Any, page: Page) -> None:
    from workers.registry import SUITE_MODULES, get_suite, suite_names

    base, _, _ = site
    page.goto(f"{base}/suites")
    expect(page.locator("h1")).to_have_text("Suites")
    # the server knows the shipped suites; other test modules register test-only ones in this process
    names = [n for n in suite_names() if SUITE_MODULES[n].startswith("workers.suites.")]
    assert GDN in names
    for name in names:
        d = get_suite(name).describe()
        section = page.locator(f"#suite-{name}")
        expect(section.locator("h2")).to_have_text(name)
        expect(section.locator("table.metrics tbody tr")).to_have_count(len(d["metrics"]))
        quick = d["presets"]["quick"]["cases"]
        expect(section.locator("details").first.locator("tbody tr")).to_have_count(len(quick))
    bound = page.locator("#suite-gdn-op table.metrics tr", has=page.locator('td:text-is("o_rel_l2")'))
    expect(bound.locator("td.num")).to_have_text("≤ 5.000e-03")
    shot(page, "suites-desktop", full=False)


# The same store served with protected reads (no dispatcher: it only reads).
PROTECTED_SERVER = """
import sys, uvicorn
from service.settings import Settings
settings = Settings(db_url=sys.argv[1], api_token=sys.argv[2], artifacts_dir=sys.argv[4], protect_reads=True,
                    dispatch=False, executor="local")
from service.app import create_app
uvicorn.run(create_app(settings), host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
"""


def test_protected_reads_a_logged_in_browser_downloads_from_the_job_page(
    site: Any, browser: Browser, tmp_path: Path
) -> None:
    """With protect_reads the download links point at the API; the browser has only its login
    cookie (no bearer header on a link) and gets the files; an anonymous browser does not."""
    _, seeded, engine = site
    with _serving(PROTECTED_SERVER, str(engine.url), tmp_path / "artifacts", "/login") as base:
        anonymous = browser.new_context()
        csv_path = f"/api/v1/jobs/{seeded.head}/samples?format=csv"
        assert anonymous.request.get(base + csv_path).status == 401
        assert anonymous.request.get(f"{base}/api/v1/jobs/{seeded.head}/artifacts/{TRACE_NAME}").status == 401
        anonymous.close()

        ctx = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
        pg = ctx.new_page()
        pg.goto(f"{base}/jobs/{seeded.head}")
        expect(pg).to_have_url(re.compile(r"/login\?next="))
        pg.fill("input[name=token]", TOKEN)
        pg.click("button[type=submit]")
        expect(pg).to_have_url(f"{base}/jobs/{seeded.head}")
        with pg.expect_download() as dl:
            pg.locator("a", has_text="CSV").first.click()
        body = Path(dl.value.path()).read_text()
        assert body.splitlines()[0].startswith("id,") and body.count("\n") > 2 * 3 * 2 * REPS
        link = pg.locator("a", has_text=TRACE_NAME)
        assert link.get_attribute("href") == f"/api/v1/jobs/{seeded.head}/artifacts/{TRACE_NAME}"
        with pg.expect_download() as dl:
            link.click()
        assert gzip.decompress(Path(dl.value.path()).read_bytes()) == TRACE
        js = pg.request.get(base + pg.locator("a", has_text="JSON").first.get_attribute("href"))
        assert js.ok and js.json()["items"]
        ctx.close()
