"""`gdnval run SUITE`: run a suite here, without the service, through the local executor.

This is how suites run on the device machine and how benchmarks are taken. The run itself needs
only torch, triton, numpy, click, rich and pydantic: fastapi, httpx, uvicorn and ray are never
imported, and sqlalchemy only to keep the run in the results store.

The run is kept as a job of the results store (`--db`, else GDNVAL_DB_URL, else the service's
default SQLite file `gdnval.db`; created and migrated when missing) by
`service.persistence.runs.store_run`, in the service's own shape: `gdnval compare`, the pages
of a service on that store and `gdnval push` (to another service) read it like any job. The
store is opened before the run starts, so a store that cannot be opened is one line and exit 2
at once; `--no-store` keeps nothing. On a machine without the store's packages (an accelerator
machine with torch and Triton only) the default store is left out with a line saying so; a
`--db` asked for there is one line and exit 2.

`--json FILE` writes (format "gdnval-run/1", `service.persistence.runs.RunDocument`):
    {format, run_id, suite, preset, overrides, params, device, world_size, commit, snapshot,
     backend_source, status, verdict, case_counts, error, exit_code, started_at, finished_at,
     duration_s, info, nonfinite,
     cases:   [{name, status, error, expected_error, params, fingerprint}],
     summary: [{case, metric, unit, kind, direction, bound, judged_on, count, nonfinite, median,
                p90, min, max, passed}],
     samples: [{case, metric, rank, idx, value}],
     logs:    [str]}
Statistics are `workers.stats`'s, bounds `workers.verdict`'s (worst rank per idx, then
median/p90/min/max of the finite values with the non-finite ones counted). The table printed is
one row per case (per backend a case measures side by side) with its key numbers as columns, the
report's pivot (`service.presentation.report_tables.case_pivot`); `--failures` keeps only the cases that
need attention, `--all-metrics` prints one row per case and metric. The JSON is strict: a
non-finite value is written as null and its JSON pointer listed under `nonfinite`. `--json -`
writes it to stdout (the table then goes to stderr).
Exit code: `service.domain.exit_codes.for_verdict` of the job's verdict (README's exit-code table):
0 passed, 1 a case failed or errored, 2 the job could not run (failed, cancelled, cases left
unrun) or the input was invalid.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import signal
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.cli import output
from service.cli.local_store import db_option, open_store, shown, store_installed
from service.domain import exit_codes
from workers import verdict
from workers.executors.base import JobOutcome, JobSpec
from workers.stats import CaseStats, MetricStats, reduce_ranks, summarise_samples
from workers.suite import Sample, Suite, UnknownSuiteInput


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the run like Ctrl-C: cancel the job, then print and write what it produced.

    `timeout` and batch systems stop a long GPU run with SIGTERM; without this the results of the
    cases that did finish (and the --json file) were lost with the process."""

    def interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the write short
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread (e.g. a test runner)
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class CollectingSink:
    """Keeps everything the executor reports and drives the progress bar."""

    def __init__(self, progress: Progress | None = None, console: Console | None = None) -> None:
        self.samples_: list[Sample] = []
        self.cases: dict[str, tuple[str, str | None]] = {}
        self.info_: dict[str, Any] = {}
        self.logs: list[str] = []
        self.artifacts: list[tuple[str, str, int]] = []
        self._progress = progress
        self._console = console
        self._task: Any = None
        self._lock = threading.Lock()

    def samples(self, batch: Sequence[Sample]) -> None:
        with self._lock:
            self.samples_.extend(batch)

    def case_result(self, case: str, status: str, error: str | None = None) -> None:
        with self._lock:
            self.cases[case] = (status, error)

    def progress(self, done: int, total: int, message: str = "") -> None:
        if self._progress is None:
            return
        if self._task is None:
            self._task = self._progress.add_task(message or "running", total=total)
        self._progress.update(self._task, completed=done, total=total, description=message[:60])

    def info(self, info: Mapping[str, Any]) -> None:
        self.info_ = dict(info)

    def log(self, line: str) -> None:
        self.logs.append(line)
        if self._console is not None:
            self._console.print(f"[dim]{line}[/dim]", highlight=False)

    def waiting(self, reason: str | None) -> None:
        """Nothing to show: the executor logs what the run waits for, and a run has no queue."""

    def artifact(self, name: str, media_type: str, data: bytes) -> None:
        self.artifacts.append((name, media_type, len(data)))


