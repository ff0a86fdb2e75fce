"""Polling for a condition in tests that watch a real server, cluster or process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(cond: Callable[[], T], timeout: float, what: str, poll: float = 0.1) -> T:
    """`cond()`'s first truthy value; fails the test naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < end, f"not met in {timeout} s: {what}"
        time.sleep(poll)
