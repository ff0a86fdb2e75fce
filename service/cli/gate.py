"""`gdnval gate --head REF`: gate a commit on a running service; exit 0 pass, 1 fail, 2 could not run
or could not decide, 3 gave up waiting (`service.domain.exit_codes`).

The CLI resolves refs to full shas in the local repository (`--repo`, default: the current
directory) so the service needs no checkout, then steps `POST /api/v1/gate` until the gate is
done, drawing one progress bar per job. The Markdown report goes to stdout, the machine-readable
verdict to `--json FILE`.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import click

from service.cli.client import fail, server_option, token_option
from service.domain import exit_codes

EXIT_INFRA = exit_codes.COULD_NOT_RUN
# One step may build a backend commit's package to learn whether its code was measured already
# (service.domain.same_code): longer than a plain request may take.
STEP_TIMEOUT_S = 900.0


def check_repo(repo: str) -> None:
    """`repo` must be a git repository this process can read: refs are resolved there (one line
    and exit 2 otherwise, before the service is contacted)."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", repo, "rev-parse", "--git-dir"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        fail(f"cannot read the git repository {repo!r}: {exc}")
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or ["not a git repository"])[-1]
        fail(f"cannot read the git repository {repo!r}: {why}")


def resolve_ref(repo: str, ref: str, what: str) -> str:
    """The full sha of commit `ref` in `repo` ('job:N' stays as it is); a ref that breaks the
    ref rule or names no commit there is refused."""
    from service.domain.baselines import git_rev_parse, parse_job_ref

    if parse_job_ref(ref) is not None:
        return ref
    try:
        sha = git_rev_parse(repo, ref)
    except ValueError as exc:  # workers.refs: blank, option-like, malformed
        fail(f"--{what}: {exc}")
    if sha is None:
        fail(f"--{what} {ref!r} is not a commit of the repository {repo!r}")
    return sha


def judgment_options(command: Any) -> Any:
    """The options that say what a gate judges and how it talks to the service: `gdnval gate`
    and `gdnval find` (a sequence of gates) take them alike."""
    options = [
        click.option("--suite", "suites", multiple=True,
                     help="suite to gate (repeat); default: every suite that runs on --device at "
                          "--world-size"),
        click.option("--preset", default=None,
                     help="default: each suite's gate preset (gate; gate-cpu on cpu)"),
        click.option("--param", "param_items", multiple=True, metavar="KEY=VALUE",
                     help="override a suite parameter in every gated suite; VALUE is JSON or a bare string"),
        click.option("--max-rounds", default=3, show_default=True, type=click.IntRange(0, 20),
                     help="re-measurement rounds for time changes beyond the minimum effect but not "
                          "significant"),
        click.option("--device", default="cpu", show_default=True, type=click.Choice(["cuda", "npu", "cpu"])),
        click.option("--world-size", default=1, show_default=True, type=click.IntRange(1)),
        click.option("--confirm/--no-confirm", default=None,
                     help="re-measure time regressions on both sides and fail only on confirmed ones; one "
                          "the re-run neither confirms nor clears is exit 2 [default: on for --device cpu]"),
        click.option("--repo", default=".", show_default=True,
                     help="git repository that resolves refs and the parent"),
        click.option("--backend-repo", default=None,
                     help="a backend's commits: the refs are commits of this repository (resolved there), "
                          "installed per job as its backend source"),
        click.option("--backend", "backend", default=None,
                     help="with --backend-repo: the entry point (group gdnval.backends) under test; "
                          "default: the package's only one"),
        click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="write the machine-readable verdict here"),
        click.option("--timeout", default=6 * 3600.0, show_default=True, type=float,
                     help="seconds before giving up (exit 3)"),
        click.option("--poll", default=1.0, show_default=True, type=float, help="seconds between steps"),
        server_option,
        token_option,
    ]
    for option in reversed(options):
        command = option(command)
    return command


def judgment_body(
    suites: tuple[str, ...], preset: str | None, param_items: tuple[str, ...], device: str, world_size: int,
    confirm: bool | None, max_rounds: int, backend_repo: str | None, backend: str | None, head_sha: str,
) -> dict[str, Any]:
    """The gate request's fields that say what is judged (all but head, base, reuse, run id)."""
    from service.cli.run import parse_params

    body: dict[str, Any] = {
        "suites": list(suites), "preset": preset, "device": device, "world_size": world_size,
        "params": parse_params(param_items), "confirm": confirm, "max_rounds": max_rounds,
    }
    if backend_repo:
        body["backend_repo"] = backend_repo
        body["backend"] = backend or _only_backend(backend_repo, head_sha)
    elif backend:
        raise click.UsageError(f"--backend {backend!r} names the backend of --backend-repo; give that too")
    return body


@click.command()
@click.option("--head", required=True, help="the commit to gate (sha or ref, resolved in --repo)")
@click.option(
    "--base", default=None, help="compare with this commit (or 'job:N'); default: the head's parent"
)
@click.option("--baseline", default=None, help="compare with this named baseline of the store")
@click.option("--fresh", is_flag=True,
              help="measure anew: never reuse a commit's earlier job (e.g. a commit against itself)")
