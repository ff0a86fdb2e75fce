"""`gdnval gates`: list the service's stored gates (newest first), narrowed by head, base,
backend and verdict, each with its jobs; `--finds` lists the finds instead (head: the bad
commit, base: the good one), each with its first bad commit and steps."""

from __future__ import annotations

import click

from service.cli.client import connected, fail_on_error, server_option, token_option
from service.cli.gate import resolve_ref
from service.cli.output import console, dumps
from workers.refs import HEX_SHA


def commit_filter(repo: str, ref: str | None, what: str) -> str | None:
    """A hex sha prefix as it is; any other ref resolved to its full sha in `repo` (one line and
    exit 2 when it names no commit there)."""
    if ref is None or HEX_SHA.match(ref):
        return ref.lower() if ref else None
    return resolve_ref(repo, ref, what)


@click.command()
@click.option("--head", default=None, help="sha prefix, or a ref resolved in --repo")
@click.option("--base", default=None, help="sha prefix, or a ref resolved in --repo")
@click.option("--backend", default=None, help="the gated backend's name")
@click.option("--verdict", default=None, type=click.Choice(["pass", "fail", "error", "waiting"]))
@click.option("--repo", default=".", show_default=True, help="git repository that resolves a ref")
@click.option("--finds", is_flag=True, help="list the finds (gdnval find) instead of the gates")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@click.option("--json", "as_json", is_flag=True, help="print the API's JSON")
@server_option
@token_option
def gates(
    head: str | None, base: str | None, backend: str | None, verdict: str | None, repo: str, finds: bool,
    limit: int, as_json: bool, server: str, token: str | None,
) -> None:
    """List gates (or finds) with their verdict, commits, backend and jobs (or steps)."""
    params = {"head": commit_filter(repo, head, "head"), "base": commit_filter(repo, base, "base"),
              "backend": backend, "verdict": verdict, "limit": limit}
    with connected(server, token) as http:
        page = fail_on_error(http.get(f"/api/v1/{'finds' if finds else 'gates'}",
                                      params={k: v for k, v in params.items() if v}))
    if as_json:
        click.echo(dumps(page))
        return
    from rich.table import Table

    from service.presentation.markdown import short_sha

    if finds:
        table = Table("find", "verdict", "good", "bad", "first bad", "backend", "measured", "steps", "reason")
        for f in page["items"]:
            steps = ", ".join(f"{st['kind']} {short_sha(st['commit'])[:10]} {st['outcome'] or '…'}"
                              for st in f["steps"])
            table.add_row(f"{server.rstrip('/')}/finds/{f['id']}", f["verdict"] or f["phase"],
                          short_sha(f["base"]), short_sha(f["head"]),
                          short_sha(f["first_bad"]) if f["first_bad"] else "-", f["backend"] or "ours",
                          str(len(f["measured"])), steps, f["reason"])
        console().print(table)
        return
    table = Table("gate", "verdict", "head", "base", "backend", "device", "jobs", "created", "reason")
    for g in page["items"]:
        jobs = ", ".join(f"#{j['job_id']} {j['role']}" for j in g["jobs"])
        table.add_row(
            f"{server.rstrip('/')}/gates/{g['id']}", g["verdict"] or g["phase"], short_sha(g["head"]),
            short_sha(g["base"]), g["backend"] or "ours", f"{g['device']}x{g['world_size']}", jobs,
            g["created_at"][:19].replace("T", " "), g["reason"],
        )
    console().print(table)