def metric_stats(suite: Suite, samples: Sequence[Sample]) -> dict[tuple[str, str], MetricStats]:
    """(case, metric) -> the metric's statistics (`workers.stats`: worst rank per idx; non-finite
    values counted, never dropped) with its bound judgement (`workers.verdict`)."""
    by_key: dict[tuple[str, str], list[tuple[int, int, float]]] = defaultdict(list)
    for s in samples:
        by_key[(s.case, s.metric)].append((s.rank, s.idx, s.value))
    out = {}
    for (case, name), metric_rows in by_key.items():
        try:
            metric = suite.metric(name)
        except KeyError:
            continue
        st = summarise_samples(metric_rows, metric.direction, metric=name, unit=metric.unit, kind=metric.kind,
                               bound=metric.bound, diagnostic=metric.diagnostic)
        out[(case, name)] = replace(st, passes=verdict.judge_metric(metric, st).ok)
    return out


def summarise(suite: Suite, samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """The `summary` rows of the JSON output: `metric_stats` per (case, metric)."""
    return [
        {
            "case": case, "metric": m.metric, "unit": m.unit, "kind": m.kind, "direction": m.direction,
            "bound": m.bound, "judged_on": verdict.JUDGED_ON.get(m.kind, "worst"), "count": m.count,
            "nonfinite": m.nonfinite, "median": m.median, "p90": m.p90, "min": m.min, "max": m.max,
            "passed": m.passes is not False,
        }
        for (case, _), m in metric_stats(suite, samples).items()
    ]


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.4g}"


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """`--param KEY=VALUE` items: VALUE as JSON, else a bare string (run, submit and gate)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--param")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw  # a bare string
    return out


def case_stats(
    cases: Sequence[Any], sink: CollectingSink, stats: Mapping[tuple[str, str], MetricStats], device: str,
    world_size: int,
) -> list[CaseStats]:
    """The run's cases with their statistics, in the shape the report's pivots take."""
    by_case: dict[str, dict[str, MetricStats]] = defaultdict(dict)
    for (case, name), m in stats.items():
        by_case[case][name] = m
    out = []
    for c in cases:
        status, error = sink.cases.get(c.name, ("not run", None))
        out.append(CaseStats(None, c.name, c.fingerprint(device, world_size), dict(c.params), status, error,
                              c.expected_error, by_case.get(c.name, {})))
    return out


TERMINAL_COLUMNS = 100  # the widest table printed on a terminal unless --wide
STATUS_COLORS = {"passed": "green", "expected_error": "green", "failed": "red", "error": "red"}


def repetitions(
    samples: Sequence[Sample], suite: Suite, cases: Sequence[Any], device: str, world_size: int
) -> Callable[[str, str], list[float] | None]:
    """(fingerprint, metric) -> the metric's values after the worst-rank reduction, one per
    repetition: what the table's gains and speed-ups take their intervals from."""
    fingerprint = {c.name: c.fingerprint(device, world_size) for c in cases}
    rows: dict[tuple[str, str], list[tuple[int, int, float]]] = defaultdict(list)
    for s in samples:
        rows[(fingerprint.get(s.case, s.case), s.metric)].append((s.rank, s.idx, s.value))
    directions = {m.name: m.direction for m in suite.metrics}
    reduced = {key: reduce_ranks(r, directions.get(key[1], "lower")) for key, r in rows.items()}
    return lambda fp, metric: reduced.get((fp, metric))


