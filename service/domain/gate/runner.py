"""Running a gate: find or submit its jobs, wait for them, re-measure undecided time changes,
confirm regressions with fresh pairs, then record what `service.domain.gate.decision` decided.
This is the part that queues jobs and opens sessions; the decisions are pure functions there."""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any, Literal

from service.domain import submission
from service.domain.backend_gate import REFERENCE
from service.domain.baselines import NotFound, compare_jobs, compare_pooled, resolve_base
from service.domain.compare import Comparison
from service.domain.gate import decision
from service.domain.gate.decision import EXIT_INFRA, GateVerdict
from service.domain.gate.request import GateInputError, GateRequest, params_for, preset_for, validate_gate
from service.domain.gate.state import GateJob, GateState, Role
from service.domain.same_code import code_under_test, identical_job
from service.persistence import gates as gate_store
from service.persistence import queue
from service.persistence.gates import GateJobLink
from service.persistence.jobs import find_commit_job, job_by_idempotency_key, job_record
from service.persistence.records import JobRecord
from service.persistence.resume import TAKE_FROM_LABEL, take_labels
from workers.backend_source import BACKEND_SOURCE_LABEL
from workers.snapshot import REPO_ENV

# A submit function: (suite, preset, commit, device, world_size, idempotency_key, labels) -> job id.
SubmitFn = Callable[..., int]


def _job_view(job: JobRecord, role: Role, reused: bool) -> GateJob:
    source = (job.labels or {}).get(TAKE_FROM_LABEL)
    return GateJob(
        role=role,
        suite=job.suite,
        job_id=job.id,
        status=job.status,
        commit=job.code_commit,
        progress_done=job.progress_done or 0,
        progress_total=job.progress_total or 0,
        message=job.progress_message or "",
        error=job.error,
        reused=reused,
        takes_from=int(source) if str(source).isdigit() else None,
    )


class CannotRun(RuntimeError):
    """The service cannot run a job the gate needs (no executor, a world size it never offers)."""


def default_submit(engine: Any, settings: Any = None, executor: Any = None, wake: Any = None) -> SubmitFn:
    """Submit through the service's checked queue path (the same as `POST /api/v1/jobs`): the
    executor's limits are checked at once, so a job it can never run is an exit-2 answer now,
    not a job queued forever."""

    def submit(**kw: Any) -> int:
        if settings is None:
            cases = kw.pop("cases", None)
            job, _ = queue.submit(engine, queue.JobRequest(**kw, cases=tuple(cases) if cases else None))
        else:
            try:
                job, _ = submission.submit_checked(engine, settings, kw, executor, gate=True)
            except submission.InvalidJob as exc:
                raise CannotRun(str(exc)) from exc
        if wake is not None:
            wake()
        return int(job.id)

    submit.executor = executor  # type: ignore[attr-defined]  # validate_gate checks its limits
    return submit


def _service_repo() -> str | None:
    """The executors' repository (GDNVAL_REPO): it knows the head's parent when the client did not say."""
    import os

    return os.environ.get(REPO_ENV) or None


def evaluate_gate(engine: Any, req: GateRequest, submit: SubmitFn | None = None) -> GateState:
    """One step of the gate: find or submit every job, decide once all are final, and record
    where it stands (the gate's row: request, jobs, rounds, confirmations, verdict, findings)."""
    state = _step(engine, req, submit)
    state.gate_id = record_gate(engine, req, state)
    return state


def record_gate(engine: Any, req: GateRequest, state: GateState) -> int:
    """Store the gate's state under its run id (created at its first step); returns the gate's id."""
    fields = {
        "head": state.head, "base": state.base, "base_source": state.base_source[:500],
        "backend": req.backend, "backend_repo": req.backend_repo, "device": req.device,
        "world_size": req.world_size,
        "phase": state.phase, "verdict": state.verdict, "exit_code": state.exit_code, "reason": state.reason,
        "rounds": state.rounds, "undecided": list(state.undecided),
        "findings": decision.findings(state.comparisons),
        "confirmations": [c.to_dict() for c in state.confirmations],
    }
    links = [GateJobLink(j.job_id, j.role, j.suite, j.reused) for j in state.jobs]
    return gate_store.save_gate(engine, req.key(), req.model_dump(mode="json"), fields, links)


