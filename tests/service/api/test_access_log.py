"""The access log never holds a secret sent in a query string."""

from __future__ import annotations

import logging
import logging.config

import pytest

from service.access_log import REDACTED, log_config, redact_query


def test_secret_query_values_are_redacted_and_the_rest_kept() -> None:
    assert redact_query("/api/v1/jobs?token=s3cret&limit=5") == f"/api/v1/jobs?token={REDACTED}&limit=5"
    got = redact_query("/x?a=1&API_Token=abc&access_key=k#f")
    assert got == f"/x?a=1&API_Token={REDACTED}&access_key={REDACTED}#f"
    assert redact_query("/jobs?suite=cp-layer&before=9") == "/jobs?suite=cp-layer&before=9"


def test_the_servers_access_log_redacts_a_query_token(capsys: pytest.CaptureFixture[str]) -> None:
    logging.config.dictConfig(log_config())  # what `gdnval serve` hands uvicorn
    access = logging.getLogger("uvicorn.access")
    access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/api/v1/jobs?token=s3cret", "1.1", 401)
    out = capsys.readouterr().out
    assert f"GET /api/v1/jobs?token={REDACTED} HTTP/1.1" in out and "s3cret" not in out
