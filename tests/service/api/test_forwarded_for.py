"""The wrong-token limit counts the address that connected, whatever `X-Forwarded-For` says,
unless the connecting address is a configured proxy (`GDNVAL_TRUSTED_PROXIES`): against a real
`gdnval serve` on loopback, which uvicorn would otherwise trust."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from service.api.auth_limit import MAX_FAILURES
from tests.support.api_support import make_server

pytestmark = pytest.mark.slow  # real server processes


def _wrong_tokens(base: str, forwarded: list[str]) -> list[int]:
    """The statuses of one wrong-token write per `X-Forwarded-For` value, in order."""
    with httpx.Client(base_url=base, timeout=10) as http:
        return [http.post("/api/v1/jobs", json={"suite": "x"},
                          headers={"Authorization": "Bearer wrong", "X-Forwarded-For": ip}).status_code
                for ip in forwarded]


def test_rotating_forwarded_for_from_loopback_is_still_one_client(tmp_path: Path) -> None:
    server = make_server(tmp_path).start()
    try:
        statuses = _wrong_tokens(server.base, [f"10.0.0.{i + 1}" for i in range(MAX_FAILURES + 5)])
    finally:
        server.stop()
    assert statuses[:MAX_FAILURES] == [403] * MAX_FAILURES
    assert set(statuses[MAX_FAILURES:]) == {429}, statuses


def test_a_configured_proxy_is_believed(tmp_path: Path) -> None:
    server = make_server(tmp_path, GDNVAL_TRUSTED_PROXIES="127.0.0.1").start()
    try:
        rotating = _wrong_tokens(server.base, [f"10.1.0.{i + 1}" for i in range(MAX_FAILURES + 5)])
        one = _wrong_tokens(server.base, ["10.2.0.1"] * (MAX_FAILURES + 1))
    finally:
        server.stop()
    assert set(rotating) == {403}, rotating  # each forwarded address is a client of its own
    assert one[-1] == 429, one  # and each is limited