# The columns `gdnval run` drops first when its table is wider than the terminal (`--wide` keeps all).
DROP_FIRST = ("peak_reserved_bytes", "peak_reserved", "peak_allocated", "peak_allocated_bytes", "bwd_est_ms",
              "fwd_ms", "peak_bytes", "bounds", "out_of_bound")


def _fit_columns(columns: list[tuple[str, str]], cells: list[dict[str, str]], fixed: int,
                 width: int | None) -> list[tuple[str, str]]:
    """The columns that fit `width` characters beside `fixed` ones, dropping `DROP_FIRST` in its
    order (all of them when `width` is None)."""
    if width is None:
        return columns

    def used(cols: list[tuple[str, str]]) -> int:
        return fixed + sum(3 + max([len(label)] + [len(c.get(key, "")) for c in cells])
                           for key, label in cols)

    kept = list(columns)
    for key in DROP_FIRST:
        if used(kept) <= width:
            break
        kept = [c for c in kept if c[0] != key]
    return kept


def _render_cases(
    console: Console, suite: Suite, stats: list[CaseStats], *, failures: bool, tracked: bool = True,
    values_of: Callable[[str, str], Sequence[float] | None] | None = None, device: str | None = None,
    width: int | None = None,
) -> int:
    """One row per case (per backend or mode a case measures side by side) with the key numbers
    as columns (`service.presentation.report_tables.case_pivot`), gains and speed-ups with their
    intervals; with `failures`, only the cases that did not pass (a case skipped as not applicable
    did not fail) or hold a number out of bound. With `width`, the least needed columns are left out
    until the table fits (and a line says which). Returns the number of rows printed."""
    from service.presentation.report_tables import case_pivot
    from service.presentation.views import VERSUS_NOTE

    pivot = case_pivot(stats, tracked=tracked, values_of=values_of, device=device)
    rows_of: dict[str, list[Any]] = defaultdict(list)
    for row in pivot.rows:
        rows_of[row.fingerprint].append(row)
    variants = any(r.variant for r in pivot.rows)
    title = f"{suite.name}: " + ("cases that need attention" if failures else "one row per case")
    table = Table(title=title, show_lines=False)
    table.add_column("case", no_wrap=True)
    if variants:
        table.add_column("variant")
    table.add_column("status")
    texts = [{k: f"{c.text} {c.mark}".strip() for k, c in r.cells.items()} for r in pivot.rows]
    lead = max([len(c.name) for c in stats] + [4]) + 3 + (max([len(r.variant) for r in pivot.rows] + [7]) + 3
                                                         if variants else 0) + 12
    columns = _fit_columns(pivot.columns, texts, lead, width)
    left_out = [label for key, label in pivot.columns if (key, label) not in columns]
    for _, label in columns:
        table.add_column(label, justify="left" if label == "out of bound" else "right")
    shown = 0
    for c in stats:
        rows = rows_of.get(c.fingerprint) or [None]
        bad = c.status not in ("passed", "expected_error", "skipped") or any(
            "out_of_bound" in r.cells for r in rows if r is not None
        )  # a slower gain is a number to read, not a failure; a skipped case does not apply
        if failures and not bad:
            continue
        for i, row in enumerate(rows):
            status = f"[{STATUS_COLORS.get(c.status or '', 'yellow')}]{c.status}[/]" if i == 0 else ""
            cells = []
            for key, _ in columns:
                cell = row.cells.get(key) if row is not None else None
                text = "" if cell is None else f"{cell.text} {cell.mark}".strip()
                cells.append(f"[red]{text}[/]" if cell is not None and cell.state == "bad" else text)
            lead = [c.name if i == 0 else ""] + ([row.variant if row is not None else ""] if variants else [])
            table.add_row(*lead, status, *cells)
            shown += 1
    if shown:
        console.print(table)
        if any(k in ("gain", "speedup") for k, _ in columns):
            console.print(VERSUS_NOTE, highlight=False)
        if left_out:
            console.print(f"left out to fit {width} columns: {', '.join(left_out)} "
                          "(--wide shows every column)", highlight=False)
    elif failures:
        skipped = sum(c.status == "skipped" for c in stats)
        note = f" ({skipped} not applicable, skipped)" if skipped else ""
        console.print(f"{suite.name}: every case passed and every bounded number holds{note}",
                      highlight=False)
    return shown


