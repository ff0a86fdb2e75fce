"""Where a backend under test comes from: a git repository at a commit, or a package requirement.

A job names it as one string (the job label `backend_source`):

- `git+<repository>@<commit>`: any path or URL git can read, and a commit (sha, branch, tag);
- anything else: a pip requirement (`fla-core==0.6.0`).

Each source is installed once (built in isolation, with uv where present, its declared
dependencies met by the job's environment or installed beside it: workers.backend_install) into
a folder of its own under the cache, named by what it contains: the full commit sha (the
snapshot machinery of workers.snapshot extracts the tree) or a hash of the requirement.
The ranks put that folder first on their path, so its `gdnval.backends` entry points are found.
An install is built in a temporary folder and renamed into place, so a half-built one is never
used, under a file lock, so processes of one machine that need the same source build it once; a
source that cannot be fetched or built fails with the installer's or git's own message.

Fetching and building are apart (`backend_tree`, `install_backend_tree`), so the Ray executor
fetches a source where the service runs and builds it on the nodes that run the ranks, for their
machine and interpreter; the cache is `GDNVAL_BACKEND_CACHE`, else `backends/` beside the
snapshot cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from workers.backend_install import InstallError, install_package
from workers.job_env import CommandCancelled, JobUser, run_job_command
from workers.provenance import BACKEND_COMMIT_FILE
from workers.refs import GIT_END_OF_OPTIONS, InvalidCommitRef, check_commit
from workers.snapshot import SnapshotCache, SnapshotError, default_cache_dir

BACKEND_SOURCE_LABEL = "backend_source"
INSTALL_TIMEOUT_S = 600
_MARKER = ".gdnval-backend"
# the transports a backend repository may be fetched over (git's `ext::`, `fd::` and remote
# helpers run commands or read the service's descriptors); an operator's GIT_ALLOW_PROTOCOL wins
ALLOWED_GIT_PROTOCOLS = "file:git:http:https:ssh"


class BackendSourceError(RuntimeError):
    """The source cannot be parsed, fetched or built; the message names it and says why."""


@dataclass(frozen=True)
class BackendSource:
    """One parsed source: (repo, commit) for git, or a requirement."""

    repo: str | None = None
    commit: str | None = None
    requirement: str | None = None

    @classmethod
    def parse(cls, text: str) -> BackendSource:
        text = text.strip()
        if text.startswith("git+"):
            repo, sep, commit = text[4:].rpartition("@")
            if not sep or not repo or not commit:
                raise BackendSourceError(
                    f"backend source {text!r}: expected 'git+<repository>@<commit>' (a path or URL, a commit)"
                )
            if repo.startswith("-"):
                raise BackendSourceError(f"backend source {text!r}: the repository {repo!r} starts with '-'; "
                                         "expected a path or URL")
            try:
                commit = check_commit(commit, "the backend source's commit")
            except InvalidCommitRef as exc:
                raise BackendSourceError(f"backend source {text!r}: {exc}") from exc
            return cls(repo=repo, commit=commit)
        from packaging.requirements import InvalidRequirement, Requirement

        try:
            Requirement(text)
        except InvalidRequirement as exc:
            raise BackendSourceError(
                f"backend source {text!r} is neither 'git+<repository>@<commit>' nor a pip requirement: {exc}"
            ) from exc
        return cls(requirement=text)

    @property
    def full_commit(self) -> str | None:
        """The commit when this is a git source named by a full sha (a branch or tag is only known
        once installed), else None."""
        c = (self.commit or "").lower()
        return c if self.repo and len(c) in (40, 64) and all(ch in "0123456789abcdef" for ch in c) else None

    def __str__(self) -> str:
        return f"git+{self.repo}@{self.commit}" if self.repo else str(self.requirement)


ENTRY_POINT_GROUP = "gdnval.backends"


def entry_points(repo: str | Path, commit: str) -> dict[str, str]:
    """The `gdnval.backends` entry points (name -> 'module:attribute') the package at `commit` of
    the local repository `repo` declares in its pyproject.toml (empty when it declares none or
    has no pyproject.toml)."""
    import tomllib

    try:
        out = subprocess.run(["git", "-C", str(repo), "show", GIT_END_OF_OPTIONS, f"{commit}:pyproject.toml"],
                             capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendSourceError(f"cannot read pyproject.toml of {repo} at {commit}: {exc}") from exc
    if out.returncode != 0:
        return {}
    try:
        project = tomllib.loads(out.stdout).get("project", {})
    except tomllib.TOMLDecodeError as exc:
        raise BackendSourceError(f"pyproject.toml of {repo} at {commit} is not valid TOML: {exc}") from exc
    return {str(k): str(v) for k, v in project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}).items()}


def entry_point_names(repo: str | Path, commit: str) -> list[str]:
    """The names of the package's `gdnval.backends` entry points at `commit` (`entry_points`)."""
    return sorted(entry_points(repo, commit))


def _install(target: Path, what: str, python: str, cancel: threading.Event | None,
             user: JobUser | None) -> None:
    try:
        install_package(target, what, python, cancel, user)
    except InstallError as exc:
        raise BackendSourceError(str(exc)) from exc


