"""From the store to the compare engine: load a job as a `JobSide`, find the job of a commit, and
resolve what a head is compared against (explicit base, named baseline, or the parent commit).

Kept apart from `service.domain.compare` so the engine stays database-free; the rows come from
`service.persistence` (`compare_reads` for a job's samples), never from SQL written here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
from sqlalchemy.orm import Session

from service.domain.compare import (
    CaseInfo,
    CompareConfig,
    Comparison,
    JobRef,
    JobSide,
    SampleTable,
    compare,
    series_of,
)
from service.persistence import baselines, commits
from service.persistence.compare_reads import read_job_for_compare
from service.persistence.jobs import find_commit_job
from service.persistence.records import JobRecord
from workers import verdict
from workers.provenance import code_identity
from workers.refs import GIT_END_OF_OPTIONS, check_revision


class NotFound(LookupError):
    """A job, commit, baseline or job of a commit that is not in the store; the message names it."""


def job_ref(job: JobRecord) -> JobRef:
    return JobRef(
        job_id=job.id,
        suite=job.suite,
        preset=job.preset,
        commit=job.code_commit,
        device=job.device,
        world_size=job.world_size,
        status=job.status,
        device_name=(job.info or {}).get("device_name"),
        suite_version=(job.info or {}).get("suite_version"),
        code=code_identity(job.info),
    )


def load_side(session: Session, job_id: int) -> JobSide:
    """A job's cases, metric definitions and raw samples, as the compare engine wants them."""
    stored = read_job_for_compare(session, job_id)
    if stored is None:
        raise NotFound(f"no job {job_id} in the store")
    rows, defined, case_rows = stored.samples, stored.metrics, stored.case_rows
    case_ids_s, case_codes = np.unique(rows.case_id, return_inverse=True)
    metric_ids_s, metric_codes = np.unique(rows.metric_id, return_inverse=True)
    by_result = {cid: (status, error, source) for cid, status, error, source in stored.results}
    cases: dict[str, CaseInfo] = {}
    for cid in sorted(case_rows):
        c = case_rows[cid]
        status, error, source = by_result.get(cid, (None, None, None))
        cases[c.fingerprint] = CaseInfo(c.fingerprint, c.name, dict(c.params or {}), status, error,  # type: ignore[arg-type]
                                        source)
    table = SampleTable(
        case=case_codes.reshape(-1),
        metric=metric_codes.reshape(-1),
        rank=np.zeros(len(rows), dtype=np.int64),
        idx=rows.idx,
        value=rows.value,
        case_keys=[case_rows[c].fingerprint for c in case_ids_s.tolist()],
        metric_keys=[defined[m].name for m in metric_ids_s.tolist()],
        ranks=rows.ranks,
    )
    metrics = {m.name: m for m in defined.values()}
    # the definition the job was judged with (copied onto its summaries), not today's
    for metric_id, kind, direction, bound, diagnostic in stored.judged:
        m = defined.get(metric_id)
        if m is not None:
            declared = diagnostic if diagnostic is not None else m.diagnostic
            metrics[m.name] = replace(m, kind=kind, direction=direction, bound=bound,
                                      diagnostic=verdict.is_diagnostic(kind, bound, declared))
    return JobSide(job_ref(stored.job), cases, metrics, table)


def repetitions(side: JobSide) -> Callable[[str, str], np.ndarray | None]:
    """(fingerprint, metric) -> that metric's values after the worst-rank reduction, one per
    repetition (None when the job has none): what a gain or speed-up's interval is computed from
    (`service.domain.compare.judgment.difference`)."""
    series = series_of(side.samples, side.metrics)
    by_key = {key: series.get(g)[1] for g, key in enumerate(series.keys)}
    return lambda fingerprint, metric: by_key.get((fingerprint, metric))


def job_repetitions(session: Session, job_id: int) -> Callable[[str, str], np.ndarray | None]:
    """`repetitions` of a stored job."""
    return repetitions(load_side(session, job_id))


def compare_jobs(
    session: Session, base_job: int, head_job: int, config: CompareConfig | None = None
) -> Comparison:
    """Compare two stored jobs; they must be of the same suite (a cross-suite diff is meaningless)."""
    base, head = load_side(session, base_job), load_side(session, head_job)
    if base.ref.suite != head.ref.suite:
        raise ValueError(
            f"job {base_job} is suite {base.ref.suite!r} but job {head_job} is {head.ref.suite!r}; "
            "expected two jobs of one suite"
        )
    return compare(base, head, config)


POOL_IDX_STRIDE = 1 << 40  # idx offset per pooled job: repetitions of two jobs never meet


def load_pooled_side(session: Session, job_ids: list[int]) -> JobSide:
    """Several jobs of one suite, commit and setting (a job and the gate's re-measurements of
    some of its cases) as one side: samples concatenated with each job's idx offset, so ranks
    are reduced within a repetition, never across jobs. A case takes the first job's status
    unless a later job errored or failed it."""
    sides = [load_side(session, j) for j in job_ids]
    first = sides[0]
    if len(sides) == 1:
        return first
    cases = dict(first.cases)
    parts: list[tuple[str, str, int, int, float]] = []
    for k, side in enumerate(sides):
        t = side.samples
        offset = k * POOL_IDX_STRIDE
        counts = t.ranks if t.ranks is not None else np.ones(len(t), dtype=np.int64)
        parts += [  # rows reduced over ranks already: the rank column carries the rank count
            (t.case_keys[c], t.metric_keys[m], int(r), int(i) + offset, float(v))
            for c, m, r, i, v in zip(t.case.tolist(), t.metric.tolist(), counts.tolist(), t.idx.tolist(),
                                     t.value.tolist(), strict=True)
        ]
        if k:
            for fp, info in side.cases.items():
                if info.status in ("error", "failed") or fp not in cases:
                    cases[fp] = info
    metrics = {name: m for side in sides for name, m in side.metrics.items()}
    table = SampleTable.from_records(parts)
    table.ranks, table.rank = table.rank, np.zeros(len(table), dtype=np.int64)
    return JobSide(first.ref, cases, metrics, table)