def _render_metrics(console: Console, suite: Suite, cases: list[Any], sink: CollectingSink,
                    summary: Sequence[dict[str, Any]]) -> None:
    """The full table: one row per (case, metric) with median / p90 / min / n and the bound."""
    by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in summary:
        by_case[row["case"]].append(row)
    table = Table(title=f"{suite.name}", show_lines=False)
    for col in ("case", "status", "metric", "median", "p90", "min", "n", "bound", "ok"):
        numeric = col in ("median", "p90", "min", "n", "bound")
        table.add_column(col, justify="right" if numeric else "left", no_wrap=col in ("case", "metric"))
    for case in cases:
        status, _ = sink.cases.get(case.name, ("not run", None))
        styled = f"[{STATUS_COLORS.get(status, 'yellow')}]{status}[/]"
        rows = by_case.get(case.name) or [None]
        for i, row in enumerate(rows):
            if row is None:
                table.add_row(case.name, styled, "", "", "", "", "", "", "")
                continue
            op = "<=" if row["direction"] == "lower" else ">="
            bound = f"{op} {_fmt(row['bound'])}" if row["bound"] is not None else "-"
            ok = "[green]yes[/]" if row["passed"] else "[red]no[/]"
            table.add_row(
                case.name if i == 0 else "", styled if i == 0 else "",
                f"{row['metric']} ({row['unit']})", _fmt(row["median"]), _fmt(row["p90"]), _fmt(row["min"]),
                str(row["count"]), bound, ok,
            )
    console.print(table)


def _render(console: Console, suite: Suite, cases: list[Any], sink: CollectingSink, device: str,
            world_size: int, *, view: str, width: int | None = None) -> None:
    """The run's results: `view` cases (one row per case), failures (only what needs attention)
    or metrics (one row per case and metric); then the errors of the cases that failed."""
    if view == "metrics":
        _render_metrics(console, suite, cases, sink, summarise(suite, sink.samples_))
    else:
        from service.presentation.conventions import memory_tracked

        stats = metric_stats(suite, sink.samples_)
        _render_cases(console, suite, case_stats(cases, sink, stats, device, world_size),
                      failures=view == "failures", tracked=memory_tracked(device),
                      values_of=repetitions(sink.samples_, suite, cases, device, world_size), device=device,
                      width=width)
    for case in cases:
        status, error = sink.cases.get(case.name, ("not run", None))
        if status in ("failed", "error") and error:
            console.print(f"[red]{case.name}[/] ({status}):", highlight=False)
            console.print("\n".join(error.splitlines()[-12:]), highlight=False, markup=False)


def _resolve_backends(names: Sequence[str], backend_source: str | None) -> None:
    """Every backend the job runs resolves here (after installing `backend_source`, as the
    executor will); else one line naming it and exit 2, before any rank starts."""
    if not names:
        return
    from service.cli.backends import origin, use_backend_source
    from service.cli.client import fail

    if backend_source:
        use_backend_source(backend_source)
    for name in names:
        _, error = origin(name)
        if error is not None:
            fail(error)


def _store(out: Console, engine: Any, doc: dict[str, Any]) -> None:
    """Keep the run's document as a job of the store and say where (`service.persistence.runs`)."""
    from service.persistence.runs import RunDocument, store_run

    job, _ = store_run(engine, RunDocument.model_validate(doc))
    where = shown(str(engine.url))
    engine.dispose()
    out.print(f"stored as job {job.id} in {where} (gdnval compare {job.id} OTHER; gdnval push {job.id})",
              highlight=False, soft_wrap=True)


