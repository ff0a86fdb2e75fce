"""A repository's commits in first-parent order: what history places its points on and what a
find bisects. Git is asked directly (refs checked by `workers.refs` first); the project's
repository is the executors' (`GDNVAL_REPO`), a backend's is the one its jobs were installed
from (a folder here, or a mirror of its URL fetched by `workers.backend_source`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from workers.refs import GIT_END_OF_OPTIONS, check_revision
from workers.snapshot import REPO_ENV

MAX_COMMITS = 10_000


class RangeError(ValueError):
    """The repository cannot be read, or a ref names no commit in it; the message says which."""


def service_repository() -> str | None:
    """The project's repository as the executors know it (GDNVAL_REPO), or None."""
    return os.environ.get(REPO_ENV) or None


def backend_repository(repo: str) -> Path:
    """A backend repository readable here: the folder itself, or a fetched mirror of its URL."""
    from workers.backend_source import BackendSourceError, local_repository

    try:
        return local_repository(repo)
    except BackendSourceError as exc:
        raise RangeError(str(exc)) from exc


def _git(repo: str | Path, *args: str) -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RangeError(f"cannot read the git repository {str(repo)!r}: {exc}") from exc
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or ["not a git repository"])[-1]
        raise RangeError(f"git {args[0]} in {str(repo)!r}: {why}")
    return out.stdout.split()


def first_parent(repo: str | Path, tip: str = "HEAD", *, since: str | None = None,
                 limit: int = MAX_COMMITS) -> list[str]:
    """Full shas of `tip` and its first parents, oldest first: the `limit` newest of them, and
    with `since` only those after it (`since` itself left out; it must be a first-parent
    ancestor of `tip`, else RangeError)."""
    tip = check_revision(tip, "tip")
    if since is not None:
        since = check_revision(since, "since")
        ancestors = _git(repo, "rev-list", "--first-parent", GIT_END_OF_OPTIONS, f"{tip}^{{commit}}")
        since_sha = _git(repo, "rev-parse", "--verify", GIT_END_OF_OPTIONS, f"{since}^{{commit}}")[0]
        if since_sha not in ancestors:
            raise RangeError(f"{since} ({since_sha[:12]}) is not on the first-parent line of {tip}: "
                             "expected an ancestor reached by first parents")
        shas = ancestors[:ancestors.index(since_sha)]
    else:
        shas = _git(repo, "rev-list", "--first-parent", f"--max-count={limit}", GIT_END_OF_OPTIONS,
                    f"{tip}^{{commit}}")
    return shas[:limit][::-1]
