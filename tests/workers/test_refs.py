"""One rule for commit references (workers.refs): the API, baselines, the snapshot cache and git
helpers all refuse what could be read as an option, a path or revision syntax."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.domain.baselines import git_rev_parse
from workers.refs import REF_PATTERN, InvalidCommitRef, check_commit, is_commit_ref
from workers.snapshot import SnapshotCache, SnapshotError, extract

BAD = ["../x", "$(id)", "HEAD@{1}", "--upload-pack=touch x", "-x", "a..b", "a//b", "a/.b", "x/", "x.",
       "main\n", "a b", "x^{tree}", "HEAD~1", "", "a" * 201, ".hidden"]
GOOD = ["main", "HEAD", "v1.2.3", "feature/cp-2_x", "release/2026.12", "deadbee", "A" * 200]


@pytest.mark.parametrize("ref", BAD)
def test_bad_refs_are_refused_with_the_rule(ref: str) -> None:
    with pytest.raises(InvalidCommitRef, match="commit must be a hex sha"):
        check_commit(ref)


@pytest.mark.parametrize("ref", GOOD)
def test_good_refs_pass(ref: str) -> None:
    assert check_commit(ref) == ref
    assert check_commit("DEADBEEF") == "deadbeef"  # shas are stored lower-case


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab09._/-^@~{}$ \n", max_size=12))
def test_the_schema_pattern_states_exactly_the_rule(value: str) -> None:
    """The OpenAPI pattern (ECMA semantics: `$` is the end) and the server agree on every string."""
    assert is_commit_ref(value) == (re.fullmatch(REF_PATTERN[1:-1], value) is not None)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run([*git, "init", "-q"], check=True)
    for n in ("1", "2"):
        (repo / "f.txt").write_text(n)
        subprocess.run([*git, "add", "f.txt"], check=True)
        subprocess.run([*git, "commit", "-qm", n], check=True)
    return repo


def test_snapshot_cache_and_git_helper_validate_before_git(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    cache = SnapshotCache(repo, tmp_path / "cache")
    marker = tmp_path / "pwned"
    for ref in (f"--upload-pack=touch {marker}", "HEAD@{1}", "../x"):
        with pytest.raises(SnapshotError, match="commit must be a hex sha"):
            cache.resolve(ref)
        with pytest.raises(InvalidCommitRef):
            git_rev_parse(repo, ref)
    assert not marker.exists()
    head = cache.resolve("HEAD")
    parent = git_rev_parse(repo, "HEAD^")
    assert len(head) == len(parent or "") == 40 and head != parent
    assert git_rev_parse(repo, "HEAD~1") == parent  # ancestry steps are fine for a local checkout
    for ref in ("HEAD@{1}", "HEAD^{tree}", "HEAD~1..HEAD", "HEAD~-1"):
        with pytest.raises(InvalidCommitRef):
            git_rev_parse(repo, ref)
    with pytest.raises(SnapshotError, match="full 40-hex sha"):
        extract("../../escape", b"", tmp_path / "cache")


def test_api_refuses_bad_refs_for_jobs_and_baselines(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(db_url=f"sqlite:///{tmp_path / 'x.db'}", api_token="t", dispatch=False,
                        executor="local", artifacts_dir=tmp_path / "art")
    auth = {"Authorization": "Bearer t"}
    with TestClient(create_app(settings)) as http:
        for ref in ("HEAD@{1}", "../x", "--upload-pack=x", "a/.b"):
            r = http.post("/api/v1/jobs", json={"suite": "capability", "commit": ref}, headers=auth)
            assert r.status_code == 422 and "commit must be a hex sha" in r.text, (ref, r.text)
            r = http.put("/api/v1/baselines/main", json={"commit": ref}, headers=auth)
            assert r.status_code == 422 and "commit must be a hex sha" in r.text, (ref, r.text)
        r = http.put("/api/v1/baselines/main", json={"commit": "release/2026.12"}, headers=auth)
        assert r.status_code == 200 and r.json()["commit"] == "release/2026.12"