@click.command("run")
@click.argument("suite_name", metavar="SUITE")
@click.option("--preset", default="quick", show_default=True, help="quick | gate | full")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda", "npu"]))
@click.option("--world-size", default=1, show_default=True, type=click.IntRange(min=1), help="ranks")
@click.option("--param", "param_items", multiple=True, metavar="KEY=VALUE",
              help="override a suite parameter; VALUE is JSON (e.g. [8192,16384]) or a bare string")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="write all samples and case results to this file ('-': stdout)")
@click.option("--deadline", type=float, default=None, help="fail the job after this many seconds")
@click.option("--deterministic", is_flag=True, help="deterministic algorithms and collectives")
@click.option("--repo", type=click.Path(file_okay=False, exists=True), default=None,
              help="git repository: run --commit's snapshot instead of the installed code")
@click.option("--commit", default=None, help="commit to run (needs --repo)")
@click.option("--failures", "view", flag_value="failures",
              help="print only the cases that did not pass or hold a number out of bound")
@click.option("--all-metrics", "view", flag_value="metrics",
              help="print one row per case and metric (median, p90, min, n, bound) instead of per case")
@click.option("--backend-source", default=None, metavar="SRC",
              help="install a backend under test from elsewhere for this run (git+<repo>@<commit> or a pip "
                   "requirement; the job label backend_source of submit and gate)")
@click.option("--store/--no-store", default=True, show_default=True,
              help="keep the run as a job of the results store (--db): compare, history and push find it")
@db_option
@click.option("--dry-run", is_flag=True,
              help="check the suite, preset, --param overrides, device and world size, resolve the backends "
                   "(installing --backend-source), print the cases and exit 0 without starting any rank")
@click.option("--wide", is_flag=True,
              help=f"on a terminal, print every column (by default the table fits {TERMINAL_COLUMNS} "
                   "columns)")
