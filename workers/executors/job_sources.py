"""The code a Ray job runs, prepared where the service runs: the job's commit as a `git archive`
tar (with a configured repository) and a git backend source's unbuilt tree as a tar, fetched
into the service's backend cache. Both travel as bytes, so the process that ships them to the
cluster (the Ray driver, which may run on another machine than the repository) needs neither the
repository nor the backend's remote. Imports no Ray.
"""

from __future__ import annotations

import io
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

from workers.backend_source import BackendSourceError, backend_tree
from workers.executors.base import JobOutcome, JobSink, JobSpec
from workers.provenance import source_commit
from workers.snapshot import SnapshotCache, SnapshotError


@dataclass(frozen=True)
class JobSources:
    """What a job's ranks import: `snapshot` (sha, tar) of its commit or None for the installed
    code (`commit` is what is recorded either way), and for a backend source its cache key with
    the tar of its unbuilt tree (None for a requirement, which each node fetches itself)."""

    commit: str | None
    snapshot: tuple[str, bytes] | None = None
    backend_key: str = ""
    backend_tar: bytes | None = None


def tar_tree(root: Path) -> bytes:
    """`root`'s files as an uncompressed tar, paths relative to it, symlinks kept as links."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return out.getvalue()


def untar_tree(data: bytes, into: Path) -> Path:
    """Extract a `tar_tree` archive into `into` (created), refusing paths that leave it."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def prepare_sources(
    spec: JobSpec, snapshots: SnapshotCache | None, backend_cache: Path | None, sink: JobSink,
    cancel: threading.Event | None = None,
) -> JobSources | JobOutcome:
    """The job's code for the cluster, or the failed (or cancelled) outcome that says why not:
    a commit the repository cannot archive, a backend source that cannot be fetched."""
    backend_key, backend_tar = "", None
    if spec.backend_source:  # never run the job without the code it names
        try:
            backend_key, tree = backend_tree(spec.backend_source, backend_cache, cancel)
        except BackendSourceError as exc:
            if cancel is not None and cancel.is_set():
                return JobOutcome("cancelled", "cancelled while the backend source was fetched")
            return JobOutcome("failed", f"cannot install the backend source: {exc}")
        if tree is not None:
            backend_tar = tar_tree(tree)
        how = "its source shipped" if tree is not None else "the requirement"
        sink.log(f"backend source {spec.backend_source}: {how} to the ranks, built on their nodes")
    if snapshots is not None and spec.commit:
        try:
            snapshot = snapshots.archive(spec.commit)
        except SnapshotError as exc:
            return JobOutcome("failed", f"cannot build the source snapshot: {exc}")
        return JobSources(snapshot[0], snapshot, backend_key, backend_tar)
    commit = source_commit()
    if spec.commit and not (commit or "").startswith(spec.commit):
        sink.log(f"job asks for commit {spec.commit} but no repository is configured; "
                 f"running the installed code (commit {commit or 'unknown'})")
    return JobSources(commit, None, backend_key, backend_tar)
