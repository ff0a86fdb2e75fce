"""Turns the ranks' channel messages into sink calls and decides when a job has failed.

Shared by both executors: they feed it messages and process exits; it combines case results over
ranks (the worst rank wins), judges each case's bounds on the samples of every rank together
(`workers.verdict`, with the metric definitions the ranks' own code sent), reports progress and
info, and picks the failure reason: a rank that died beats a rank that raised, which beats a rank
that only saw its peers go away.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers import verdict
from workers.executors.base import JobOutcome, JobSink, JobSpec
from workers.suite import Metric, Sample

combine_case_statuses = verdict.combine_rank_statuses  # the rank rule lives in workers.verdict

_CAUSE_ORDER = {"died": 0, "stalled": 0, "raised": 1, "deadline": 1, "peer": 2}
GRACE_S = 0.5  # after the first failure, how long to wait for a more telling one from another rank


def _backend_versions(info: Mapping[str, Any]) -> dict[str, str | None]:
    """backend -> the version this rank loaded (`workers.provenance.backend_provenance`): the job
    keeps the first rank's full provenance, and every rank's versions so a disagreement shows."""
    return {
        str(b["backend"]): b.get("version")
        for b in info.get("backends") or ()
        if isinstance(b, Mapping) and b.get("backend")
    }


@dataclass
class _Failure:
    cause: str
    rank: int
    reason: str
    at: float


class JobMonitor:
    """State of one running job as seen from the executor."""

    def __init__(self, spec: JobSpec, sink: JobSink) -> None:
        self.spec = spec
        self.sink = sink
        self.world_size = spec.world_size
        self.total: int | None = None
        self.done_cases = 0
        self._results: dict[str, dict[int, tuple[str, str | None]]] = {}
        self._reported: set[str] = set()
        self._current: dict[int, tuple[str, float] | None] = {}
        self._finished_ranks: set[int] = set()
        self._infos: dict[int, dict[str, Any]] = {}
        self.rank_extras: dict[int, dict[str, Any]] = {}  # per rank, from the executor (Ray node, ...)
        self._info_sent = False
        self._failures: list[_Failure] = []
        self._told_why: set[int] = set()  # ranks that sent a `fatal` message before exiting
        self.sample_count = 0
        self.metrics: dict[str, Metric] = {}
        # (rank, idx, value) rows per case and metric, kept until the case is judged
        self._case_rows: dict[str, dict[str, list[tuple[int, int, float]]]] = {}

    # -- messages -----------------------------------------------------------------------------

    def handle(self, rank: int, msg: Mapping[str, Any]) -> None:
        kind = msg.get("t")
        if kind == "samples":
            batch = [Sample(c, m, float(v), int(r), int(i)) for c, m, v, r, i in msg["samples"]]
            self.sample_count += len(batch)
            for smp in batch:
                if smp.case not in self._reported:
                    rows = self._case_rows.setdefault(smp.case, {}).setdefault(smp.metric, [])
                    rows.append((smp.rank, smp.idx, smp.value))
            self.sink.samples(batch)
        elif kind == "case_start":
            self._current[rank] = (msg["case"], time.monotonic())
        elif kind == "case_end":
            self._current[rank] = None
            self._case_end(rank, msg["case"], msg["status"], msg.get("error"))
        elif kind == "cases":
            if self.total is None:
                self.total = int(msg["total"])
                self.sink.progress(0, self.total, "started")
        elif kind == "info":
            info = dict(msg["info"])
            defs = info.pop("metrics", None)
            if defs and not self.metrics:
                self.metrics = {m["name"]: Metric.from_dict(m) for m in defs}
            self._infos[rank] = info
            if len(self._infos) == self.world_size:
                self.flush_info()
        elif kind == "artifact":
            self.sink.artifact(msg["name"], msg["media_type"], base64.b64decode(msg["data"]))
        elif kind == "log":
            self.sink.log(f"[rank {rank}] {msg['line']}")
        elif kind == "fatal":
            self._told_why.add(rank)
            failed = int(msg.get("failed_rank", rank))
            cause = msg.get("cause", "raised")
            self._fail(cause, failed, str(msg["error"]))
        elif kind == "done":
            self._finished_ranks.add(rank)

    def _case_end(self, rank: int, case: str, status: str, error: str | None) -> None:
        per_rank = self._results.setdefault(case, {})
        per_rank[rank] = (status, error)
        if len(per_rank) == self.world_size and case not in self._reported:
            self._reported.add(case)
            combined, text = verdict.case_status(
                verdict.combine_rank_statuses(per_rank), self.judge_case(case)
            )
            self.sink.case_result(case, combined, text)  # type: ignore[arg-type]
            self.done_cases += 1
            self.sink.progress(self.done_cases, self.total or self.done_cases, f"{case}: {combined}")

    def judge_case(self, case: str) -> list[verdict.Judgement]:
        """Every metric of an ended case against its bound, over all ranks' samples (then dropped)."""
        rows = self._case_rows.pop(case, {})
        out = []
        for name, metric_rows in rows.items():
            metric = self.metrics.get(name)
            if metric is None:  # no definitions (a rank that sent none): the rank already errored
                continue
            out.append(verdict.judge_samples(metric, metric_rows))
        return out

    def flush_info(self) -> None:
        if self._info_sent or not self._infos:
            return
        self._info_sent = True
        first = self._infos[min(self._infos)]
        ranks = [
            {k: info.get(k) for k in ("host", "pid", "device_name", "visible_devices")}
            | {"backends": _backend_versions(info)}
            | self.rank_extras.get(r, {})
            | {"rank": r}
            for r, info in sorted(self._infos.items())
        ]
        defs = {"metrics": [m.to_dict() for m in self.metrics.values()]} if self.metrics else {}
        self.sink.info({**first, "world_size": self.world_size, "ranks": ranks, **defs})

    # -- process events -----------------------------------------------------------------------

    def rank_exited(self, rank: int, description: str, returncode: int | None, output_tail: str) -> None:
        """A rank's process (or actor) is gone; a clean end sent `done` first."""
        if rank in self._finished_ranks:  # every result is in; a crash at shutdown only gets logged
            if returncode not in (0, None):
                self.sink.log(f"[rank {rank}] {description} after finishing its cases")
            return
        if rank in self._told_why and (returncode is None or returncode >= 0):
            return  # it told us why before it exited
        where = self._where(rank)
        tail = f"\n--- output tail of rank {rank} ---\n{output_tail}" if output_tail.strip() else ""
        self._fail("died", rank, f"{description}{where}{tail}")

    def deadline_passed(self, deadline_s: float) -> None:
        in_case = [(r, c) for r, c in sorted(self._current.items()) if c is not None]
        stuck = [r for r in range(self.world_size) if r not in self._finished_ranks]
        parts = [f"rank {r} in case {c[0]!r} for {time.monotonic() - c[1]:.1f} s" for r, c in in_case]
        detail = "; ".join(parts) if parts else f"unfinished rank(s): {stuck}"
        rank = in_case[0][0] if in_case else (stuck[0] if stuck else 0)
        self._fail("deadline", rank, f"job deadline of {deadline_s:g} s exceeded: {detail}")

    def check_silence(self, rank: int, silent_s: float, where: str = "") -> None:
        """Fail the job when `rank` (still running) has been silent past the job's stall limit:
        no beat, message or output, so its process is stopped or frozen. `where` names its node."""
        limit = self.spec.stall_s
        if limit is None or silent_s <= limit or rank in self._finished_ranks or self._stalled_named(rank):
            return
        self._fail("stalled", rank, f"rank {rank}{where} made no progress for {silent_s:.0f} s (stall limit "
                   f"{limit:g} s): its process is stopped or frozen{self._where(rank)}")

    def _stalled_named(self, rank: int) -> bool:
        return any(f.cause == "stalled" and f.rank == rank for f in self._failures)

    def _where(self, rank: int) -> str:
        current = self._current.get(rank)
        return f" during case {current[0]!r}" if current else ""

    def _fail(self, cause: str, rank: int, reason: str) -> None:
        self._failures.append(_Failure(cause, rank, reason, time.monotonic()))

    # -- verdict ------------------------------------------------------------------------------

    @property
    def all_done(self) -> bool:
        return len(self._finished_ranks) == self.world_size

    def failure(self, *, settle: bool = False) -> str | None:
        """The job's failure reason once settled: `GRACE_S` after the first failure, or at once."""
        if not self._failures:
            return None
        first = min(f.at for f in self._failures)
        if not settle and time.monotonic() - first < GRACE_S:
            return None
        best = min(self._failures, key=lambda f: (_CAUSE_ORDER.get(f.cause, 3), f.at))
        prefix = f"rank {best.rank}"
        return best.reason if best.reason.startswith(prefix) else f"{prefix}: {best.reason}"

    @property
    def has_failure(self) -> bool:
        return bool(self._failures)

    def outcome(self, cancelled: bool, ranks_exited: int, started: float,
                hold: bool = False) -> JobOutcome | None:
        """The job's outcome once it has one (None while it runs): cancel, then a settled failure,
        then success once every rank finished and exited, then the job deadline. `hold`: a rank
        whose fate is still unknown (its actor unreachable) may yet explain the failure, so a
        failure waits for it (the deadline still ends the job)."""
        if cancelled:
            return JobOutcome("cancelled", "cancelled while running")
        reason = None if hold else self.failure()
        if reason:
            return JobOutcome("failed", reason)
        if self.all_done and ranks_exited == self.world_size:
            return JobOutcome("succeeded")
        deadline = self.spec.deadline_s
        if deadline and time.monotonic() - started > deadline and not self.has_failure:
            self.deadline_passed(deadline)
            return JobOutcome("failed", self.failure(settle=True))
        return None
