"""Artifacts: addressed by their full name (`rank0/note.txt`, also with the slash encoded), kept
inside their job's folder, and stored per store so two stores sharing a directory never collide."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.app import create_app
from service.persistence import artifacts as artifact_store
from service.persistence.artifacts import artifact_path, store_key
from service.persistence.models import JobRow
from service.settings import Settings


def _app(tmp_path: Path, name: str, artifacts: Path, **kw: object) -> TestClient:
    settings = Settings(db_url=f"sqlite:///{tmp_path / name}", api_token="t", dispatch=False,
                        executor="local", artifacts_dir=artifacts, **kw)
    return TestClient(create_app(settings))


def _job_with(http: TestClient, artifacts: Path, files: dict[str, bytes]) -> int:
    engine = http.app.state.engine
    with Session(engine) as s, s.begin():
        job = JobRow(suite="capability", preset="quick", params={}, device="cpu", world_size=1,
                  status="succeeded")
        s.add(job)
        s.flush()
        for name, data in files.items():
            artifact_store.save_artifact(s, job.id, name, "text/plain", data, artifacts)
        return job.id


def test_listed_urls_download_and_two_stores_keep_their_own_files(tmp_path: Path) -> None:
    shared = tmp_path / "artifacts"
    with _app(tmp_path, "a.db", shared) as a, _app(tmp_path, "b.db", shared) as b:
        files = {"rank0/note.txt": b"store a", "rank1/note.txt": b"rank 1", "a b%.txt": b"x"}
        ja = _job_with(a, shared, files)
        jb = _job_with(b, shared, {"rank0/note.txt": b"store b"})
        assert ja == jb == 1  # same job id in both stores: the files must still differ
        listed = {i["name"]: i["url"] for i in a.get(f"/api/v1/jobs/{ja}/artifacts").json()["items"]}
        assert listed["rank0/note.txt"] == "/api/v1/jobs/1/artifacts/rank0/note.txt"
        assert listed["a b%.txt"] == "/api/v1/jobs/1/artifacts/a%20b%25.txt"
        for name, url in listed.items():
            r = a.get(url)
            assert r.status_code == 200, (name, r.text)
        assert a.get(listed["rank0/note.txt"]).content == b"store a"
        assert a.get(listed["rank1/note.txt"]).content == b"rank 1"
        assert a.get("/api/v1/jobs/1/artifacts/rank0%2Fnote.txt").content == b"store a"
        assert b.get("/api/v1/jobs/1/artifacts/rank0/note.txt").content == b"store b"
        missing = a.get("/api/v1/jobs/1/artifacts/rank9/note.txt")
        assert missing.status_code == 404 and "rank9/note.txt" in missing.json()["detail"]
    dirs = sorted(p.name for p in shared.iterdir())
    assert len(dirs) == 2 and all(d.startswith("store-") for d in dirs)


def test_names_never_leave_the_job_folder_and_keys_follow_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    root = tmp_path / "art"
    job_dir = root / store_key(url) / "7"
    for name in ("../../etc/passwd", "/abs/x", "rank0/../../y", "..", ".hidden/z"):
        assert job_dir in artifact_path(root, url, 7, name).parents, name
    assert store_key(url) == store_key(f"sqlite:///{tmp_path}/./x.db")  # same file, same key
    assert store_key("postgresql+psycopg://u:one@db:5432/gdnval") == store_key("postgresql://u:two@db:5432/gdnval")
    assert store_key("postgresql://u@db:5432/gdnval") != store_key("postgresql://u@db:5432/other")


def test_protected_reads_guard_artifacts(tmp_path: Path) -> None:
    shared = tmp_path / "artifacts"
    with _app(tmp_path, "p.db", shared, protect_reads=True) as http:
        job = _job_with(http, shared, {"rank0/note.txt": b"secret"})
        url = f"/api/v1/jobs/{job}/artifacts/rank0/note.txt"
        assert http.get(url).status_code == 401
        assert http.get(url, headers={"Authorization": "Bearer t"}).content == b"secret"