def _step(engine: Any, req: GateRequest, submit: SubmitFn | None = None) -> GateState:
    from sqlalchemy.orm import Session

    submit = submit or default_submit(engine)
    suites = validate_gate(req, getattr(submit, "executor", None))
    with Session(engine) as s:
        try:
            base = resolve_base(s, req.head, base=req.base, baseline=req.baseline, repo=_service_repo())
        except NotFound as exc:
            return _done(GateState("done", EXIT_INFRA, "error", "", req.head, None, ""), EXIT_INFRA, "error",
                         f"could not run: {exc}")
        except ValueError as exc:  # both --base and --baseline
            raise GateInputError(str(exc)) from exc
        if base.kind == "job" and len(suites) > 1:
            raise GateInputError(
                f"base {base.source} is one job, but {len(suites)} suites were asked ({suites}); "
                "gate one suite against a job, or use a commit/baseline commit"
            )
    state = GateState("waiting", None, None, "", req.head, base.value, base.source)
    try:
        pairs = _jobs(engine, req, suites, base, state, submit)
    except CannotRun as exc:
        return _give_up(engine, state, f"could not run: {exc}")
    if pairs is None:
        return state

    unsettled = _unsettled(engine, state, state.jobs, "could not run", "waiting for jobs")
    if unsettled is not None:
        return unsettled

    with Session(engine) as s:
        state.comparisons = [compare_jobs(s, b.job_id, h.job_id) for _, h, b in pairs]
    state.measured = list(state.comparisons)  # what each job pair measured, before any pooling
    why_not = decision.incomparable(state.comparisons)
    if why_not is not None:
        return _give_up(engine, state, why_not)
    if not decision.settled_by_failure(state.comparisons):  # more evidence could change the verdict
        try:
            waiting = _measure_again(engine, req, state, pairs, state.comparisons, submit, "round")
        except CannotRun as exc:
            return _give_up(engine, state, f"could not run a re-measurement: {exc}")
        if waiting is not None:
            return waiting
        if req.confirm or (req.confirm is None and req.device == "cpu"):
            try:
                waiting = _confirm(engine, req, state, pairs, submit)
            except CannotRun as exc:
                return _give_up(engine, state, f"could not run the confirmation: {exc}")
            if waiting is not None:
                return waiting
    decided = decision.decide(state.comparisons, state.confirmations, state.rounds)
    state.undecided = list(decided.undecided)
    if decided.code == EXIT_INFRA:
        return _give_up(engine, state, decided.reason)
    return _done(state, decided.code, decided.verdict, decided.reason)


def _measure_again(
    engine: Any,
    req: GateRequest,
    state: GateState,
    pairs: Sequence[tuple[str, GateJob, GateJob]],
    comparisons: list[Comparison],
    submit: SubmitFn,
    kind: Literal["round", "confirm"],
    only: Container[tuple[str, str, str]] | None = None,
) -> GateState | None:
    """Re-measure the undecided cases of `comparisons` (one per pair; with `only`, undecided in
    those (suite, fingerprint, metric)), round by round (a base job, then a head job, of just those
    cases), pooling every round with the pair's jobs, until decided or `max_rounds` are spent.
    `kind`: rounds of the first pairs, or of confirmation pairs (their jobs' roles). Returns a
    waiting/error state while a round runs or broke, else None (`comparisons` are then the pooled
    ones, replaced in place)."""
    from sqlalchemy.orm import Session

    pools = {suite: ([base.job_id], [head.job_id]) for suite, head, base in pairs}
    what = "undecided case(s)" if kind == "round" else "case(s) whose confirmation is undecided"
    for rnd in range(1, req.max_rounds + 1):
        undecided: dict[str, list[str]] = {}
        for suite, case in decision.undecided(comparisons, reachable=(rnd - 1, req.max_rounds), only=only):
            undecided.setdefault(suite, []).append(case)
        if not undecided:
            return None
        round_jobs: list[tuple[str, GateJob, GateJob]] = []
        for suite, names in undecided.items():
            head = next(h for s_, h, _ in pairs if s_ == suite)
            base = next(b for s_, _, b in pairs if s_ == suite)
            b, h = _measure_pair(engine, req, state, submit, kind, suite, base, head, names, f":r{rnd}")
            round_jobs.append((suite, h, b))
        waiting = f"re-measuring {sum(map(len, undecided.values()))} {what}, round {rnd}"
        jobs = [j for _, h, b in round_jobs for j in (b, h)]
        unsettled = _unsettled(engine, state, jobs, "could not run a re-measurement", waiting)
        if unsettled is not None:
            return unsettled
        state.rounds += 1
        for suite, h, b in round_jobs:
            pools[suite][0].append(b.job_id)
            pools[suite][1].append(h.job_id)
        with Session(engine) as s:
            comparisons[:] = [compare_pooled(s, *pools[suite]) for suite, _, _ in pairs]
    return None


