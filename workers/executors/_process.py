"""One rank as a child process running `python -m workers.runtime`, read through its channel pipe.

Used by the local executor directly and by each Ray rank actor on its node, so both executors
start, read, kill and diagnose ranks the same way.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.runtime import CHANNEL_FD_ENV, PAYLOAD_ENV

OUTPUT_TAIL_LINES = 40
OUTPUT_LOG_LINES = 2000  # output lines per rank forwarded as job log lines; the rest only in the tail


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


class RankProcess:
    """A running rank: its channel messages are queued for `drain()`, its output kept as a tail."""

    def __init__(
        self,
        rank: int,
        payload: Mapping[str, Any],
        env: Mapping[str, str],
        *,
        cwd: str | Path | None = None,
        python: str = sys.executable,
        wakeup: threading.Event | None = None,
    ) -> None:
        self.rank = rank
        self._messages: collections.deque[dict[str, Any]] = collections.deque()
        self._output: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        self._log_lines: collections.deque[str] = collections.deque()
        self._logged = 0
        self._wakeup = wakeup or threading.Event()
        self._exited = threading.Event()
        self.returncode: int | None = None
        read_fd, write_fd = os.pipe()
        child_env = {**env, PAYLOAD_ENV: json.dumps(dict(payload)), CHANNEL_FD_ENV: str(write_fd)}
        try:
            self._proc = subprocess.Popen(
                [python, "-m", "workers.runtime"],
                env=child_env,
                cwd=str(cwd) if cwd else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                # Own session: killing the rank's group also kills what it started. No preexec_fn
                # (unsafe in threaded parents such as the service and Ray workers); a rank whose
                # parent dies notices through its parent-watch thread and exits.
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        self._channel = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        self._out_thread = threading.Thread(target=self._read_output, daemon=True)
        self._out_thread.start()
        threading.Thread(target=self._read_channel, daemon=True).start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _read_output(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._output.append(line)
            self._logged += 1
            if self._logged <= OUTPUT_LOG_LINES:
                self._log_lines.append(line)
            elif self._logged == OUTPUT_LOG_LINES + 1:
                self._log_lines.append(f"... more output not forwarded (limit {OUTPUT_LOG_LINES} lines)")

    def _read_channel(self) -> None:
        for line in self._channel:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                msg = {"t": "log", "rank": self.rank, "line": f"unparsable channel line: {line[:200]}"}
            self._messages.append(msg)
            self._wakeup.set()
        self._channel.close()
        self.returncode = self._proc.wait()
        self._exited.set()
        self._wakeup.set()

    def drain(self) -> list[dict[str, Any]]:
        """Channel messages, then the rank's output lines as `log` messages, since the last call."""
        out: list[dict[str, Any]] = []
        while self._messages:
            out.append(self._messages.popleft())
        while self._log_lines:
            out.append({"t": "log", "rank": self.rank, "line": self._log_lines.popleft()})
        return out

    @property
    def exited(self) -> bool:
        """True once the process ended *and* every message it wrote was read."""
        return self._exited.is_set()

    def output_tail(self, lines: int = 20) -> str:
        self._out_thread.join(timeout=1.0)  # the last lines may still be in the pipe
        return "\n".join(list(self._output)[-lines:])

    def kill(self) -> None:
        """SIGKILL the rank's whole process group (it may have started children)."""
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._proc.kill()

    def reap(self, timeout: float = 10.0) -> None:
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout)
        self._exited.wait(timeout=2.0)