def compare_pooled(
    session: Session, base_jobs: list[int], head_jobs: list[int], config: CompareConfig | None = None
) -> Comparison:
    """`compare_jobs` over pooled sides (the gate after re-measuring undecided cases)."""
    if len(base_jobs) == 1 and len(head_jobs) == 1:
        return compare_jobs(session, base_jobs[0], head_jobs[0], config)
    base, head = load_pooled_side(session, base_jobs), load_pooled_side(session, head_jobs)
    if base.ref.suite != head.ref.suite:
        raise ValueError(f"suite {base.ref.suite!r} vs {head.ref.suite!r}; expected one suite")
    return replace(compare(base, head, config), base_jobs=tuple(base_jobs), head_jobs=tuple(head_jobs))


def compare_commits(
    session: Session,
    base_sha: str,
    head_sha: str,
    suite: str,
    *,
    preset: str | None = None,
    device: str | None = None,
    world_size: int | None = None,
    config: CompareConfig | None = None,
) -> Comparison:
    """Compare the latest successful jobs of `suite` (same preset/device/world size) at two commits."""
    jobs = []
    for sha in (base_sha, head_sha):
        job = find_commit_job(session, sha, suite, preset=preset, device=device, world_size=world_size)
        if job is None:
            raise NotFound(
                f"no succeeded job of suite {suite!r} (preset {preset or 'any'}, device {device or 'any'}) "
                f"at commit {sha!r}"
            )
        jobs.append(job.id)
    return compare_jobs(session, jobs[0], jobs[1], config)


# ------------------------------------------------------------------------------ what is the base


@dataclass(frozen=True)
class BaseRef:
    """What the head is compared against: one job, or a commit (its jobs per suite)."""

    kind: Literal["job", "commit"]
    value: str  # job id as text, or a commit sha/ref
    source: str  # how it was found, for the report ("--base", "baseline 'main'", "parent of ...")

    @property
    def job_id(self) -> int | None:
        return int(self.value) if self.kind == "job" else None


def parse_job_ref(ref: str) -> int | None:
    """'job:12', '#12' or 'job/12' -> 12; anything else (a commit) -> None."""
    for prefix in ("job:", "#", "job/"):
        if ref.startswith(prefix) and ref[len(prefix):].isdigit():
            return int(ref[len(prefix):])
    return None


def git_rev_parse(repo: str | Path, ref: str) -> str | None:
    """The full sha of `ref` in the repository at `repo`, or None (no repo, unknown ref, no git).

    `ref` is a commit reference by `workers.refs.check_revision` (a ref, optionally followed by
    ancestry steps like `~1` or `^`); anything else raises `InvalidCommitRef` before git is called.
    """
    ref = check_revision(ref)
    try:
        args = ["rev-parse", "--verify", "--quiet", GIT_END_OF_OPTIONS, f"{ref}^{{commit}}"]
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else None


def resolve_base(
    session: Session | None,
    head: str,
    *,
    base: str | None = None,
    baseline: str | None = None,
    repo: str | Path | None = None,
) -> BaseRef:
    """The base of a comparison: `base` (a commit or 'job:N'), else the named `baseline` from the
    store, else the parent of `head` in `repo` (or, without a repo, the parent the store recorded)."""
    if base and baseline:
        raise ValueError(f"give --base ({base!r}) or --baseline ({baseline!r}), not both")
    if base:
        job = parse_job_ref(base)
        if job is not None:
            return BaseRef("job", str(job), f"job {job} (--base)")
        sha = git_rev_parse(repo, base) if repo else None
        return BaseRef("commit", sha or base, f"commit {base} (--base)")
    if baseline:
        if session is None:
            raise ValueError(f"baseline {baseline!r} needs the store")
        row = baselines.get_baseline(session, baseline)
        if row is None:
            names = [b.name for b in baselines.list_baselines(session)]
            raise NotFound(f"no baseline named {baseline!r}; expected one of {names}")
        if row.job_id is not None:
            return BaseRef("job", str(row.job_id), f"baseline {baseline!r} (job {row.job_id})")
        if row.commit is not None:
            return BaseRef("commit", row.commit, f"baseline {baseline!r} (commit {row.commit[:12]})")
        raise NotFound(f"baseline {baseline!r} points at nothing (its commit or job was deleted)")
    if repo:
        parent = git_rev_parse(repo, f"{head}^")
        if parent:
            return BaseRef("commit", parent, f"parent of {head[:12]} in the repository")
    if session is not None:
        parent = commits.recorded_parent(session, head)
        if parent:
            return BaseRef("commit", parent, f"parent of {head[:12]} recorded in the store")
    raise NotFound(
        f"cannot find the parent of {head!r}: no repository {'at ' + str(repo) if repo else 'configured'} "
        "knows it and the store has no parent recorded; give --base or --baseline"
    )