def _measure_pair(
    engine: Any, req: GateRequest, state: GateState, submit: SubmitFn, kind: Literal["round", "confirm"],
    suite: str, base: GateJob, head: GateJob, cases: Sequence[str], key_extra: str = "",
) -> tuple[GateJob, GateJob]:
    """A fresh base job, then a fresh head job (queued in that order, so on a shared device they
    interleave with the other pairs), of just `cases`, in the setting of the first pair."""
    extra = f"{key_extra}:{head.job_id}:{base.job_id}"
    roles: tuple[Role, Role] = ("round-base", "round-head")
    if kind == "confirm":
        roles = ("confirm-base", "confirm")
    b = _ensure_job(engine, req, suite, roles[0], base.commit or state.base or "", submit,
                    key_extra=extra, cases=cases, like=base)
    h = _ensure_job(engine, req, suite, roles[1], req.head, submit, key_extra=extra, cases=cases, like=head)
    assert b is not None and h is not None  # only a job that takes cases waits (`takes_from`)
    state.jobs += [b, h]
    return b, h


def _unsettled(
    engine: Any, state: GateState, jobs: Sequence[GateJob], broken_why: str, waiting_why: str
) -> GateState | None:
    """Exit 2 naming the jobs that failed or were cancelled; the waiting state while any other
    has not succeeded; None once all have."""
    broken = [j for j in jobs if j.status in ("failed", "cancelled")]
    if broken:
        why = "; ".join(f"{j.role} job {j.job_id} ({j.suite}) {j.status}: {_tail(j.error)}" for j in broken)
        return _give_up(engine, state, f"{broken_why}: {why}")
    if any(j.status != "succeeded" for j in jobs):
        state.reason = waiting_why
        return state
    return None


def _give_up(engine: Any, state: GateState, reason: str) -> GateState:
    """Exit 2; the jobs this gate queued that have not ended are cancelled (reused ones stay)."""
    cancelled = []
    for j in state.jobs:
        if not j.reused and j.status in ("queued", "running"):
            try:
                queue.cancel(engine, j.job_id)
                cancelled.append(j.job_id)
            except (queue.JobNotFound, queue.JobConflict):
                continue  # ended meanwhile
    if cancelled:
        reason = f"{reason} (cancelled the gate's pending job(s) {cancelled})"
    return _done(state, EXIT_INFRA, "error", reason)


def _jobs(
    engine: Any, req: GateRequest, suites: Sequence[str], base: Any, state: GateState, submit: SubmitFn
) -> list[tuple[str, GateJob, GateJob]] | None:
    """Find or submit the head and base job of every suite (None: the state is already done)."""
    pairs: list[tuple[str, GateJob, GateJob]] = []
    bases_first: list[GateJob] = []  # base jobs whose head job waits to take their reference cases
    for suite in suites:
        if base.kind != "job" and _takes_reference_cases(req):
            base_job = _ensure_job(engine, req, suite, "base", base.value, submit)
            head = _ensure_job(engine, req, suite, "head", req.head, submit, takes_from=base_job)
            if head is None:
                bases_first.append(base_job)
                continue
            state.jobs += [head, base_job]
            pairs.append((suite, head, base_job))
            continue
        head_job = _ensure_job(engine, req, suite, "head", req.head, submit)
        assert head_job is not None
        if base.kind == "job":
            base_job = _existing_job(engine, int(base.value), "base")
            if base_job is None:
                _give_up(engine, state, f"base job {base.value} does not exist")
                return None
            if base_job.suite != suite:
                raise GateInputError(
                    f"base job {base.value} ran suite {base_job.suite!r}, expected {suite!r}"
                )
        else:
            base_job = _ensure_job(engine, req, suite, "base", base.value, submit)
        state.jobs += [head_job, base_job]
        pairs.append((suite, head_job, base_job))
    if bases_first:
        state.jobs += bases_first
        ids = [j.job_id for j in bases_first]
        waiting = (f"waiting for base job(s) {ids}: the head's jobs take their {REFERENCE} cases (the "
                   "backend alone changed), so they start once those ended")
        if _unsettled(engine, state, bases_first, "could not run", waiting) is None:
            state.reason = waiting  # succeeded meanwhile: the next step submits the head's jobs
        return None
    return pairs


