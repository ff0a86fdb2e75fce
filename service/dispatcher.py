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
job keeps the cases its earlier runs finished and runs only the rest
(`service.persistence.resume`); when none is left, the job just ends.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from service.persistence import artifacts, queue
from service.persistence import cases as case_store
from service.persistence import jobs as job_store
from service.persistence import samples as sample_store
from service.persistence import summaries as summary_store
from service.persistence.db import write_tx
from service.persistence.models import CASE_STATUSES, JobRow, MetricRow
from service.persistence.resume import carry_finished_cases
from service.settings import Settings
from workers.deadline import job_deadline_s
from workers.executors.base import Executor, ExecutorUnavailable, JobOutcome, JobSpec
from workers.provenance import installed_version, source_commit
from workers.registry import get_suite
from workers.suite import Case, Metric, Sample, select_cases

log = logging.getLogger("gdnval.dispatcher")
MAX_LOG_LINE = 10_000


def _installed_backend_commit(info: Mapping[str, Any]) -> str | None:
    """The commit a job's backend from another repository was installed at, from the ranks'
    provenance (`workers.provenance`): the first backend not of our own distribution with one."""
    for b in info.get("backends") or ():
        if isinstance(b, Mapping) and b.get("distribution") not in (None, "gdnval") and b.get("commit"):
            return str(b["commit"])[:255]
    return None


