"""The README's figures, drawn from stored results: fwd+bwd time against sequence length per
backend (SVG) and a screenshot of the job page (PNG).

    python scripts/readme_figures.py RESULTS.json [RESULTS.json ...] [--out docs/img]

Each RESULTS file is a recorded gdn-op run (`gdnval run gdn-op --json FILE`, format
"gdnval-run/1"), such as the H200 runs in benchmarks/results/. Nothing is drawn from the file
directly: a real service starts on a temporary SQLite store with `RecordedRunExecutor` as its
executor, each file is submitted as a job (`POST /api/v1/jobs` with the run's suite, preset,
parameters, device, world size and commit), and the dispatcher hands the job to that executor,
which replays the recorded samples through the job's sink, so they are stored, summarised and
judged as any job's are. The plot is drawn from the API's case summaries
(`GET /api/v1/jobs/{id}/cases`: median fwd+bwd per case, min..p90 as a whisker) with the pages' own
chart code (`service.web.charts.sweep_chart`); the screenshot is the first job's page in Debian's
chromium driven by Playwright.

Runs recorded before the backend became a case parameter (one case per shape, metrics named
`<backend>_fwd_bwd_ms`, `ratio_to_<baseline>`) are mapped onto today's matrix (one case per shape
and backend); a sample that maps onto no declared case and metric is not replayed, and the
script says how many were left out and which metrics they were.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workers import verdict  # noqa: E402
from workers.executors.base import Executor, JobOutcome, JobSink, JobSpec  # noqa: E402
from workers.registry import get_suite  # noqa: E402
from workers.suite import Case, Sample  # noqa: E402

RUN_FORMAT = "gdnval-run/1"
ONE_CALL_FORMAT = "gdn-one-call/1"  # benchmarks/gdn_one_call.py
RUNS_ENV = "GDNVAL_FIGURES_RUNS"  # the server's executor reads the recorded runs' paths from here
EXECUTOR = "scripts.readme_figures:RecordedRunExecutor"
PLOT_NAME, SHOT_NAME = "gdn-op-fwd-bwd.svg", "job-page.png"
TIME_METRIC = "fwd_bwd_ms"
VIEWPORT = {"width": 1280, "height": 900}
BATCH = 5000  # samples per sink call, as the ranks batch them
# bench_gdn_peers.py's backends by the names gdn-op gives them, and its default value heads
PEER_BACKENDS = {"ours": "triton", "fla": "fla", "flashqla": "flashqla"}
PEER_V_HEADS = 32


@dataclass(frozen=True)
class RecordedRun:
    """One `gdnval run --json` document: what was asked, what the ranks reported."""

    path: Path
    suite: str
    preset: str
    overrides: Mapping[str, Any]
    device: str
    world_size: int
    commit: str | None
    status: str
    error: str | None
    info: Mapping[str, Any]
    cases: Sequence[Mapping[str, Any]]
    samples: Sequence[Mapping[str, Any]]

    @classmethod
    def load(cls, path: Path) -> RecordedRun:
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and doc.get("format") == RUN_FORMAT:
            return cls(path, doc["suite"], doc["preset"], doc.get("overrides") or {}, doc["device"],
                       int(doc["world_size"]), doc.get("commit"), doc["status"], doc.get("error"),
                       doc.get("info") or {}, doc.get("cases") or [], doc.get("samples") or [])
        if isinstance(doc, dict) and doc.get("backend") in PEER_BACKENDS and "runs" in doc:
            return cls.from_peers(path, doc)
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{path}: format {found!r}; expected a {RUN_FORMAT!r} document (gdnval run "
                         "SUITE --json FILE), a benchmarks/bench_gdn_peers.py result or a "
                         "benchmarks/gdn_one_call.py file")

    @classmethod
    def load_all(cls, path: Path) -> list[RecordedRun]:
        """The runs of a file: a one-call measurement (`benchmarks/gdn_one_call.py`) holds one per
        backend, every other format one."""
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and doc.get("format") == ONE_CALL_FORMAT:
            return cls.from_one_call(path, doc)
        return [cls.load(path)]

    @classmethod
    def from_one_call(cls, path: Path, doc: Mapping[str, Any]) -> list[RecordedRun]:
        """A `gdn_one_call.py` file as one gdn-op job per backend, ours first: each process of a
        backend gives its `fwd_ms` and `fwd_bwd_ms` samples (the repetition index is the process),
        so that a spread between processes shows as the case's whisker; the peak and the
        accuracy come from the processes that measured them. Default settings only."""
        machine = doc.get("machine") or {}
        hv = int((doc.get("settings") or {}).get("v_heads") or PEER_V_HEADS)
        runs: list[RecordedRun] = []
        for name, backend in PEER_BACKENDS.items():
            procs = [p for p in doc["processes"] if p["backend"] == name and p.get("result")]
            if not procs:
                continue
            samples, lens, heads = [], set(), set()
            for p in procs:
                default = [r for r in p["result"]["runs"] if r.get("variant", "default") == "default"]
                samples += peer_samples(backend, default, hv, idx=int(p["process"]))
                lens |= {int(r["T"]) for r in default}
                heads |= {int(r["hqk"]) for r in default}
            versions = dict(procs[0]["result"].get("versions") or {})
            overrides = {"seq_lens": sorted(lens), "qk_heads": sorted(heads, reverse=True), "v_heads": hv,
                         "modes": ["stateful"], "backends": [backend], "baseline": backend}
            info = {"device_name": machine.get("gpu") or versions.get("gpu"), "driver": machine.get("driver"),
                    "torch": versions.get("torch"), "triton": versions.get("triton"), "versions": versions,
                    "command": doc.get("command"), "started_utc": doc.get("started_utc")}
            runs.append(cls(path, "gdn-op", "full", overrides, "cuda", 1, machine.get("commit"), "succeeded",
                            None, info, [], samples))
        if not runs:
            raise ValueError(f"{path}: no process of the one-call measurement has a result")
        return runs

    @classmethod
    def from_peers(cls, path: Path, doc: Mapping[str, Any]) -> RecordedRun:
        """A `bench_gdn_peers.py` result as the gdn-op job it measures: one backend, stateful, B = 1,
        bf16, its lengths and head layouts. It records medians, not repetitions: each case gets one
        `fwd_ms` sample, one `fwd_bwd_ms` (the lower of its two back-to-back medians, the figure
        docs/benchmarks.md reports), the incremental peak and each tensor's relative L2. Only the
        default settings' runs are taken (variants are tuning sweeps)."""
        backend = PEER_BACKENDS[doc["backend"]]
        runs = [r for r in doc["runs"] if r.get("variant", "default") == "default"]
        found = re.search(r"--v-heads[ =](\d+)", str(doc.get("command", "")))
        hv = int(found.group(1)) if found else PEER_V_HEADS
        lens = sorted({int(r["T"]) for r in runs})
        heads = sorted({int(r["hqk"]) for r in runs}, reverse=True)
        overrides = {"seq_lens": lens, "qk_heads": heads, "v_heads": hv, "modes": ["stateful"],
                     "backends": [backend], "baseline": backend}
        samples = peer_samples(backend, runs, hv)
        versions = dict(doc.get("versions") or {})
        info = {"device_name": versions.get("gpu"), "torch": versions.get("torch"),
                "triton": versions.get("triton"), "versions": versions,
                "command": doc.get("command")}
        return cls(path, "gdn-op", "full", overrides, "cuda", 1, None, "succeeded", None, info, [], samples)


