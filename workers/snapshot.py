"""Source snapshots: the tree of one commit, extracted once and cached by its sha.

The code under test is the job's commit, not whatever is installed: an executor given a git
repository runs the ranks on `SnapshotCache(repo).path(commit)`. Snapshots are immutable and
named by the full sha, so concurrent jobs share them and a half-written one is never used
(extraction goes to a temporary directory that is renamed into place).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from workers.refs import GIT_END_OF_OPTIONS, HEX_SHA, InvalidCommitRef, check_commit

REPO_ENV = "GDNVAL_REPO"  # default git repository of the executors (jobs with a commit run its snapshot)
COMPLETE_MARKER = ".gdnval-snapshot"
COMMIT_FILE = "GDNVAL_COMMIT"


class SnapshotError(RuntimeError):
    """The commit cannot be resolved or archived; the message names the repository and commit."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("GDNVAL_SNAPSHOT_CACHE", str(Path(base) / "gdnval" / "snapshots")))


def _git(repo: Path, *args: str, binary: bool = False) -> bytes | str:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SnapshotError(f"git {' '.join(args)} failed in {repo}: {exc}") from exc
    if out.returncode != 0:
        err = out.stderr.decode("utf-8", "replace").strip()
        raise SnapshotError(f"git {' '.join(args)} failed in {repo}: {err}")
    return out.stdout if binary else out.stdout.decode().strip()


class SnapshotCache:
    """Source trees of the commits of one repository, extracted under `cache_dir/<sha>/`."""

    def __init__(self, repo: str | Path, cache_dir: str | Path | None = None) -> None:
        self.repo = Path(repo)
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()

    def resolve(self, commit: str) -> str:
        """The full sha of `commit` (a sha, a prefix, a branch or a tag; see `workers.refs`)."""
        try:
            commit = check_commit(commit)
        except InvalidCommitRef as exc:
            raise SnapshotError(str(exc)) from exc
        sha = str(
            _git(self.repo, "rev-parse", "--verify", "--quiet", GIT_END_OF_OPTIONS, f"{commit}^{{commit}}")
        )
        if len(sha) != 40:
            raise SnapshotError(f"commit {commit!r} is not a commit of {self.repo}")
        return sha

    def path(self, commit: str) -> Path:
        """The extracted tree of `commit`, built on first use."""
        sha = self.resolve(commit)
        if (self.cache_dir / sha / COMPLETE_MARKER).exists():
            return self.cache_dir / sha
        data = bytes(_git(self.repo, "archive", "--format=tar", GIT_END_OF_OPTIONS, sha, binary=True))  # type: ignore[arg-type]
        return extract(sha, data, self.cache_dir)

    def archive(self, commit: str) -> tuple[str, bytes]:
        """(sha, tar bytes) of the commit's tree: what a remote node extracts (see `extract`)."""
        sha = self.resolve(commit)
        return sha, bytes(_git(self.repo, "archive", "--format=tar", GIT_END_OF_OPTIONS, sha, binary=True))  # type: ignore[arg-type]


def extract(sha: str, data: bytes, cache_dir: str | Path | None = None) -> Path:
    """Extract an archive made by `SnapshotCache.archive` on this node, cached by sha."""
    if len(sha) != 40 or not HEX_SHA.match(sha):
        raise SnapshotError(f"a snapshot is named by a full 40-hex sha, got {sha!r}")
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache / sha
    if (target / COMPLETE_MARKER).exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}-", dir=cache))
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(tmp, filter="data")
        (tmp / COMMIT_FILE).write_text(sha + "\n")
        (tmp / COMPLETE_MARKER).write_text(sha + "\n")
        try:
            tmp.rename(target)
        except OSError:
            if not (target / COMPLETE_MARKER).exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
