"""`gdnval find --good A --bad B`: the first commit between A and B that regressed, found by
bisecting the first-parent range with the gate's judgment (`service.domain.find`) on a running
service; exit 1 a first bad commit found, 0 no regression between the two, 2 could not decide or
could not run, 3 gave up waiting (`service.domain.exit_codes`).

The CLI resolves both refs and lists the first-parent commits after A up to B in the local
repository (`--repo`, or `--backend-repo` for a backend's commits), so the service needs no
checkout, then steps `POST /api/v1/find` until the find is done. The gate options (`--suite`,
`--preset`, `--param`, `--device`, ...) are `gdnval gate`'s: every step is such a gate.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import click

from service.cli.client import fail
from service.cli.gate import (
    EXIT_INFRA,
    check_repo,
    judgment_body,
    judgment_options,
    resolve_ref,
    step_until_done,
)


@click.command()
@click.option("--good", required=True, help="a commit without the regression (sha or ref, in --repo)")
@click.option("--bad", required=True, help="a later commit with it, on the good one's first-parent line")
@judgment_options
def find(
    good: str, bad: str, suites: tuple[str, ...], preset: str | None, param_items: tuple[str, ...],
    max_rounds: int, device: str, world_size: int, confirm: bool | None, repo: str,
    backend_repo: str | None, backend: str | None, json_path: Path | None, timeout: float, poll: float,
    server: str, token: str | None,
) -> None:
    """Bisect GOOD..BAD with the gate and print the first bad commit with the metrics that moved."""
    from service.domain.commit_range import RangeError, first_parent

    repo = backend_repo or repo
    check_repo(repo)
    good_sha, bad_sha = resolve_ref(repo, good, "good"), resolve_ref(repo, bad, "bad")
    try:
        commits = first_parent(repo, bad_sha, since=good_sha)
    except (RangeError, ValueError) as exc:
        fail(f"--good {good} .. --bad {bad}: {exc}")
    if not commits:
        fail(f"--bad {bad} is --good {good}: nothing to bisect")
    gate = {"head": bad_sha, "base": good_sha,
            **judgment_body(suites, preset, param_items, device, world_size, confirm, max_rounds,
                            backend_repo, backend, bad_sha)}
    body: dict[str, Any] = {"gate": gate, "commits": commits, "run_id": uuid.uuid4().hex[:16]}
    state = step_until_done(server, token, "/api/v1/find", body, timeout, poll,
                            {"good": good_sha, "bad": bad_sha, "commits": commits, "steps": []})
    click.echo(state.get("markdown") or f"find: {state.get('reason')}")
    if state.get("first_bad"):
        click.echo(f"first bad commit: {state['first_bad']} {_subject(repo, state['first_bad'])}")
    if json_path is not None:
        json_path.write_text(json.dumps(state, indent=1, allow_nan=False))
    raise SystemExit(int(state["exit_code"] if state.get("exit_code") is not None else EXIT_INFRA))


def _subject(repo: str, sha: str) -> str:
    """The commit's subject line, as the repository has it (empty when git cannot say)."""
    try:
        out = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%s", sha], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""