@judgment_options
def gate(
    head: str, base: str | None, baseline: str | None, fresh: bool, suites: tuple[str, ...],
    preset: str | None, param_items: tuple[str, ...], max_rounds: int, device: str, world_size: int,
    confirm: bool | None, repo: str, backend_repo: str | None, backend: str | None,
    json_path: Path | None, timeout: float, poll: float, server: str, token: str | None,
) -> None:
    """Run or reuse jobs for HEAD and its base, compare them, print the Markdown report."""
    repo = backend_repo or repo
    if base and baseline:
        raise click.UsageError(f"give --base ({base!r}) or --baseline ({baseline!r}), not both")
    check_repo(repo)
    head_sha = resolve_ref(repo, head, "head")
    base_ref = resolve_ref(repo, base, "base") if base else None
    if not base and not baseline:
        from service.domain.baselines import git_rev_parse

        base_ref = git_rev_parse(repo, f"{head_sha}^")  # None: the service tries the parent it recorded
    if base_ref == head_sha and not fresh:
        fail(f"--base is --head ({head_sha[:12]}): a commit against its own job compares that job "
                      "with itself; add --fresh to measure it anew, or name another base")
    body: dict[str, Any] = {
        "head": head_sha, "base": base_ref, "baseline": baseline, "reuse": not fresh,
        "run_id": uuid.uuid4().hex[:16],
        **judgment_body(suites, preset, param_items, device, world_size, confirm, max_rounds, backend_repo,
                        backend, head_sha),
    }
    infra = {"head": body["head"], "base": body.get("base"), "base_source": "", "jobs": [],
             "confirmations": [], "comparisons": []}
    state = step_until_done(server, token, "/api/v1/gate", body, timeout, poll, infra)
    if state.get("markdown"):
        click.echo(state["markdown"])
    else:
        click.echo(f"gate: {state.get('reason')}")
    if json_path is not None:
        json_path.write_text(json.dumps(state, indent=1, allow_nan=False))
    raise SystemExit(int(state.get("exit_code") if state.get("exit_code") is not None else EXIT_INFRA))


def _only_backend(repo: str, commit: str) -> str:
    """The one `gdnval.backends` entry point the package at `commit` declares; exit 2 otherwise."""
    from workers.backend_source import ENTRY_POINT_GROUP, BackendSourceError, entry_point_names

    try:
        names = entry_point_names(repo, commit)
    except BackendSourceError as exc:
        click.echo(f"gate: could not run: {exc}", err=True)
        raise SystemExit(EXIT_INFRA) from exc
    if len(names) == 1:
        return names[0]
    why = (f"declares the entry points {names}; name one with --backend" if names else
           f"declares no entry point of the group {ENTRY_POINT_GROUP!r} in its pyproject.toml; name the "
           "backend with --backend")
    click.echo(f"gate: could not run: the package of {repo} at {commit[:12]} {why}", err=True)
    raise SystemExit(EXIT_INFRA)


def _infra(reason: str, what: str, extra: dict[str, Any], code: int = EXIT_INFRA) -> dict[str, Any]:
    """A verdict made on this side: could not run (server down, refused request), or no verdict
    yet (gave up waiting, exit 3)."""
    title = "COULD NOT RUN" if code == EXIT_INFRA else "NO VERDICT YET"
    return {
        **extra, "phase": "done", "exit_code": code, "verdict": "error", "reason": reason,
        "markdown": f"## gdnval {what}: ⚠️ {title} (exit {code})\n\n- {reason}\n",
    }


def step_until_done(
    server: str, token: str | None, path: str, body: dict[str, Any], timeout: float, poll: float,
    infra: dict[str, Any],
) -> dict[str, Any]:
    """POST `body` to the state machine at `path` (a gate's, a find's) until its phase is done,
    drawing one progress bar per job of the answer; `infra`: the answer's fields when this side
    has to answer instead (service down, request refused, gave up waiting)."""
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from service.cli.client import client

    what = path.rsplit("/", 1)[-1]
    start = time.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[message]}"))
    tasks: dict[int, Any] = {}
    busy = 0
    with client(server, token) as http, Progress(*columns, console=Console(stderr=True)) as bar:
        while True:
            try:
                resp = http.post(path, json=body, timeout=STEP_TIMEOUT_S)
            except httpx.HTTPError as exc:
                return _infra(f"could not run: the service at {server} is unreachable ({exc})", what, infra)
            if resp.status_code == 503 and busy < 10:  # the store is busy: retry a few times
                busy += 1
                time.sleep(poll)
                continue
            if resp.status_code >= 300:
                try:
                    detail = resp.json().get("detail")
                except (ValueError, AttributeError):
                    detail = resp.text
                return _infra(f"could not run: the service refused the {what} ({resp.status_code}): {detail}",
                              what, infra)
            busy = 0
            state = resp.json()
            for j in state.get("jobs", []):
                key = j["job_id"]
                desc = f"{j['role']:<7} {j['suite']} #{key} {j['status']}"
                total = j["progress_total"] or None
                if key not in tasks:
                    tasks[key] = bar.add_task(desc, total=total, message="")
                bar.update(tasks[key], description=desc, completed=j["progress_done"], total=total,
                           message=(j.get("message") or "")[:50])
            if state["phase"] == "done":
                return state
            if time.monotonic() - start > timeout:
                return _infra(f"gave up waiting after {timeout:g} s ({state.get('reason')})", what, infra,
                              exit_codes.NO_VERDICT_YET)
            time.sleep(poll)