class StoreSink:
    """The `workers.executors.base.JobSink` of one job run: thread-safe, writes through at once."""

    def __init__(self, engine: Engine, job: JobRow, artifacts_dir: Path) -> None:
        self.engine = engine
        self.job_id = job.id
        self.owner = str(job.claimed_by)
        self.attempt = max(1, job.attempts)
        self.suite = job.suite
        self.device, self.world_size = job.device, job.world_size
        self.artifacts_dir = artifacts_dir
        self._lock = threading.Lock()
        self.samples_written = 0
        self.case_ids: dict[str, int] = {}
        self.metric_ids: dict[str, int] = {}
        self.summarized: set[int] = set()  # case ids whose summary is stored for this attempt
        self.expected: list[str] = []  # the names of the cases this job runs
        with write_tx(engine) as s:
            # cases an earlier run finished are this run's too (not run again), the rest dropped
            self.kept = carry_finished_cases(s, job.id, self.attempt)
            summary_store.drop_earlier_summaries(s, job.id, self.attempt)
            case_store.drop_earlier_case_results(s, job.id, self.attempt)
            try:
                suite = get_suite(job.suite)
                cases = suite.cases(suite.resolve_params(job.preset, job.params, device=job.device))
                self.metric_ids = sample_store.ensure_metrics(s, suite.name, suite.metrics)
                self.expected = [c.name for c in select_cases(cases, job.cases)]
            except Exception as exc:  # the executor reports the real failure; keep the sink usable
                cases = []
                job_store.add_event(s, job.id, "log", f"could not expand the suite's cases: {exc}")
            self.case_ids = case_store.ensure_cases(s, cases, job.device, job.world_size)

    @property
    def all_kept(self) -> bool:
        """Every case of the job finished in earlier runs: nothing is left to run."""
        return bool(self.expected) and set(self.expected) <= set(self.kept)

    # -- ids for names the suite did not declare up front (kept, and said so in the log)
    def _case_id(self, s: Session, name: str) -> int:
        if name not in self.case_ids:
            self.case_ids.update(
                case_store.ensure_cases(s, [Case(self.suite, name, {"undeclared": name})], self.device,
                                   self.world_size)
            )
            job_store.add_event(
                s, self.job_id, "log", f"case {name!r} is not in the suite's matrix; stored anyway"
            )
        return self.case_ids[name]

    def _metric_id(self, s: Session, name: str) -> int:
        if name not in self.metric_ids:
            row = MetricRow(suite=self.suite, name=name, diagnostic=True)  # no scale known: never judged
            s.add(row)
            s.flush()
            self.metric_ids[name] = row.id
            job_store.add_event(
                s, self.job_id, "log", f"metric {name!r} is not declared by the suite; stored anyway"
            )
        return self.metric_ids[name]

    def samples(self, batch: Sequence[Sample]) -> None:
        if not batch:
            return
        with self._lock:
            missing_c = {b.case for b in batch} - set(self.case_ids)
            missing_m = {b.metric for b in batch} - set(self.metric_ids)
            if missing_c or missing_m:
                with write_tx(self.engine) as s:
                    for c in sorted(missing_c):
                        self._case_id(s, c)
                    for m in sorted(missing_m):
                        self._metric_id(s, m)
            cids, mids, job, att = self.case_ids, self.metric_ids, self.job_id, self.attempt
            reopened = {cids[b.case] for b in batch} & self.summarized
            if reopened:  # samples after the case's end: its stored summary is stale, show it live
                with write_tx(self.engine) as s:
                    summary_store.drop_case_summaries(s, job, att, reopened)
                self.summarized -= reopened
            rows = [
                (job, att, cids[b.case], mids[b.metric], int(b.rank), int(b.idx), float(b.value))
                for b in batch
            ]
            sample_store.insert_sample_rows(self.engine, rows)
            self.samples_written += len(rows)

    def case_result(self, case: str, status: str, error: str | None = None) -> None:
        with self._lock:
            with write_tx(self.engine) as s:
                if status not in CASE_STATUSES:
                    error = f"executor reported unknown status {status!r}; {error or ''}".strip()
                    status = "error"
                case_id = self._case_id(s, case)
                case_store.set_case_result(s, self.job_id, case_id, status, error, attempt=self.attempt)
            self._store_case_summary(case_id)

    def _store_case_summary(self, case_id: int) -> None:
        """The ended case's summary, computed in a read session (outside the write lock) and
        stored in its own short transaction; on failure the case stays live and the job's end
        stores it."""
        try:
            with Session(self.engine) as s:
                summary = summary_store.compute_summary(s, self.job_id, case_ids=[case_id],
                                                        attempt=self.attempt)
            with write_tx(self.engine) as s:
                summary_store.store_summary(s, self.job_id, summary, case_ids=[case_id], attempt=self.attempt)
            self.summarized.add(case_id)
        except Exception:
            log.exception("storing the summary of case %s of job %s failed", case_id, self.job_id)

    def progress(self, done: int, total: int, message: str = "") -> None:
        """`done` of `total` cases of this run; the cases kept from earlier runs count as done."""
        done, total = done + len(self.kept), total + len(self.kept)
        with self._lock, write_tx(self.engine) as s:
            job = s.get(JobRow, self.job_id)
            if job is None:
                return
            job.progress_done, job.progress_total, job.progress_message = done, total, message[:1000]
            job_store.add_event(s, self.job_id, "progress", message[:1000], {"done": done, "total": total})

    def info(self, info: Mapping[str, Any]) -> None:
        info = dict(info)
        defs = info.pop("metrics", None)  # the job's own code's metric definitions
        with self._lock, write_tx(self.engine) as s:
            job = s.get(JobRow, self.job_id)
            if job is None:
                return
            if defs:  # what this job's summaries are judged and stored with
                own = [Metric.from_dict(d) for d in defs]
                self.metric_ids.update(sample_store.ensure_metrics(s, self.suite, own))
            job.info = {**(job.info or {}), **{str(k): v for k, v in info.items()}}
            if job.backend_commit is None and queue.job_backend_source(job):
                job.backend_commit = _installed_backend_commit(info)  # a branch or tag, now resolved
            job_store.add_event(s, self.job_id, "info", "", dict(info))

    def log(self, line: str) -> None:
        with self._lock, write_tx(self.engine) as s:
            job_store.add_event(s, self.job_id, "log", line[:MAX_LOG_LINE])

    def waiting(self, reason: str | None) -> None:
        """Show the job queued, held by this dispatcher, while it waits for `reason`; running
        again once it has its resources (None)."""
        with self._lock:
            if reason is None:
                queue.unhold(self.engine, self.job_id, self.owner)
            else:
                queue.hold(self.engine, self.job_id, self.owner, reason)

    def artifact(self, name: str, media_type: str, data: bytes) -> None:
        with self._lock, write_tx(self.engine) as s:
            artifacts.save_artifact(s, self.job_id, name, media_type, data, self.artifacts_dir)
            job_store.add_event(s, self.job_id, "artifact", name,
                                {"media_type": media_type, "size": len(data)})


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

    # -- lifecycle
    def start(self) -> None:
        for job_id, status in queue.settle_orphans(
            self.engine, self.owner, self.settings.lease_s, self.settings.max_attempts
        ):
            log.warning("job %s was left running by a crash; now %s", job_id, status)
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
        while not self._stop.is_set():
            self.last_loop = time.monotonic()
            try:
                self._tick()
                if time.monotonic() - last_settle > self.settings.lease_s / 2:
                    queue.settle_orphans(
                        self.engine, self.owner, self.settings.lease_s, self.settings.max_attempts
                    )
                    last_settle = time.monotonic()
            except Exception:  # keep dispatching; the store may be briefly locked or unreachable
                log.exception("dispatcher tick failed")
            self._wake.wait(self.settings.poll_interval_s)
            self._wake.clear()

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
            """Placeable now; or never placeable (the cluster shrank since the submit): then it
            is claimed too, and the executor fails it with the reason instead of it blocking its
            kind's queue for good."""
            key = (job.device, queue.job_placement(job))
            try:
                if key not in free:
                    free[key] = self.executor.free_ranks(*key)
                n = free[key]
                if n is None or job.world_size <= n - claimed.get(job.device, 0):
                    return True
                if key not in most:
                    most[key] = self.executor.most_ranks(*key)
                if job.world_size > most[key]:
                    return True
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
            cancel = threading.Event()
            thread = threading.Thread(target=self._run_job, args=(job, cancel), name=f"gdnval-job-{job.id}",
                                      daemon=True)
            with self._lock:
                self._running[job.id] = (thread, cancel)
            thread.start()

    def _run_job(self, job: JobRow, cancel: threading.Event) -> None:
        try:
            outcome = self._execute(job, cancel)
            if self._stop.is_set() and outcome.status == "cancelled":
                self._requeue(job.id)
                return
            try:  # cases that ended have their summary already: only the rest is computed
                summary_store.finish_summary(self.engine, job.id, job_store.job_attempt(job))
            except Exception:
                log.exception("storing the summary of job %s failed", job.id)
            try:  # before the final status, so a finished job is never seen without its verdict
                summary_store.record_verdict(self.engine, job.id, ran=outcome.status == "succeeded")
            except Exception:
                log.exception("storing the verdict of job %s failed", job.id)
            if not queue.finish(self.engine, job.id, self.owner, outcome.status, outcome.error):
                log.warning("job %s was settled elsewhere while it ran; its outcome is dropped", job.id)
        except Exception:
            log.exception("job %s: the dispatcher failed", job.id)
            queue.finish(self.engine, job.id, self.owner, "failed", traceback.format_exc(limit=5)[-4000:])
        finally:
            with self._lock:
                self._running.pop(job.id, None)
            self._wake.set()

    def _execute(self, job: JobRow, cancel: threading.Event) -> JobOutcome:
        try:
            deadline = job_deadline_s(get_suite(job.suite), job.preset, job.params, job.world_size,
                                      self.settings.job_deadline_s)
            sink = StoreSink(self.engine, job, Path(self.settings.artifacts_dir))
            if sink.all_kept:  # interrupted after its last case: only the job's end is left
                sink.progress(0, 0, "every case finished in an earlier run")
                return JobOutcome("succeeded")
            spec = JobSpec(
                job_id=job.id, suite=job.suite, preset=job.preset, params=dict(job.params or {}),
                device=job.device, world_size=job.world_size, commit=job.commit_sha, deadline_s=deadline,
                cases=tuple(job.cases) if job.cases else None, placement=queue.job_placement(job),
                backend_source=queue.job_backend_source(job), skip_cases=tuple(sink.kept),
            )
            sink.info({
                "commit": job.commit_sha or source_commit(), "gdnval": installed_version(),
                "executor": self.executor.kind, "attempt": sink.attempt, "deadline_s": deadline,
            })
            return self.executor.run(spec, sink, cancel)
        except Exception as exc:
            return JobOutcome(
                "failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)[-3000:]}"
            )

    def _requeue(self, job_id: int) -> None:
        queue.requeue_orderly(self.engine, job_id, self.owner)