def peer_samples(
    backend: str, runs: Sequence[Mapping[str, Any]], hv: int, idx: int = 0
) -> list[dict[str, Any]]:
    """A `bench_gdn_peers.py` process's default runs as gdn-op samples: `fwd_ms`, `fwd_bwd_ms`
    (the lower of its two back-to-back medians), the incremental peak and each tensor's relative
    L2, at repetition `idx`."""
    samples: list[dict[str, Any]] = []
    for r in runs:
        case = f"T{r['T']}_stateful_hqk{r['hqk']}_hv{hv}_b1_{backend}"
        times = [float(r[k]) for k in ("fwd_bwd_ms", "fwd_bwd_ms_again") if r.get(k) is not None]
        values = {"fwd_ms": r.get("fwd_ms"), "fwd_bwd_ms": min(times) if times else None,
                  "peak_bytes": float(r["peak_mib"]) * 2**20 if r.get("peak_mib") is not None else None,
                  **{f"{t}_rel_l2": v for t, v in (r.get("rel_l2") or {}).items()}}
        samples += [{"case": case, "metric": m, "value": v, "idx": idx}
                    for m, v in values.items() if v is not None]
    return samples


def current_cases(run: RecordedRun) -> tuple[list[Case], Any]:
    """Today's case matrix (and resolved parameters) for the run's suite, preset and overrides."""
    suite = get_suite(run.suite)
    params = suite.resolve_params(run.preset, run.overrides, device=run.device)
    return suite.cases(params), params


