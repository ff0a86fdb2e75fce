"""Polling for a condition in tests that watch a real server, cluster or process."""

from __future__ import annotations

import os
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


def process_gone(pid: int) -> bool:
    """No process `pid` exists (a zombie still counts as there: its parent has not reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