def _takes_reference_cases(req: GateRequest) -> bool:
    """Whether the head's jobs may take the base jobs' cases of our reference backends: a gate of
    a backend's own repository (our code the same on both sides) that may reuse measurements."""
    return bool(req.backend_repo) and req.reuse


def _reference_labels(engine: Any, req: GateRequest, suite: str, base: GateJob) -> tuple[dict[str, str], str]:
    """The labels that make the head's job of `suite` take the cases of the backends the
    succeeded base job ran byte for byte as the head will (`CodeUnderTest.shared_backends`),
    or no labels and why its job measures every case."""
    from sqlalchemy.orm import Session

    with Session(engine) as s:
        job = job_record(s, base.job_id)
    code = code_under_test(suite, req.head, req.backend_repo, req.backend)
    if code is None or job is None:
        return {}, (f"the code under test of {req.head[:12]} cannot be worked out here to match with base "
                    f"job {base.job_id}")
    shared = code.shared_backends(job.info or {})
    if not shared:
        return {}, f"base job {base.job_id} ran none of our backends with our code as it is now"
    return take_labels(base.job_id, shared), ""


def _note(engine: Any, job_id: int, message: str) -> None:
    """A line in a job's log (what the gate decided about it)."""
    from service.persistence.db import write_tx
    from service.persistence.jobs import add_event

    with write_tx(engine) as s:
        add_event(s, job_id, "log", message)


def _done(state: GateState, code: int, verdict: GateVerdict, reason: str) -> GateState:
    state.phase, state.exit_code, state.verdict, state.reason = "done", code, verdict, reason
    return state


def _tail(text: str | None) -> str:
    if not text:
        return "no reason recorded"
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no reason recorded"


def _existing_job(engine: Any, job_id: int, role: Role) -> GateJob | None:
    from sqlalchemy.orm import Session

    with Session(engine) as s:
        job = job_record(s, job_id)
        return _job_view(job, role, True) if job is not None else None


def _same_backend_repo(job: JobRecord, repo: str | None) -> bool:
    """Whether a job's backend comes from `repo` (None: the job runs no backend from elsewhere)."""
    return queue.job_backend_repo(job) == repo