def map_samples(run: RecordedRun) -> tuple[dict[str, list[Sample]], Counter[str]]:
    """The run's samples per case of today's matrix, and the metrics of those that fit none."""
    cases, params = current_cases(run)
    names = {c.name for c in cases}
    declared = {m.name for m in get_suite(run.suite).metrics}
    backends = list(getattr(params, "backends", ()))
    baseline = getattr(params, "baseline", None)
    others = [b for b in backends if b != baseline]
    ratios = {f"ratio_to_{baseline}": "ratio_to_baseline",
              f"peak_ratio_to_{baseline}": "peak_ratio_to_baseline"}
    out: dict[str, list[Sample]] = {}
    left_out: Counter[str] = Counter()
    for s in run.samples:
        case, metric = str(s["case"]), str(s["metric"])
        if case not in names:  # a recording with one case per shape: find the backend's case
            for b in backends:
                if metric.startswith(f"{b}_") and f"{case}_{b}" in names:
                    case, metric = f"{case}_{b}", metric[len(b) + 1 :]
                    break
            else:
                if metric in ratios and len(others) == 1 and f"{case}_{others[0]}" in names:
                    case, metric = f"{case}_{others[0]}", ratios[metric]
        if case not in names or metric not in declared:
            left_out[str(s["metric"])] += 1
            continue
        out.setdefault(case, []).append(
            Sample(case, metric, float(s["value"]), rank=int(s.get("rank", 0)), idx=int(s.get("idx", 0)))
        )
    return out, left_out


def case_outcomes(run: RecordedRun, samples: Mapping[str, list[Sample]]) -> dict[str, tuple[str, str | None]]:
    """Each case's status by today's rule (`workers.verdict`) on its replayed samples; a recorded
    case that did not run to its end (error, skipped) keeps its recorded status and error."""
    suite = get_suite(run.suite)
    recorded = {str(c["name"]): c for c in run.cases}
    cases, _ = current_cases(run)
    out: dict[str, tuple[str, str | None]] = {}
    for case in cases:
        rec = recorded.get(case.name) or next(
            (c for n, c in recorded.items() if case.name.startswith(f"{n}_")), None)
        if rec is None and case.name not in samples:
            continue  # not in this recording: the job's verdict counts it as not run
        if rec is not None and rec.get("status") in ("error", "skipped", "expected_error"):
            out[case.name] = (str(rec["status"]), rec.get("error"))
            continue
        by_metric: dict[str, list[tuple[int, int, float]]] = {}
        for s in samples.get(case.name, []):
            by_metric.setdefault(s.metric, []).append((s.rank, s.idx, s.value))
        judged = [verdict.judge_samples(suite.metric(m), rows) for m, rows in by_metric.items()]
        out[case.name] = verdict.case_status(("passed", None), judged)
    return out


