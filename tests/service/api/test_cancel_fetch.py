"""A cancel reaches a job that fetches its backend source: against a real server (local
executor) and a git server on loopback that accepts connections and never answers, the job
ends `cancelled` within seconds of the cancel, and no git process of it is left."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.api_support import TOKEN, make_server

pytestmark = pytest.mark.slow  # a real server process

AUTH = {"Authorization": f"Bearer {TOKEN}"}


class SilentServer:
    """Accepts TCP connections on loopback, reads nothing, answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                self.accepted.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.sock.close()


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_a_cancel_ends_a_job_whose_fetch_never_answers(tmp_path: Path) -> None:
    silent = SilentServer()
    url = f"http://127.0.0.1:{silent.port}/backend.git"
    server = make_server(tmp_path, GDNVAL_BACKEND_CACHE=str(tmp_path / "backends")).start()
    try:
        body = {"suite": "capability", "labels": {"backend_source": f"git+{url}@main"}}
        made = httpx.post(f"{server.base}/api/v1/jobs", json=body, headers=AUTH, timeout=10)
        assert made.status_code == 201, made.text
        job_id = made.json()["id"]
        end = time.monotonic() + 60
        while not silent.accepted or not _processes_naming(url):  # git is connected and waiting
            assert time.monotonic() < end, server.log_text()
            time.sleep(0.1)
        asked = httpx.post(f"{server.base}/api/v1/jobs/{job_id}/cancel", headers=AUTH, timeout=10)
        assert asked.status_code == 200, asked.text
        t0 = time.monotonic()
        while (job := httpx.get(f"{server.base}/api/v1/jobs/{job_id}", timeout=10).json())["status"] in (
                "queued", "running"):
            assert time.monotonic() - t0 < 10, job
            time.sleep(0.1)
        assert job["status"] == "cancelled", job
        assert time.monotonic() - t0 < 5
        assert job["error"] == "cancelled while the backend source was installed", job
        assert _processes_naming(url) == []
    finally:
        server.stop()
        silent.close()
