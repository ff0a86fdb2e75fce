"""`gdnval submit SUITE`: queue a job on a running service and optionally wait for it."""

from __future__ import annotations

import time
from typing import Any

import click

from service.cli.client import connected, fail_on_error, parse_pairs, server_option, token_option
from service.domain import exit_codes

FINAL = ("succeeded", "failed", "cancelled")


@click.command()
@click.argument("suite")
@click.option("--preset", default="quick", show_default=True)
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cuda", "npu", "cpu"]))
@click.option("--world-size", default=1, show_default=True, type=click.IntRange(1))
@click.option("--commit", default=None, help="sha (7-40 hex) or ref; default: the service's installed code")
@click.option("--param", "params", multiple=True, metavar="K=V", help="parameter override (JSON value)")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="free-form label")
@click.option("--priority", default=0, show_default=True, type=int)
@click.option("--idempotency-key", default=None, help="resubmitting with the same key returns the same job")
@click.option(
    "--wait", is_flag=True,
    help="wait for the job with a progress bar; exit by its verdict: 0 passed, 1 a case failed or errored, "
         "2 the job could not run",
)
@click.option("--timeout", default=None, type=float, help="give up waiting after this many seconds (exit 3)")
@server_option
@token_option
def submit(
    suite: str, preset: str, device: str, world_size: int, commit: str | None, params: tuple[str, ...],
    labels: tuple[str, ...], priority: int, idempotency_key: str | None, wait: bool, timeout: float | None,
    server: str, token: str | None,
) -> None:
    """Submit SUITE to the service; prints the job id (and, with --wait, its outcome)."""
    body: dict[str, Any] = {
        "suite": suite, "preset": preset, "device": device, "world_size": world_size,
        "params": parse_pairs(params, "--param", as_json=True),
        "labels": parse_pairs(labels, "--label", as_json=False), "priority": priority,
    }
    if commit:
        body["commit"] = commit
    if idempotency_key:
        body["idempotency_key"] = idempotency_key
    with connected(server, token) as http:
        job = fail_on_error(http.post("/api/v1/jobs", json=body))
        click.echo(f"job {job['id']} {job['status']} ({server.rstrip('/')}/jobs/{job['id']})")
        if not wait:
            return
        job = _wait(http, job, timeout)
    code = exit_codes.for_job(job)
    counts = ", ".join(f"{n} {s}" for s, n in (job.get("case_counts") or {}).items() if n) or "no cases"
    ran = "" if job["status"] == "succeeded" else f"; job {job['status']}"
    error = f": {job['error']}" if job.get("error") else ""
    click.echo(f"job {job['id']}: verdict {job.get('verdict') or 'none'} ({counts}){ran}{error}; exit {code}")
    raise SystemExit(code)


def _wait(http: Any, job: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.monotonic()
    columns = (TextColumn("job {task.fields[job]} {task.fields[status]}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[message]}"))
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("job", total=None, job=job["id"], status=job["status"], message="")
        while job["status"] not in FINAL:
            if timeout is not None and time.monotonic() - start > timeout:
                bar.stop()
                click.echo(f"gave up after {timeout:g} s; job {job['id']} is {job['status']}", err=True)
                raise SystemExit(exit_codes.NO_VERDICT_YET)
            time.sleep(0.5)
            job = fail_on_error(http.get(f"/api/v1/jobs/{job['id']}"))
            p = job["progress"]
            bar.update(task, completed=p["done"], total=p["total"] or None, status=job["status"],
                       message=p["message"][:60])
        p = job["progress"]
        bar.update(task, completed=p["done"], total=p["total"] or None, status=job["status"])
    return job