class RecordedRunExecutor(Executor):
    """Replays recorded runs into the job sink instead of running ranks: the service stores them
    as it stores any job. The runs are the files named (a JSON list) in `RUNS_ENV`."""

    kind = "recorded"

    def __init__(self) -> None:
        raw = os.environ.get(RUNS_ENV)
        if not raw:
            raise RuntimeError(f"{RUNS_ENV} is not set; expected a JSON list of recorded run files")
        self.runs = [r for p in json.loads(raw) for r in RecordedRun.load_all(Path(p))]
        self._replayed: set[int] = set()
        self._lock = threading.Lock()

    def max_world_size(self, device: str) -> int:
        return max((r.world_size for r in self.runs if r.device == device), default=0)

    def _match(self, spec: JobSpec) -> RecordedRun:
        with self._lock:
            for i, r in enumerate(self.runs):
                same = (r.suite, r.preset, dict(r.overrides), r.device, r.world_size) == (
                    spec.suite, spec.preset, dict(spec.params), spec.device, spec.world_size)
                if same and i not in self._replayed:
                    self._replayed.add(i)
                    return r
        raise LookupError(f"no recorded run left for job {spec.job_id} ({spec.suite} {spec.preset} "
                          f"{dict(spec.params)} on {spec.device} x{spec.world_size})")

    def run(self, spec: JobSpec, sink: JobSink, cancel: threading.Event) -> JobOutcome:
        try:
            run = self._match(spec)
        except LookupError as exc:
            return JobOutcome("failed", str(exc))
        samples, left_out = map_samples(run)
        outcomes = case_outcomes(run, samples)
        # the dispatcher recorded this checkout's commit and version: the recording's own (none
        # when it did not record them) replace them, so the page never names code that did not run
        sink.info({"commit": None, "gdnval": None, **run.info, "replayed_from": run.path.name})
        if left_out:
            sink.log(f"not replayed (no declared case and metric today): {dict(left_out)}")
        for done, (case, (status, error)) in enumerate(outcomes.items(), start=1):
            if cancel.is_set():
                return JobOutcome("cancelled", "cancelled while replaying")
            rows = samples.get(case, [])
            for i in range(0, len(rows), BATCH):
                sink.samples(rows[i : i + BATCH])
            sink.case_result(case, status, error)
            sink.progress(done, len(outcomes), case)
        status = run.status if run.status in ("succeeded", "failed", "cancelled") else "failed"
        return JobOutcome(status, run.error)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ the service


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(runs: Sequence[Path], workdir: Path, token: str, timeout: float = 60.0) -> Iterator[str]:
    """A real gdnval service (the app, its dispatcher, uvicorn on a free port, a SQLite file in
    `workdir`, the replaying executor) in a thread of this process; yields its base URL."""
    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(db_url=f"sqlite:///{workdir / 'gdnval.db'}", executor=EXECUTOR, api_token=token,
                        artifacts_dir=workdir / "artifacts", poll_interval_s=0.2)
    before = os.environ.get(RUNS_ENV)
    os.environ[RUNS_ENV] = json.dumps([str(p.resolve()) for p in runs])  # read by the executor factory
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=_free_port(),
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="gdnval-figures-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the service stopped while starting (its log is above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the service did not start within {timeout:.0f} s")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(30)
        if before is None:
            os.environ.pop(RUNS_ENV, None)
        else:
            os.environ[RUNS_ENV] = before


def submit_and_wait(base: str, token: str, run: RecordedRun, timeout: float = 120.0) -> dict[str, Any]:
    """Queue the run's job through the API and wait until it is final; returns the job."""
    import httpx

    body = {"suite": run.suite, "preset": run.preset, "params": dict(run.overrides),
            "device": run.device, "world_size": run.world_size, "commit": run.commit,
            "labels": {"replayed_from": run.path.name}}
    r = httpx.post(f"{base}/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    if r.status_code not in (200, 201):
        raise RuntimeError(f"submitting {run.path.name} failed: {r.status_code} {r.text[:1000]}")
    job_id = r.json()["id"]
    deadline = time.monotonic() + timeout
    while True:
        job = httpx.get(f"{base}/api/v1/jobs/{job_id}", timeout=30).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} ({run.path.name}) is still {job['status']} "
                               f"after {timeout:.0f} s")
        time.sleep(0.2)


# ------------------------------------------------------------------------------ the figures


