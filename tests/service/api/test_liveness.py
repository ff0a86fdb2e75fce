"""`/healthz` fails only in a state the process cannot leave: while the dispatcher thread runs it
is 200 (an outage of the store or the cluster makes the service not ready, never dead); once
that thread ended it is 503, so a liveness probe restarts the service."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


def test_healthz_turns_503_only_when_the_dispatcher_thread_is_gone(tmp_path: Path) -> None:
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'h.db'}", artifacts_dir=tmp_path / "a",
                        executor="tests.support.api_support:make_fake_executor")
    with TestClient(create_app(settings)) as http:
        assert http.get("/healthz").json() == {"status": "ok", "checks": {}}
        http.app.state.dispatcher.stop()  # the thread ends: nothing in the process restarts it
        dead = http.get("/healthz")
        assert dead.status_code == 503 and dead.json()["checks"]["dispatcher"].startswith("its thread ended")
        assert http.get("/readyz").status_code == 503
