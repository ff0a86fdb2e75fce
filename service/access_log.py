"""The server's log configuration: uvicorn's, with query-string secrets redacted from the access
log (a token sent as `?token=...` is refused, but must not end up in a log file either)."""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

# a query parameter whose name says it carries a secret: token, access_token, api_key, password...
_SECRET_PARAM = re.compile(r"(?i)([?&](?:[^=&#]*(?:token|key|secret|password|auth)[^=&#]*)=)[^&#]*")
REDACTED = "REDACTED"


def redact_query(path: str) -> str:
    """`path` with the value of every secret-looking query parameter replaced."""
    return _SECRET_PARAM.sub(rf"\g<1>{REDACTED}", path)


class RedactQuerySecrets(logging.Filter):
    """Rewrites the request path of uvicorn's access records (args: client, method, path, ...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration with the access handler redacting secrets."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_query_secrets"] = {"()": f"{__name__}.RedactQuerySecrets"}
    config["handlers"]["access"].setdefault("filters", []).append("redact_query_secrets")
    return config