def sweep_series(cases: Sequence[Mapping[str, Any]], metric: str = TIME_METRIC) -> list[Any]:
    """One line per backend (per backend, mode and head layout when the jobs hold several): the
    median of `metric` at each sequence length, min..p90 as its spread."""
    from service.web.charts import SweepSeries

    rows = [c for c in cases if metric in c["metrics"] and c["metrics"][metric]["median"] is not None
            and "backend" in c["params"] and "seq_len" in c["params"]
            and not c["params"].get("packed")]
    modes = {c["params"].get("mode") for c in rows}
    heads = {(c["params"].get("qk_heads"), c["params"].get("v_heads")) for c in rows}
    lines: dict[str, list[tuple[float, float, float, float]]] = {}
    for c in rows:
        p, m = c["params"], c["metrics"][metric]
        name = p["backend"]  # then only what differs between the lines
        if len(modes) > 1:
            name += f" {p.get('mode')}"
        if len(heads) > 1:
            name += f" {p.get('qk_heads')}/{p.get('v_heads')}"
        lines.setdefault(name, []).append((float(p["seq_len"]), m["median"], m["min"], m["p90"]))
    out = []
    for name, pts in lines.items():
        pts.sort()
        out.append(SweepSeries(name, [a for a, *_ in pts], [b for _, b, _, _ in pts],
                               lo=[lo for *_, lo, _ in pts], hi=[hi for *_, hi in pts]))
    return out


def standalone_svg(chart: str) -> str:
    """A page chart as a file of its own: the stylesheet's `svg` rules go inside it, so it looks
    as on the page wherever it is shown (one stylesheet, no copy of its rules here)."""
    css = (ROOT / "service" / "web" / "static" / "gdnval.css").read_text()
    rules = [line.strip() for line in css.splitlines() if line.startswith("svg")]
    rules.append("svg.chart { background: #fff; }")
    return re.sub(r"(<svg[^>]*>)", lambda m: m.group(1) + "<style>" + " ".join(rules) + "</style>",
                  chart, count=1)


def plot_title(jobs: Sequence[Mapping[str, Any]]) -> str:
    devices = sorted({str((j.get("info") or {}).get("device_name") or j["device"]) for j in jobs})
    return f"gdn-op forward+backward, median per case ({', '.join(devices)})"


def screenshot(url: str, path: Path) -> None:
    """The page at `url` in Debian's chromium (Playwright), the first screen at desktop width."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        raise RuntimeError("Debian's chromium is not installed (bash scripts/bootstrap.sh test installs it)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(url, wait_until="load")
            page.screenshot(path=str(path), full_page=False)
        finally:
            browser.close()


def make_figures(results: Sequence[Path], out: Path) -> tuple[Path, Path]:
    """Store `results` through a real service, then write the plot and the screenshot into `out`."""
    import httpx

    from service.web.charts import sweep_chart

    runs = [r for p in results for r in RecordedRun.load_all(p)]
    for r in runs:
        _, left_out = map_samples(r)
        if left_out:
            print(f"{r.path.name}: {sum(left_out.values())} sample(s) not replayed, no declared case and "
                  f"metric today: {dict(left_out)}")
    out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="gdnval-figures-") as tmp, \
            serving(results, Path(tmp), token) as base:
        jobs = [submit_and_wait(base, token, r) for r in runs]
        cases = [c for j in jobs
                 for c in httpx.get(f"{base}/api/v1/jobs/{j['id']}/cases", timeout=60).json()["items"]]
        series = sweep_series(cases)
        if not series:
            raise ValueError(f"no case of {[p.name for p in results]} has a {TIME_METRIC!r} median to plot")
        plot = out / PLOT_NAME
        plot.write_text(standalone_svg(str(sweep_chart(series, title=plot_title(jobs), unit="ms"))))
        shot = out / SHOT_NAME
        screenshot(f"{base}/jobs/{jobs[0]['id']}", shot)
    for j in jobs:
        print(f"job {j['id']}: {j['suite']} {j['preset']} on {j['device']}, {j['status']}, "
              f"verdict {j.get('verdict')}")
    return plot, shot


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path, help="recorded gdn-op runs (gdnval run --json)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the figures go")
    args = ap.parse_args(argv)
    plot, shot = make_figures(args.results, args.out)
    shown = [p.relative_to(Path.cwd()) if p.is_relative_to(Path.cwd()) else p for p in (plot, shot)]
    print(f"wrote {shown[0]} and {shown[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