def _ensure_job(
    engine: Any,
    req: GateRequest,
    suite: str,
    role: Role,
    commit: str,
    submit: SubmitFn,
    key_extra: str = "",
    cases: Sequence[str] | None = None,
    like: GateJob | None = None,
    takes_from: GateJob | None = None,
) -> GateJob | None:
    """This gate's job for (suite, role): its own keyed job if submitted before, else (head and
    base only) the newest succeeded or in-flight job of the commit with the same setting, or the
    newest succeeded one of a commit whose code under test is byte-identical
    (`service.domain.same_code`), else a new one. `cases`: run only these (re-measurements);
    `like`: the job whose setting it repeats; `takes_from`: the base job whose cases of the
    backends it shares byte for byte a new job takes (None is returned until that job succeeded)."""
    from sqlalchemy.orm import Session

    preset = preset_for(req, suite)
    key = f"gate:{req.key()}:{role}:{suite}:{commit}{key_extra}"[:200]
    with Session(engine) as s:
        own = job_by_idempotency_key(s, key)
        if own is not None:
            return _job_view(own, role, False)
        if role in ("head", "base") and req.reuse:
            for statuses in (("succeeded",), ("running", "queued")):
                found = find_commit_job(
                    s, commit, suite, preset=preset, device=req.device, world_size=req.world_size,
                    params=params_for(req, suite), statuses=statuses, backend=bool(req.backend_repo),
                )
                if found is not None and _same_backend_repo(found, req.backend_repo):
                    return _job_view(found, role, True)
            same = identical_job(s, suite, commit, preset=preset, device=req.device,
                                 world_size=req.world_size, params=params_for(req, suite),
                                 backend_repo=req.backend_repo, backend=req.backend)
            if same is not None:  # another commit's job ran this commit's code, byte for byte
                return _job_view(same, role, True)
        if like is not None:
            template = job_record(s, like.job_id)
            preset = template.preset if template is not None else preset
    if takes_from is not None and takes_from.status != "succeeded":
        return None
    extra: dict[str, Any] = {"cases": list(cases)} if cases else {}
    labels = {"gate": req.key(), "role": role}
    why_not = ""
    if takes_from is not None:
        taking, why_not = _reference_labels(engine, req, suite, takes_from)
        labels.update(taking)
    if req.backend_repo:  # the commits are the backend's: installed per job, our code as it is
        labels[BACKEND_SOURCE_LABEL] = f"git+{req.backend_repo}@{commit}"
    job_id = submit(
        suite=suite,
        preset=preset,
        params=params_for(req, suite),
        commit=None if req.backend_repo else commit,
        device=req.device,
        world_size=req.world_size,
        idempotency_key=key,
        labels=labels,
        **extra,
    )
    if why_not:
        _note(engine, job_id, f"measures its {REFERENCE} cases itself, none taken from the base's: {why_not}")
    with Session(engine) as s:
        job = job_record(s, job_id)
    if job is None:
        raise CannotRun(f"job {job_id} was submitted but is not in the store")
    return _job_view(job, role, False)


def _confirm(
    engine: Any,
    req: GateRequest,
    state: GateState,
    pairs: Sequence[tuple[str, GateJob, GateJob]],
    submit: SubmitFn,
) -> GateState | None:
    """Measure the cases with time regressions again, a fresh base job then a fresh head job
    (new processes on both sides: an offset of one process's timings cannot repeat), give that
    pair the rounds an undecided change gets (pooled with the pair only: the first run is what is
    in question), and settle each regression by the pair's verdict (`confirmation_outcome`).
    Returns a waiting/error state while re-runs are pending or broken, else None."""
    from sqlalchemy.orm import Session

    reruns: list[tuple[int, GateJob, GateJob]] = []
    for i, (suite, head, base) in enumerate(pairs):
        regressed = state.comparisons[i].time_regressions()
        if not regressed:
            continue
        names = list(dict.fromkeys(c.name for c, _ in regressed))
        b, h = _measure_pair(engine, req, state, submit, "confirm", suite, base, head, names)
        reruns.append((i, b, h))
    jobs = [j for _, b, h in reruns for j in (b, h)]
    waiting = "re-measuring time regressions on both sides to confirm them"
    unsettled = _unsettled(engine, state, jobs, "could not run", waiting)
    if unsettled is not None:
        return unsettled
    confirm_pairs = [(pairs[i][0], h, b) for i, b, h in reruns]
    with Session(engine) as s:
        again = [compare_jobs(s, b.job_id, h.job_id) for _, h, b in confirm_pairs]
    questioned = {(pairs[i][0], c.fingerprint, m.metric)
                  for i, _, _ in reruns for c, m in state.comparisons[i].time_regressions()}
    rounds_before = state.rounds
    waiting_round = _measure_again(engine, req, state, confirm_pairs, again, submit, "confirm", questioned)
    if waiting_round is not None:
        return waiting_round
    extra_rounds = state.rounds - rounds_before
    pooled_note = f"; the pair pooled with {extra_rounds} round(s)" if extra_rounds else ""
    for (i, _, head_job), pooled in zip(reruns, again, strict=True):
        first = state.comparisons[i]
        again_by = {(c.fingerprint, m.metric): m for c in pooled.cases for m in c.metrics}
        for case, metric in first.time_regressions():
            rerun = again_by.get((case.fingerprint, metric.metric))
            conf = decision.Confirmation(
                first.suite, case.name, case.fingerprint, metric.metric, metric.reason, head_job.job_id,
                rerun.verdict if rerun else "removed",
                (rerun.reason if rerun else "not measured by the re-run") + pooled_note,
            )
            state.confirmations.append(conf)
            if not conf.confirmed:
                decision.unconfirm(case, metric, conf)
    return None

