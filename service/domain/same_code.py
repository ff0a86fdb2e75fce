"""Which stored job already measured a commit's code under test, byte for byte.

A commit whose code under test is byte-identical to that of a commit measured before (a change
to documentation only, a revert) gets nothing new from running its jobs again: the gate reuses
the job of the identical commit instead. Identical means the content hashes the ranks record
(`workers.provenance`: `info.code_hash`, our runtime packages and the suite's module, and each
backend's `content_hash`) are equal, worked out for the commit before anything runs:

- a commit of the project: the hash of its snapshot (the executors' snapshot of the service's
  repository, GDNVAL_REPO), as a rank running that snapshot records it; a job it matches must
  run no backend but ours (whose content is the same tree's);
- a backend's commit: our code as the service runs it, and the backend's package as installed
  for that commit (the install its jobs use, built once per commit on this machine; a commit
  that cannot be fetched or built matches nothing, and its own jobs then say why).

The same rule, case by case: a backend commit that is not byte-identical to a measured one
still runs our reference backends (`eager`) exactly as that commit's job ran them, so those
cases are taken from its job instead of measured again (`CodeUnderTest.shared_backends`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from service.domain.commit_range import RangeError, backend_repository, service_repository
from service.persistence.jobs import setting_jobs
from service.persistence.records import JobRecord
from workers.backend_source import BackendSourceError, entry_points, install_backend_source
from workers.provenance import SOURCE_ROOT, installed_module_hash, source_content_hash
from workers.registry import get_suite
from workers.snapshot import SnapshotCache, SnapshotError

OURS = "gdnval"  # the distribution of our own backends (their content is our tree's)


@dataclass(frozen=True)
class CodeUnderTest:
    """A commit's code under test as its jobs' ranks would record it."""

    code_hash: str  # info.code_hash: our runtime packages and the suite's module
    backend: str | None = None  # the backend under test from elsewhere, by name
    backend_hash: str | None = None  # its content_hash, as installed for the commit

    def measured_by(self, info: Mapping[str, Any]) -> bool:
        """Whether a job with this recorded `info` ran exactly this code."""
        if info.get("code_hash") != self.code_hash:
            return False
        for b in info.get("backends") or []:
            if not isinstance(b, Mapping):
                return False
            ours = b.get("distribution") == OURS
            theirs = self.backend is not None and b.get("backend") == self.backend
            if not (ours or (theirs and b.get("content_hash") == self.backend_hash)):
                return False
        return self.backend is None or any(
            isinstance(b, Mapping) and b.get("backend") == self.backend for b in info.get("backends") or [])

    def shared_backends(self, info: Mapping[str, Any]) -> list[str]:
        """The backends of a job that recorded `info` whose cases ran exactly the code this
        commit's cases of them would: ours (their content is our tree's), when our code hash is
        equal; never the backend under test. A backend from elsewhere is left out (its content
        for this commit is not known before a rank records it), and so measured again."""
        if info.get("code_hash") != self.code_hash:
            return []
        return [str(b["backend"]) for b in info.get("backends") or []
                if isinstance(b, Mapping) and b.get("distribution") == OURS and b.get("backend")
                and b.get("backend") != self.backend]


def _suite_file(suite: str) -> Path | None:
    """The suite's module, relative to our tree (None when it lives elsewhere)."""
    try:
        return Path(inspect.getfile(type(get_suite(suite)))).resolve().relative_to(SOURCE_ROOT)
    except (TypeError, ValueError):
        return None


def code_under_test(suite: str, commit: str, backend_repo: str | None = None,
                    backend: str | None = None) -> CodeUnderTest | None:
    """What `suite`'s jobs of `commit` would record as their code under test (of the project's
    repository, or of `backend_repo` with `backend` under test); None when it cannot be known
    here (no repository, a commit that cannot be extracted or built)."""
    rel = _suite_file(suite)
    if rel is None:
        return None
    if backend_repo is None:
        repo = service_repository()
        if repo is None:
            return None
        try:
            root = SnapshotCache(repo).path(commit)
        except SnapshotError:
            return None
        if not (root / rel).is_file():
            return None
        code = source_content_hash(root, (root / rel,))
        return CodeUnderTest(code) if code else None
    ours = source_content_hash(SOURCE_ROOT, (SOURCE_ROOT / rel,))
    try:
        target = entry_points(backend_repository(backend_repo), commit).get(str(backend))
        folder = install_backend_source(f"git+{backend_repo}@{commit}") if target else None
    except (BackendSourceError, RangeError):
        return None
    theirs = installed_module_hash(folder, target.partition(":")[0]) if folder and target else None
    return CodeUnderTest(ours, backend, theirs) if ours and theirs else None


def identical_job(
    session: Session, suite: str, commit: str, *, preset: str, device: str, world_size: int,
    params: Mapping[str, Any], backend_repo: str | None = None, backend: str | None = None,
) -> JobRecord | None:
    """The newest succeeded job of this setting at another commit whose code under test is
    byte-identical to `commit`'s, or None. Nothing is extracted or built unless such a job of
    the setting exists at all."""
    others = [j for j in setting_jobs(session, suite, preset=preset, device=device, world_size=world_size,
                                      params=params, backend_repo=backend_repo)
              if j.code_commit not in (None, commit)]
    if not others:
        return None
    code = code_under_test(suite, commit, backend_repo, backend)
    if code is None:
        return None
    return next((j for j in others if code.measured_by(j.info or {})), None)