def run(
    suite_name: str,
    preset: str,
    device: str,
    world_size: int,
    param_items: tuple[str, ...],
    json_path: Path | None,
    deadline: float | None,
    deterministic: bool,
    repo: str | None,
    commit: str | None,
    view: str | None,
    backend_source: str | None,
    store: bool,
    db_url: str | None,
    dry_run: bool,
    wide: bool,
) -> None:
    """Run SUITE on this machine through the local executor and print its results."""
    from workers.executors.local import LocalExecutor
    from workers.registry import get_suite
    from workers.runtime import check_suite_fits

    overrides = parse_params(param_items)
    try:
        suite = get_suite(suite_name)
        check_suite_fits(suite, device, world_size)
        params = suite.resolve_params(preset, overrides, device=device)
    except UnknownSuiteInput as exc:
        raise click.UsageError(str(exc)) from exc
    if commit and not repo:
        raise click.UsageError("--commit needs --repo (the git repository to take the commit from)")
    try:
        cases = suite.cases(params)
    except ValueError as exc:  # a case matrix the suite refuses (bad mode, candidate, ...)
        raise click.UsageError(str(exc)) from exc
    nowhere = suite.nothing_runs(cases, world_size)
    if nowhere is not None:
        raise click.UsageError(f"suite {suite_name!r} preset {preset!r}: {nowhere}")
    if backend_source:
        from workers.backend_source import BackendSource, BackendSourceError

        try:
            BackendSource.parse(backend_source)
        except BackendSourceError as exc:
            raise click.UsageError(str(exc)) from exc
    if not commit:  # the installed code runs: its backends must resolve here (a snapshot's resolve there)
        _resolve_backends(suite.backends(params), backend_source)
    if dry_run:
        click.echo(f"{suite_name} --preset {preset} --device {device} --world-size {world_size}: "
                   f"{len(cases)} case(s)")
        for case in cases:
            why = suite.misfit(case, world_size)
            click.echo(f"  {case.name}" + (f" (skipped: {why})" if why else ""))
        raise SystemExit(0)
    asked = click.get_current_context().get_parameter_source("db_url") == ParameterSource.COMMANDLINE
    if store and not asked and not store_installed():
        click.echo("not storing this run: the results store needs sqlalchemy and alembic, which this "
                   "machine lacks (--json keeps the run; `gdnval push` sends that file to a service)",
                   err=True)
        store = False
    engine = open_store(db_url, create=True) if store else None  # before the run: a bad store fails fast
    console = Console(stderr=True)
    spec = JobSpec(
        job_id=0, suite=suite_name, preset=preset, params=overrides, device=device,
        world_size=world_size, commit=commit, deadline_s=deadline, deterministic=deterministic,
        backend_source=backend_source,
    )
    executor = LocalExecutor(repo=repo)
    cancel = threading.Event()
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    outcome: list[JobOutcome] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress, _terminate_as_interrupt():
        sink = CollectingSink(progress, console)
        worker = threading.Thread(
            target=lambda: outcome.append(executor.run(spec, sink, cancel)), daemon=True
        )
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.2)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (`timeout`, a batch system): keep what ran
            cancel.set()
            worker.join(30)
    result = outcome[0] if outcome else JobOutcome("cancelled", "interrupted")
    to_stdout = json_path is not None and str(json_path) == "-"
    out = output.console(sys.stderr if to_stdout else None)  # piped: never truncate names
    width = None if wide or not out.is_terminal else min(out.width, TERMINAL_COLUMNS)
    _render(out, suite, cases, sink, device, world_size, view=view or "cases", width=width)
    ran = result.status == "succeeded"
    judged = verdict.job_verdict(
        [sink.cases[c.name][0] for c in cases if c.name in sink.cases], ran=ran, expected=len(cases)
    )
    exit_code = exit_codes.for_verdict(judged.verdict, judged.counts, ran=ran)
    if not ran:
        out.print(f"[red]job {result.status}[/]: {result.error or ''}", highlight=False)
    out.print(f"verdict {judged.summary()}; {len(sink.samples_)} samples; exit {exit_code}")
    doc = {
        "format": "gdnval-run/1",
        "run_id": uuid.uuid4().hex,
        "suite": suite_name,
        "preset": preset,
        "overrides": overrides,
        "params": params.model_dump(mode="json"),
        "device": device,
        "world_size": world_size,
        "commit": sink.info_.get("commit"),
        "snapshot": commit is not None,
        "backend_source": backend_source,
        "status": result.status,
        "verdict": judged.verdict,
        "case_counts": judged.counts,
        "error": result.error,
        "exit_code": exit_code,
        "started_at": started.isoformat(),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "duration_s": round(time.monotonic() - t0, 3),
        "info": sink.info_,
        "cases": [
            {
                "name": c.name,
                "status": sink.cases.get(c.name, ("not run", None))[0],
                "error": sink.cases.get(c.name, ("not run", None))[1],
                "expected_error": c.expected_error,
                "params": dict(c.params),
                "fingerprint": c.fingerprint(device, world_size),
            }
            for c in cases
        ],
        "summary": summarise(suite, sink.samples_),
        "samples": [
            {"case": s.case, "metric": s.metric, "rank": s.rank, "idx": s.idx, "value": s.value}
            for s in sink.samples_
        ],
        "logs": sink.logs,
    }
    clean, replaced = output.strict_json(doc)
    clean["nonfinite"] = replaced  # JSON pointers of the values written as null (NaN, ±inf)
    if engine is not None:
        _store(out, engine, clean)
    if json_path is not None:
        text = json.dumps(clean, indent=1, default=str, allow_nan=False)
        if to_stdout:
            sys.stdout.write(text + "\n")
        else:
            json_path.write_text(text)
    raise SystemExit(exit_code)
