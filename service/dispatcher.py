"""The dispatcher: claims queued jobs, hands them to the executor, stores what comes back.

`StoreSink` writes every report as it arrives, each call one transaction (a sample batch is
stored whole or not at all), so pages see progress live and a crash loses nothing already
reported. When a case ends (every rank reported it, so all its samples are in) its summary is
stored at once: a running job's page then computes live only the case in progress, and the
job's end only fills in cases left without one. The dispatcher thread heartbeats its running
jobs (a dead dispatcher's jobs are found by the next one), forwards cancel requests to the
executor's cancel event, and settles orphans left by a crash at start and periodically. It
claims only jobs its executor can place now (`Executor.free_ranks` per device kind and
placement strategy, less what this tick already claimed), so a job that fits the cluster but
not its free resources stays queued instead of failing on a timeout. A re-run of an interrupted
job keeps the cases its earlier runs finished and runs only the rest, and a job labelled to take
cases from another job copies them instead of running them (`service.persistence.resume`); when
none is left, the job just ends. A store that goes away is
waited out (`until_stored`): no write is lost and no job thread ends on it. A run its executor
ends `interrupted` (its cluster went away) is re-queued without spending an attempt.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from service.persistence import artifacts, queue
from service.persistence import cases as case_store
from service.persistence import jobs as job_store
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store
from service.persistence.db import StoreUnavailable, first_line, is_unreachable, until_stored, write_tx
from service.persistence.models import CASE_STATUSES, JobRow, MetricRow
from service.persistence.resume import carry_finished_cases, kept_before, take_cases
from service.settings import Settings
from workers.deadline import job_deadline_s, stall_limit_s
from workers.executors.base import Executor, ExecutorUnavailable, JobOutcome, JobSpec
from workers.provenance import installed_version, source_commit
from workers.registry import get_suite
from workers.suite import Case, Metric, Sample, select_cases

log = logging.getLogger("gdnval.dispatcher")
MAX_LOG_LINE = 10_000
UNPLACEABLE_GRACE_S = 60.0  # a queued job no alive nodes can hold is failed after this long
T = TypeVar("T")


def _installed_backend_commit(info: Mapping[str, Any]) -> str | None:
    """The commit a job's backend from another repository was installed at, from the ranks'
    provenance (`workers.provenance`): the first backend not of our own distribution with one."""
    for b in info.get("backends") or ():
        if isinstance(b, Mapping) and b.get("distribution") not in (None, "gdnval") and b.get("commit"):
            return str(b["commit"])[:255]
    return None


class StoreSink:
    """The `workers.executors.base.JobSink` of one job run: thread-safe, writes through at once.

    Every write waits out a store that went away (`until_stored`) instead of failing the job, so
    an outage only pauses what the job reports; `stop` (the dispatcher shutting down) ends the
    wait. A sample batch whose commit answer was lost is counted before it is written again, so
    none is stored twice."""

    def __init__(self, engine: Engine, job: JobRow, artifacts_dir: Path,
                 stop: threading.Event | None = None) -> None:
        self.engine = engine
        self.job_id = job.id
        self.owner = str(job.claimed_by)
        self.attempt = max(1, job.attempts)
        self.suite = job.suite
        self.device, self.world_size = job.device, job.world_size
        self.artifacts_dir = artifacts_dir
        self.stop = stop
        self._lock = threading.Lock()
        self.samples_written = 0
        self.case_ids: dict[str, int] = {}
        self.metric_ids: dict[str, int] = {}
        self.summarized: set[int] = set()  # case ids whose summary is stored for this attempt
        self.expected: list[str] = []  # the names of the cases this job runs
        self.kept: dict[str, int] = {}  # cases earlier runs finished -> the attempt that ran each
        self.samples_stored = 0  # rows of this attempt in the store (kept cases' included)
        self._stored("starting", lambda: self._start(job))

    def _stored(self, what: str, do: Callable[[], T]) -> T:
        return until_stored(do, f"{what} (job {self.job_id})", self.stop)

    def _start(self, job: JobRow) -> None:
        with write_tx(self.engine) as s:
            # cases an earlier run finished are this run's too (not run again), the rest dropped;
            # a retried start finds them moved already: this attempt's results are the kept ones
            kept = carry_finished_cases(s, job.id, self.attempt)
            if not kept and case_store.result_case_names(s, job.id, self.attempt):
                kept = kept_before(s, job.id)
            summary_store.drop_earlier_summaries(s, job.id, self.attempt)
            case_store.drop_earlier_case_results(s, job.id, self.attempt)
            try:
                suite = get_suite(job.suite)
                cases = suite.cases(suite.resolve_params(job.preset, job.params, device=job.device))
                expected = [c.name for c in select_cases(cases, job.cases)]
            except Exception as exc:  # the executor reports the real failure; keep the sink usable
                suite, cases, expected = None, [], []
                job_store.add_event(s, job.id, "log", f"could not expand the suite's cases: {exc}")
            # a store error must leave the transaction (and `until_stored` retries it): never
            # caught above, where the session would go on after a failed flush
            metric_ids = sample_store.ensure_metrics(s, suite.name, suite.metrics) if suite else {}
            case_ids = case_store.ensure_cases(s, cases, job.device, job.world_size)
            # cases another job measured with the same code (its labels name it) are this run's too
            taken = take_cases(s, job, self.attempt, [c for c in cases if c.name in expected])
            kept = {**kept, **dict.fromkeys(taken, self.attempt)}
            stored = sample_store.count_attempt_samples(s, job.id, self.attempt)
        self.kept, self.metric_ids, self.expected = kept, metric_ids, expected
        self.case_ids, self.samples_stored = case_ids, stored

    @property
    def all_kept(self) -> bool:
        """Every case of the job finished in earlier runs: nothing is left to run."""
        return bool(self.expected) and set(self.expected) <= set(self.kept)

    def _ensure_ids(self, cases: set[str], metrics: set[str]) -> None:
        """Ids for case and metric names the suite did not declare up front (stored anyway, and
        said so in the log); known only once their transaction committed."""
        new_cases, new_metrics = sorted(cases - set(self.case_ids)), sorted(metrics - set(self.metric_ids))
        if not new_cases and not new_metrics:
            return

        def add() -> tuple[dict[str, int], dict[str, int]]:
            with write_tx(self.engine) as s:
                undeclared = [Case(self.suite, n, {"undeclared": n}) for n in new_cases]
                case_ids = case_store.ensure_cases(s, undeclared, self.device, self.world_size)
                metric_ids = {}
                for name in new_metrics:
                    row = sample_store.metric_by_name(s, self.suite, name)
                    if row is None:
                        row = MetricRow(suite=self.suite, name=name, diagnostic=True)  # no scale: recorded
                        s.add(row)
                        s.flush()
                    metric_ids[name] = row.id
                for name in new_cases:
                    job_store.add_event(s, self.job_id, "log",
                                        f"case {name!r} is not in the suite's matrix; stored anyway")
                for name in new_metrics:
                    job_store.add_event(s, self.job_id, "log",
                                        f"metric {name!r} is not declared by the suite; stored anyway")
            return case_ids, metric_ids

        case_ids, metric_ids = self._stored("storing new case and metric names", add)
        self.case_ids.update(case_ids)
        self.metric_ids.update(metric_ids)

    def samples(self, batch: Sequence[Sample]) -> None:
        if not batch:
            return
        with self._lock:
            self._ensure_ids({b.case for b in batch}, {b.metric for b in batch})
            cids, mids, job, att = self.case_ids, self.metric_ids, self.job_id, self.attempt
            reopened = {cids[b.case] for b in batch} & self.summarized
            if reopened:  # samples after the case's end: its stored summary is stale, show it live
                def drop() -> None:
                    with write_tx(self.engine) as s:
                        summary_store.drop_case_summaries(s, job, att, reopened)

                self._stored("dropping a stale case summary", drop)
                self.summarized -= reopened
            rows = [
                (job, att, cids[b.case], mids[b.metric], int(b.rank), int(b.idx), float(b.value))
                for b in batch
            ]
            self._insert_once(rows)
            self.samples_written += len(rows)

    def _insert_once(self, rows: list[tuple[int, int, int, int, int, int, float]]) -> None:
        """Store one batch exactly once: after a try whose answer was lost, the attempt's rows
        are counted first (only this sink writes them), and a batch already in is not sent again."""
        tried = False

        def insert() -> None:
            nonlocal tried
            if tried:
                with Session(self.engine) as s:
                    if sample_store.count_attempt_samples(s, self.job_id, self.attempt) == \
                            self.samples_stored + len(rows):
                        return  # the lost answer was that of a commit
            tried = True
            sample_store.insert_sample_rows(self.engine, rows)

        self._stored("storing samples", insert)
        self.samples_stored += len(rows)

    def case_result(self, case: str, status: str, error: str | None = None) -> None:
        with self._lock:
            if status not in CASE_STATUSES:
                error = f"executor reported unknown status {status!r}; {error or ''}".strip()
                status = "error"
            self._ensure_ids({case}, set())
            case_id = self.case_ids[case]

            def store() -> None:
                with write_tx(self.engine) as s:
                    case_store.set_case_result(s, self.job_id, case_id, status, error, attempt=self.attempt)

            self._stored("storing a case result", store)
            self._store_case_summary(case_id)

    def _store_case_summary(self, case_id: int) -> None:
        """The ended case's summary, computed in a read session (outside the write lock) and
        stored in its own short transaction; on failure the case stays live and the job's end
        stores it."""

        job, att = self.job_id, self.attempt

        def store() -> None:
            with Session(self.engine) as s:
                summary = summary_store.compute_summary(s, job, case_ids=[case_id], attempt=att)
            with write_tx(self.engine) as s:
                summary_store.store_summary(s, job, summary, case_ids=[case_id], attempt=att)

        try:
            self._stored("storing a case summary", store)
            self.summarized.add(case_id)
        except StoreUnavailable:
            raise
        except Exception:
            log.exception("storing the summary of case %s of job %s failed", case_id, self.job_id)

    def progress(self, done: int, total: int, message: str = "") -> None:
        """`done` of `total` cases of this run; the cases kept from earlier runs count as done."""
        done, total = done + len(self.kept), total + len(self.kept)

        def store() -> None:
            with write_tx(self.engine) as s:
                job = s.get(JobRow, self.job_id)
                if job is None:
                    return
                job.progress_done, job.progress_total, job.progress_message = done, total, message[:1000]
                job_store.add_event(s, self.job_id, "progress", message[:1000],
                                    {"done": done, "total": total})

        with self._lock:
            self._stored("storing progress", store)

    def info(self, info: Mapping[str, Any]) -> None:
        info = dict(info)
        defs = info.pop("metrics", None)  # the job's own code's metric definitions

        def store() -> dict[str, int]:
            with write_tx(self.engine) as s:
                job = s.get(JobRow, self.job_id)
                if job is None:
                    return {}
                ids = {}
                if defs:  # what this job's summaries are judged and stored with
                    ids = sample_store.ensure_metrics(s, self.suite, [Metric.from_dict(d) for d in defs])
                job.info = {**(job.info or {}), **{str(k): v for k, v in info.items()}}
                if job.backend_commit is None and queue.job_backend_source(job):
                    job.backend_commit = _installed_backend_commit(info)  # a branch or tag, now resolved
                job_store.add_event(s, self.job_id, "info", "", dict(info))
                return ids

        with self._lock:
            self.metric_ids.update(self._stored("storing info", store))

    def log(self, line: str) -> None:
        def store() -> None:
            with write_tx(self.engine) as s:
                job_store.add_event(s, self.job_id, "log", line[:MAX_LOG_LINE])

        with self._lock:
            self._stored("storing a log line", store)

    def waiting(self, reason: str | None) -> None:
        """Show the job queued, held by this dispatcher, while it waits for `reason`; running
        again once it has its resources (None)."""
        with self._lock:
            if reason is None:
                self._stored("marking the job placed",
                             lambda: queue.unhold(self.engine, self.job_id, self.owner))
            else:
                self._stored("marking the job waiting",
                             lambda: queue.hold(self.engine, self.job_id, self.owner, reason))

    def artifact(self, name: str, media_type: str, data: bytes) -> None:
        def store() -> None:
            with write_tx(self.engine) as s:
                artifacts.save_artifact(s, self.job_id, name, media_type, data, self.artifacts_dir)
                job_store.add_event(s, self.job_id, "artifact", name,
                                    {"media_type": media_type, "size": len(data)})

        with self._lock:
            self._stored("storing an artifact", store)


class Dispatcher:
    """One per service process; several (even in several processes) may share a store."""

    def __init__(self, settings: Settings, engine: Engine, executor: Executor) -> None:
        self.settings = settings
        self.engine = engine
        self.executor = executor
        self.owner = queue.dispatcher_id()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._running: dict[int, tuple[threading.Thread, threading.Event]] = {}
        self._lock = threading.Lock()
        self.last_loop = 0.0
        self.store_up_since = time.monotonic()  # since when this dispatcher reaches the store
        self._unplaceable: dict[int, float] = {}  # job id -> since when no alive node set can hold it

    # -- lifecycle
    def start(self) -> None:
        for job_id, status in queue.settle_orphans(
            self.engine, self.owner, self.settings.lease_s, self.settings.max_attempts
        ):
            log.warning("job %s was left running by a crash; now %s", job_id, status)
        self.store_up_since = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="gdnval-dispatcher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look for work now (called after a submit)."""
        self._wake.set()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming; cancel running jobs and re-queue them (a restart is not the job's fault).

        The re-run is a new attempt: it keeps the cases that finished and runs the rest."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            running = list(self._running.values())
        for _, cancel in running:
            cancel.set()
        deadline = time.monotonic() + timeout
        for thread, _ in running:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread:
            self._thread.join(max(0.1, deadline - time.monotonic()))

    @property
    def running_ids(self) -> list[int]:
        with self._lock:
            return list(self._running)

    # -- the loop
    def _loop(self) -> None:
        last_settle = time.monotonic()
        down_since: float | None = None
        while not self._stop.is_set():
            self.last_loop = time.monotonic()
            try:
                self._tick()
                if time.monotonic() - last_settle > self.settings.lease_s / 2:
                    self._settle()
                    last_settle = time.monotonic()
                if down_since is not None:
                    log.warning("the store answers again after %.1f s", time.monotonic() - down_since)
                    self.store_up_since, down_since = time.monotonic(), None
            except Exception as exc:  # keep dispatching; the store may be briefly locked or unreachable
                if not is_unreachable(exc):
                    log.exception("dispatcher tick failed")
                elif down_since is None:
                    down_since = time.monotonic()
                    log.warning("the store is unreachable (%s); running jobs go on, nothing is claimed "
                                "until it answers", first_line(exc))
            self._wake.wait(self.settings.poll_interval_s)
            self._wake.clear()

    def _settle(self) -> None:
        """Settle orphans: this dispatcher's own held jobs that no thread runs, and another's whose
        heartbeat is older than the lease, once this one has reached the store for a whole lease
        (after an outage the owner needs a tick to heartbeat again)."""
        with self._lock:
            here = set(self._running)
        lease_ok = time.monotonic() - self.store_up_since >= self.settings.lease_s
        for job_id, status in queue.settle_orphans(self.engine, self.owner, self.settings.lease_s,
                                                   self.settings.max_attempts, here, lease_ok):
            log.warning("job %s was orphaned; now %s", job_id, status)

    def _tick(self) -> None:
        with self._lock:
            ids = list(self._running)
        for job_id in queue.heartbeat(self.engine, self.owner, ids):
            with self._lock:
                entry = self._running.get(job_id)
            if entry:
                entry[1].set()
        free: dict[tuple[str, str | None], int | None] = {}  # asked of the executor once per tick
        most: dict[tuple[str, str | None], int] = {}
        alive: dict[tuple[str, str | None], int | None] = {}
        claimed: dict[str, int] = {}  # ranks claimed this tick per device kind (one pool per kind)

        def fits(job: JobRow) -> bool:
            """Placeable now; or never placeable for `UNPLACEABLE_GRACE_S` (the cluster shrank
            since the submit; nodes still joining a cluster that just came back are waited for):
            then it is claimed too, and the executor fails it with the reason instead of it
            blocking its kind's queue for good."""
            key = (job.device, queue.job_placement(job))
            try:
                if key not in free:
                    free[key] = self.executor.free_ranks(*key)
                n = free[key]
                if n is None or job.world_size <= n - claimed.get(job.device, 0):
                    self._unplaceable.pop(job.id, None)
                    return True
                if key not in most:
                    most[key] = self.executor.most_ranks(*key)
                if job.world_size > most[key]:
                    since = self._unplaceable.setdefault(job.id, time.monotonic())
                    return time.monotonic() - since >= UNPLACEABLE_GRACE_S
                self._unplaceable.pop(job.id, None)
                if key not in alive:  # wider than the alive nodes: the executor asks for more
                    alive[key] = self.executor.alive_ranks(*key)
                return alive[key] is not None and job.world_size > alive[key]
            except ValueError:  # e.g. an unknown placement: the executor fails the job saying so
                return True
            except ExecutorUnavailable:  # the cluster does not answer: the job stays queued
                return False

        while not self._stop.is_set():
            job = queue.claim(self.engine, self.owner, self.settings.device_limits, fits)
            if job is None:
                return
            claimed[job.device] = claimed.get(job.device, 0) + job.world_size
            self._unplaceable.pop(job.id, None)
            cancel = threading.Event()
            thread = threading.Thread(target=self._run_job, args=(job, cancel), name=f"gdnval-job-{job.id}",
                                      daemon=True)
            with self._lock:
                self._running[job.id] = (thread, cancel)
            thread.start()

    def _stored(self, job_id: int, what: str, do: Callable[[], T]) -> T:
        return until_stored(do, f"{what} (job {job_id})", self._stop)

    def _run_job(self, job: JobRow, cancel: threading.Event) -> None:
        """Run the job and record its end; the store going away meanwhile only delays the record
        (a shutdown while it is away leaves the job to the next start's orphan settlement)."""
        try:
            outcome = self._execute(job, cancel)
            if outcome.status == "interrupted" or (self._stop.is_set() and outcome.status == "cancelled"):
                lost = outcome.status == "interrupted"
                reason = (outcome.error or "its cluster went away") if lost else queue.ORDERLY_REQUEUE
                status = self._stored(job.id, "re-queueing", lambda: queue.requeue_orderly(
                    self.engine, job.id, self.owner, reason, cluster_lost=lost))
                log.warning("job %s: %s; now %s", job.id, reason, status)
                return
            self._finish(job, outcome)
        except StoreUnavailable as exc:
            log.warning("job %s: %s; the next start settles it", job.id, exc)
        except Exception:
            log.exception("job %s: the dispatcher failed", job.id)
            error = traceback.format_exc(limit=5)[-4000:]
            try:
                self._stored(job.id, "recording its failure",
                             lambda: queue.finish(self.engine, job.id, self.owner, "failed", error))
            except Exception:
                log.exception("job %s: its failure could not be recorded; orphan settlement will", job.id)
        finally:
            with self._lock:
                self._running.pop(job.id, None)
            self._wake.set()

    def _finish(self, job: JobRow, outcome: JobOutcome) -> None:
        """The job's summaries, its verdict, then its final status, each waiting out the store."""
        attempt = job_store.job_attempt(job)
        for what, step in (
            # cases that ended have their summary already: only the rest is computed
            ("storing its summary", lambda: summary_store.finish_summary(self.engine, job.id, attempt)),
            # before the final status, so a finished job is never seen without its verdict
            ("storing its verdict",
             lambda: summary_store.record_verdict(self.engine, job.id, ran=outcome.status == "succeeded")),
        ):
            try:
                self._stored(job.id, what, step)
            except StoreUnavailable:
                raise
            except Exception:
                log.exception("job %s: %s failed", job.id, what)
        finished = self._stored(job.id, "recording its end", lambda: queue.finish(
            self.engine, job.id, self.owner, outcome.status, outcome.error))
        if not finished:
            log.warning("job %s was settled elsewhere while it ran; its outcome is dropped", job.id)

    def _execute(self, job: JobRow, cancel: threading.Event) -> JobOutcome:
        try:
            suite = get_suite(job.suite)
            deadline = job_deadline_s(suite, job.preset, job.params, job.world_size,
                                      self.settings.job_deadline_s)
            stall = stall_limit_s(suite, job.preset, self.settings.stall_s)
            sink = StoreSink(self.engine, job, Path(self.settings.artifacts_dir), self._stop)
            if sink.all_kept:  # interrupted after its last case: only the job's end is left
                sink.progress(0, 0, "every case finished in an earlier run")
                return JobOutcome("succeeded")
            spec = JobSpec(
                job_id=job.id, suite=job.suite, preset=job.preset, params=dict(job.params or {}),
                device=job.device, world_size=job.world_size, commit=job.commit_sha, deadline_s=deadline,
                stall_s=stall,
                cases=tuple(job.cases) if job.cases else None, placement=queue.job_placement(job),
                backend_source=queue.job_backend_source(job), skip_cases=tuple(sink.kept),
            )
            sink.info({
                "commit": job.commit_sha or source_commit(), "gdnval": installed_version(),
                "executor": self.executor.kind, "attempt": sink.attempt, "deadline_s": deadline,
                "stall_s": stall,
            })
            return self.executor.run(spec, sink, cancel)
        except StoreUnavailable:
            raise
        except Exception as exc:
            return JobOutcome(
                "failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)[-3000:]}"
            )
