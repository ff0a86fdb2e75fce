"""`gdnval campaign submit|show|report`: a plan's jobs as one campaign on a running service."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from service.cli.client import connected, fail, fail_on_error, server_option, token_option
from service.domain import exit_codes

FINAL = ("succeeded", "failed", "cancelled")


def _sizes(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 4,8, got {value!r}") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"expected world sizes >= 1 like 4,8, got {value!r}")
    return sizes


@click.group()
def campaign() -> None:
    """Run a plan (the jobs one report needs) as one campaign, show it, print its report."""


@campaign.command()
@click.option("--plan", required=True, help="plan name (workers/plans), e.g. pr-report or pr-report-cpu")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cuda", "npu", "cpu"]))
@click.option("--world-sizes", default=None, help="comma-separated CP sizes, e.g. 4,8 (default: the plan's)")
@click.option("--commit", default=None, help="sha (7-40 hex) or ref; default: the service's installed code")
@click.option("--backends", default=None, help="comma-separated peer backends beside the one under test")
@click.option("--backend-source", default=None, metavar="SRC",
              help="install the --backends from here for the jobs that run them: git+<repo>@<commit> or a "
                   "pip requirement (the job label backend_source)")
@click.option("--priority", default=0, show_default=True, type=int)
@click.option("--idempotency-key", default=None, help="the same key returns the same campaign")
@click.option("--wait", is_flag=True,
              help="wait with progress per job; exit by the campaign's verdict (README's exit-code table)")
@click.option("--timeout", default=None, type=float, help="give up waiting after this many seconds (exit 3)")
@server_option
@token_option
def submit(
    plan: str, device: str, world_sizes: str | None, commit: str | None, backends: str | None,
    backend_source: str | None, priority: int, idempotency_key: str | None, wait: bool, timeout: float | None,
    server: str, token: str | None,
) -> None:
    """Queue every job of PLAN as one campaign; prints its id (and, with --wait, its verdict)."""
    body: dict[str, Any] = {"plan": plan, "device": device, "priority": priority}
    sizes = _sizes(world_sizes)
    if sizes:
        body["world_sizes"] = sizes
    if commit:
        body["commit"] = commit
    if backends:
        body["backends"] = [b.strip() for b in backends.split(",") if b.strip()]
    if backend_source:
        body["backend_source"] = backend_source
    if idempotency_key:
        body["idempotency_key"] = idempotency_key
    base = server.rstrip("/")
    with connected(server, token) as http:
        c = fail_on_error(http.post("/api/v1/campaigns", json=body))
        click.echo(f"campaign {c['id']} {c['status']}: {c['total']} jobs ({base}/campaigns/{c['id']})")
        if not wait:
            return
        c = _wait(http, c["id"], timeout)
        _print(c, base)
    raise SystemExit(exit_codes.for_campaign(c))


def _wait(http: Any, campaign_id: int, timeout: float | None) -> dict[str, Any]:
    """Poll the campaign until every job ended: on a terminal one progress bar per job and one for
    the campaign; elsewhere (a log, CI) one line whenever a job's status changes."""
    import sys

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.monotonic()
    columns = (TextColumn("{task.description:<16} {task.fields[status]:<10}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    live = sys.stdout.isatty()
    seen: dict[str, str] = {}
    with Progress(*columns, transient=False, disable=not live) as bar:
        c = fail_on_error(http.get(f"/api/v1/campaigns/{campaign_id}"))
        whole = bar.add_task(f"campaign {campaign_id}", total=c["total"], status=c["status"])
        tasks = {j["key"]: bar.add_task(j["key"], total=None, status=j["job"]["status"]) for j in c["jobs"]}
        while True:
            for j in c["jobs"]:
                job, p = j["job"], j["job"]["progress"]
                status = (job["verdict"] or job["status"]) if job["status"] in FINAL else job["status"]
                bar.update(tasks[j["key"]], completed=p["done"], total=p["total"] or None, status=status)
                if not live and seen.get(j["key"]) != status:
                    seen[j["key"]] = status
                    click.echo(f"[{time.monotonic() - start:6.0f} s] {c['done']}/{c['total']} jobs ended; "
                               f"{j['key']} (job {job['id']}): {status}")
            bar.update(whole, completed=c["done"], status=c["status"])
            if c["done"] == c["total"]:
                return c
            if timeout is not None and time.monotonic() - start > timeout:
                bar.stop()
                click.echo(f"gave up after {timeout:g} s; campaign {campaign_id} is {c['status']}", err=True)
                raise SystemExit(exit_codes.NO_VERDICT_YET)
            time.sleep(1.0)
            c = fail_on_error(http.get(f"/api/v1/campaigns/{campaign_id}"))


def _print(c: dict[str, Any], base: str) -> None:
    click.echo(f"campaign {c['id']}: plan {c['plan']} v{c['plan_version']} on {c['device']} at world sizes "
               f"{','.join(map(str, c['world_sizes']))}; {c['status']}, verdict {c['verdict'] or 'pending'} "
               f"({c['done']}/{c['total']} jobs ended)")
    for j in c.get("jobs", []):
        job = j["job"]
        p = job["progress"]
        counts = ", ".join(f"{n} {s}" for s, n in sorted((job.get("case_counts") or {}).items()) if n)
        cases = f"{p['done']}/{p['total']} cases" + (f" ({counts})" if counts else "")
        click.echo(f"  {j['key']:<16} job {job['id']:<5} {job['status']:<10} {job['verdict'] or '-':<8} "
                   f"{cases}  {base}/jobs/{job['id']}")


@campaign.command()
@click.argument("campaign_id", type=click.IntRange(1))
@server_option
@token_option
def show(campaign_id: int, server: str, token: str | None) -> None:
    """Progress and verdict of every job of a campaign; exit by its verdict, 3 while it runs."""
    with connected(server, token) as http:
        c = fail_on_error(http.get(f"/api/v1/campaigns/{campaign_id}"))
    _print(c, server.rstrip("/"))
    raise SystemExit(exit_codes.for_campaign(c))


@campaign.command()
@click.argument("campaign_id", type=click.IntRange(1))
@click.option("--base", "base_id", default=None, type=click.IntRange(1), help="a campaign to compare with")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the Markdown here instead of stdout")
@server_option
@token_option
def report(campaign_id: int, base_id: int | None, out: Path | None, server: str, token: str | None) -> None:
    """The campaign's report as Markdown (compared with campaign --base when given)."""
    params = {"base": base_id} if base_id else {}
    with connected(server, token) as http:
        resp = http.get(f"/api/v1/campaigns/{campaign_id}/report.md", params=params)
        if resp.status_code >= 300:
            fail_on_error(resp)
    if out is None:
        click.echo(resp.text, nl=False)
        return
    try:
        out.write_text(resp.text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {out}: {exc}")
    click.echo(f"wrote {out} ({len(resp.text.splitlines())} lines)")
