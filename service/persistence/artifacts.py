"""Artifact rows, where their files live on disk and how they are addressed over HTTP.

An artifact keeps the name its rank gave it (`rank0/trace.json`): the API and the job page link
`/api/v1/jobs/{job}/artifacts/{name}` with the name's `/` kept as a path separator (each segment
percent-encoded), and the API route takes the rest of the path as the name.

On disk an artifact is `ARTIFACTS_DIR/store-<key>/<job>/<name>`, where the key is derived from
the store's database (the SQLite file's real path, or the server and database of a PostgreSQL
URL, never its password): two stores that share one artifacts directory never overwrite each
other's files, while several service replicas of one store share theirs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session

from service.persistence.models import ArtifactRow

MAX_NAME = 300  # = service.persistence.models.ArtifactRow.name


def store_key(url: str | URL) -> str:
    """A short stable name of the store `url` points at (same store, same key)."""
    u = make_url(url) if isinstance(url, str) else url
    if u.get_backend_name() == "sqlite":
        db = u.database or ""
        ident = f"sqlite:{os.path.realpath(db) if db and db != ':memory:' else f'memory-{os.getpid()}'}"
    else:
        ident = f"{u.get_backend_name()}://{u.host or ''}:{u.port or ''}/{u.database or ''}"
    return "store-" + hashlib.sha256(ident.encode()).hexdigest()[:16]


def _safe_segment(segment: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in segment).lstrip(".")
    return safe or "_"


def artifact_path(artifacts_dir: Path, url: str | URL, job_id: int, name: str) -> Path:
    """The file of artifact `name` of job `job_id` of the store at `url`; every segment of the name
    is made filesystem-safe, so a name can never point outside the job's folder."""
    if not name or len(name) > MAX_NAME:
        raise ValueError(f"artifact name must be 1-{MAX_NAME} characters, got {name!r}")
    parts = [_safe_segment(s) for s in name.split("/") if s not in ("", ".", "..")] or ["_"]
    return Path(artifacts_dir) / store_key(url) / str(job_id) / Path(*parts)


def artifact_url(job_id: int, name: str) -> str:
    """The API URL of an artifact: its name's segments percent-encoded, its `/` kept."""
    return f"/api/v1/jobs/{job_id}/artifacts/{quote(name, safe='/')}"


def save_artifact(
    session: Session, job_id: int, name: str, media_type: str, data: bytes, artifacts_dir: Path
) -> ArtifactRow:
    """Write the artifact under `artifacts_dir` at `service.persistence.artifacts.artifact_path` (a folder of
    this store, then the job) and record it (replaces same name)."""
    path = artifact_path(artifacts_dir, session.get_bind().engine.url, job_id, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(path)  # atomic: a crash never leaves a half-written artifact under its name
    row = session.scalar(select(ArtifactRow).where(ArtifactRow.job_id == job_id, ArtifactRow.name == name))
    if row is None:
        row = ArtifactRow(job_id=job_id, name=name, media_type=media_type, size=len(data), path=str(path))
        session.add(row)
    else:
        row.media_type, row.size, row.path, row.blob = media_type, len(data), str(path), None
    return row


def list_artifacts(session: Session, job_id: int) -> list[ArtifactRow]:
    q = select(ArtifactRow).where(ArtifactRow.job_id == job_id).order_by(ArtifactRow.id)
    return list(session.scalars(q))


def get_artifact(session: Session, job_id: int, name: str) -> ArtifactRow | None:
    return session.scalar(select(ArtifactRow).where(ArtifactRow.job_id == job_id, ArtifactRow.name == name))