def _local_repo(repo: str, mirrors: Path, cancel: threading.Event | None = None) -> Path:
    """`repo` itself when it is a folder here, else a bare mirror of the URL, fetched anew (over
    `ALLOWED_GIT_PROTOCOLS` only; killed within a moment when `cancel` is set)."""
    if Path(repo).is_dir():
        return Path(repo)
    mirror = mirrors / hashlib.sha256(repo.encode()).hexdigest()[:24]
    fetch = ["git", "-C", str(mirror), "fetch", "--quiet", "--prune", "origin", "+refs/*:refs/*"]
    clone = ["git", "clone", "--quiet", "--bare", "--", repo, str(mirror)]
    cmd = fetch if (mirror / "HEAD").exists() else clone
    mirrors.mkdir(parents=True, exist_ok=True)
    allowed = {"GIT_ALLOW_PROTOCOL": os.environ.get("GIT_ALLOW_PROTOCOL") or ALLOWED_GIT_PROTOCOLS}
    try:
        out = run_job_command(cmd, timeout=INSTALL_TIMEOUT_S, cancel=cancel, install=True, extra_env=allowed)
    except (OSError, subprocess.TimeoutExpired, CommandCancelled) as exc:
        raise BackendSourceError(f"cannot fetch backend repository {repo!r}: {exc}") from exc
    if out.returncode != 0:
        raise BackendSourceError(f"cannot fetch backend repository {repo!r}: {out.stderr.strip()}")
    return mirror


def local_repository(repo: str, cache_dir: str | Path | None = None) -> Path:
    """A backend repository git reads here: `repo` itself when it is a folder, else the mirror
    of its URL under this machine's backend cache, fetched anew (history orders its commits)."""
    cache = Path(cache_dir) if cache_dir else default_backend_cache()
    return _local_repo(repo, cache / "repos")


BACKEND_CACHE_ENV = "GDNVAL_BACKEND_CACHE"  # where this machine keeps its installed backends


def default_backend_cache() -> Path:
    """This machine's cache of installed backends: `GDNVAL_BACKEND_CACHE`, else beside the snapshots."""
    return Path(os.environ.get(BACKEND_CACHE_ENV) or default_cache_dir().parent / "backends")


def backend_key(source: BackendSource, sha: str | None = None) -> str:
    """The cache key of an installed source: its full commit (`sha`, resolved) or a hash of the
    requirement."""
    if source.repo is not None:
        if sha is None:
            raise BackendSourceError(f"backend source {source}: its commit is resolved before it is keyed")
        return f"git-{sha}"
    return "req-" + hashlib.sha256(str(source.requirement).encode()).hexdigest()[:24]


def backend_tree(
    source: BackendSource | str, cache_dir: str | Path | None = None, cancel: threading.Event | None = None,
) -> tuple[str, Path | None]:
    """(cache key, source tree) of a git source: its repository fetched and its commit extracted
    here, nothing built; (key, None) for a requirement, which the installing machine fetches. A
    fetch is stopped when `cancel` is set (BackendSourceError)."""
    if isinstance(source, str):
        source = BackendSource.parse(source)
    if source.repo is None:
        return backend_key(source), None
    cache = Path(cache_dir) if cache_dir else default_backend_cache()
    snapshots = SnapshotCache(_local_repo(source.repo, cache / "repos", cancel), cache / "trees")
    try:
        sha = snapshots.resolve(str(source.commit))
        tree = snapshots.path(sha)
    except SnapshotError as exc:
        raise BackendSourceError(f"backend source {source}: {exc}") from exc
    return backend_key(source, sha), tree


def install_backend_source(
    source: BackendSource | str, cache_dir: str | Path | None = None, python: str = sys.executable,
    cancel: threading.Event | None = None, user: JobUser | None = None,
) -> Path:
    """The folder holding the installed source (built on first use, as `user` when given), to
    put first on the path; fetching and building stop when `cancel` is set (BackendSourceError)."""
    key, tree = backend_tree(source, cache_dir, cancel)
    return install_backend_tree(source, key, tree, cache_dir, python, cancel, user)[0]


def install_backend_tree(
    source: BackendSource | str, key: str, tree: Path | None, cache_dir: str | Path | None = None,
    python: str = sys.executable, cancel: threading.Event | None = None, user: JobUser | None = None,
) -> tuple[Path, bool]:
    """Build and install `source` (from `tree`, its extracted commit, for a git source) into
    `<cache>/<key>/` for `python`, unless a finished install is there: (the folder, whether this
    call built it). Callers on one machine that race for one key build it once (a file lock); a
    build runs as `user` when given (the build's folder is handed to it) and is stopped when
    `cancel` is set."""
    if isinstance(source, str):
        source = BackendSource.parse(source)
    cache = Path(cache_dir) if cache_dir else default_backend_cache()
    target = cache / key
    if (target / _MARKER).exists():
        return target, False
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (target / _MARKER).exists():  # another process built it while this one waited
            return target, False
        _build_into(cache, target, source, key, tree, python, cancel, user)
    return target, True


def _build_into(cache: Path, target: Path, source: BackendSource, key: str, tree: Path | None,
                python: str, cancel: threading.Event | None, user: JobUser | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=cache))
    try:
        site = tmp / "site"
        if source.repo is not None:
            if tree is None or not tree.is_dir():
                raise BackendSourceError(f"backend source {source}: no source tree to build at {tree}")
            build = tmp / "src"  # a copy: the build writes into the tree, the snapshot stays as extracted
            shutil.copytree(tree, build)
            if user is not None:
                user.hand_over(tmp)
            _install(site, str(build), python, cancel, user)
            (site / BACKEND_COMMIT_FILE).write_text(key.removeprefix("git-") + "\n")
        else:
            if user is not None:
                user.hand_over(tmp)
            _install(site, str(source.requirement), python, cancel, user)
        (site / _MARKER).write_text(f"{source}\n")
        try:
            site.rename(target)
        except OSError:
            if not (target / _MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
