"""The exit codes of every command, one table (README's "Exit codes"), and the one mapping from
a job's or a campaign's outcome to a code, so `run`, `submit --wait`, `campaign` and `gate` agree:

- 0 passed: every case passed (or raised its expected error); a gate found no regression;
- 1 failed: a case failed or errored, a metric regressed or worsened;
- 2 could not run or could not decide: bad input, no service, a job that did not run to its end,
  an undecided gate;
- 3 no verdict yet: gave up waiting (`--timeout`), or the work is still running.
"""

from __future__ import annotations

from collections.abc import Mapping

PASSED = 0
FAILED = 1
COULD_NOT_RUN = 2
NO_VERDICT_YET = 3

MEANING: dict[int, str] = {
    PASSED: "passed",
    FAILED: "failed",
    COULD_NOT_RUN: "could not run or could not decide",
    NO_VERDICT_YET: "no verdict yet",
}


def for_verdict(verdict: str | None, counts: Mapping[str, int] | None = None, *, ran: bool = True) -> int:
    """A job's (or a campaign's) code from its verdict (`workers.verdict.job_verdict`): `errored`
    is the code under test (1) when every case ran and one errored, and could-not-run (2) when
    cases were left unrun or the job did not run to its end; no verdict is 3."""
    if verdict is None:
        return NO_VERDICT_YET
    if not ran:
        return COULD_NOT_RUN
    if verdict == "passed":
        return PASSED
    if verdict == "failed":
        return FAILED
    if verdict == "errored" and not (counts or {}).get("not_run"):
        return FAILED
    return COULD_NOT_RUN


def for_campaign(campaign: Mapping[str, object]) -> int:
    """An API campaign: no verdict while a job runs (3); else a job that failed its code (1)
    outweighs one that could not run (2), which outweighs passing ones."""
    jobs = campaign.get("jobs")
    if campaign.get("verdict") is None:
        return NO_VERDICT_YET
    if not isinstance(jobs, list) or not jobs:
        return for_verdict(str(campaign.get("verdict")))
    codes = {for_job(j.get("job", j)) for j in jobs if isinstance(j, Mapping)}
    for code in (NO_VERDICT_YET, FAILED, COULD_NOT_RUN):
        if code in codes:
            return code
    return PASSED


def for_job(job: Mapping[str, object]) -> int:
    """An API job (`status`, `verdict`, `case_counts`): a job that did not succeed could not run."""
    status = job.get("status")
    if status in ("queued", "running"):
        return NO_VERDICT_YET
    if status != "succeeded":  # failed or cancelled: it did not run to its end
        return COULD_NOT_RUN
    counts = job.get("case_counts")
    verdict = job.get("verdict")
    return for_verdict(verdict if isinstance(verdict, str) else None,
                       counts if isinstance(counts, Mapping) else None, ran=status == "succeeded")
