"""One rank as a child process running `workers.runtime`, read through its channel pipe.

Used by the local executor directly and by each Ray rank actor on its node, so both executors
start, read, kill and diagnose ranks the same way.

A rank's process tree ends with the rank and with its parent (the executor):

- the rank leads its own process group and session; the executor stops it with SIGTERM, then
  SIGKILLs the whole group after `TERM_GRACE_S`;
- the rank boots through `RANK_BOOT`, which makes it a child subreaper (orphaned descendants,
  even `setsid` ones, are re-parented to the rank instead of init), asks the kernel for SIGHUP
  when its parent dies (`PR_SET_PDEATHSIG`) and also polls its parent id, and on SIGTERM, on its
  parent's death and at its normal end kills every descendant it has;
- what still escapes: a process that left the tree while the rank itself was SIGKILLed (a
  `setsid` child outlives a `kill -9` of its rank), since only cgroups (a container, a systemd
  scope) can end a tree whose root died without warning.

With `user` (`GDNVAL_JOB_USER`, `workers.job_env.job_user`) the rank runs as that user, its
folder handed to it.

A rank also beats: its guard thread writes a byte every second to a pipe of its own
(`BEAT_FD_ENV`), whatever its main thread does, and `RankProcess.silent_s` is how long nothing
(beat, message or output) came from it. A rank that is stopped (SIGSTOP) or frozen beats no
more, so the executor can end its job at the stall limit instead of at the deadline.

Each rank gets a folder of its own in the system temporary folder (`TMP_PREFIX`, its rank and
its executor's pid): `artifacts/` (`RANK_TMP_ENV`) and `tmp/`, which is the rank's TMPDIR, so
what the rank's code puts in temporary files (token files, compiler scratch) goes too. The folder
is removed when the rank exits; folders of ranks whose executor is gone (it was killed) are
removed by `remove_stale_folders` (with the Ray driver's staging folders of a driver that was
killed), which every executor calls when it starts.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.executors._fork_server import ForkedProcess, start_rank
from workers.job_env import JobUser, pid_alive
from workers.runtime import CHANNEL_FD_ENV, PAYLOAD_ENV, RANK_TMP_ENV

OUTPUT_TAIL_LINES = 40
TMP_PREFIX = "gdnval-rank"  # + "<rank>-p<executor pid>-": a rank's folder in the temporary folder
SHIP_PREFIX = "gdnval-ship"  # + "-p<driver pid>-": where the Ray driver stages a job's code
TERM_GRACE_S = 2.0  # after SIGTERM, how long a rank may take to end its tree before SIGKILL
PARENT_ENV = "GDNVAL_RANK_PARENT"
LIFE_FD_ENV = "GDNVAL_RANK_LIFE_FD"  # read end of a pipe only the executor writes: EOF = end now
BEAT_FD_ENV = "GDNVAL_RANK_BEAT_FD"  # write end of a pipe the rank's guard beats into, once a second

# The rank's first code: kept self-contained (it runs from `-c`, before the snapshot of a job's
# commit is imported), so a commit that predates it still gets its tree guarded.
RANK_BOOT = r"""
import ctypes, os, runpy, signal, sys, threading, time

PARENT = int(os.environ.get("GDNVAL_RANK_PARENT") or os.getppid())


def descendants():
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry, "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def end_tree():
    for _ in range(5):  # a child may fork while we kill: repeat until none is left
        pids = descendants() if os.path.isdir("/proc") else []
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def orphaned():
    if os.getppid() != PARENT:
        end_tree()
        os._exit(70)


def on_term(signum, frame):
    end_tree()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


BEAT = int(os.environ.get("GDNVAL_RANK_BEAT_FD") or -1)


def watch():
    ticks = 0
    while True:
        time.sleep(0.2)
        orphaned()
        ticks += 1
        if BEAT >= 0 and ticks % 5 == 0:  # alive, whatever the main thread does
            try:
                os.write(BEAT, b".")
            except OSError:
                pass


def life(fd):
    # EOF when the executor closes its end (it ends the rank) or dies: a thread, so it acts even
    # while the main thread is blocked in a collective
    try:
        while os.read(fd, 64):
            pass
    except OSError:
        pass
    end_tree()
    os._exit(143)


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGHUP, lambda signum, frame: orphaned())
try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    libc.prctl(1, int(signal.SIGHUP), 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass  # not Linux: the parent watch below still ends the tree
orphaned()  # the parent may have died before PR_SET_PDEATHSIG took effect
if BEAT >= 0:
    os.set_blocking(BEAT, False)  # a reader that fell behind never blocks the guard
threading.Thread(target=watch, name="gdnval-tree-guard", daemon=True).start()
if os.environ.get("GDNVAL_RANK_LIFE_FD"):
    threading.Thread(target=life, args=(int(os.environ["GDNVAL_RANK_LIFE_FD"]),), name="gdnval-life",
                     daemon=True).start()
code = 0
try:
    runpy.run_module("workers.runtime", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
finally:
    end_tree()
sys.exit(code)
"""
OUTPUT_LOG_LINES = 2000  # output lines per rank forwarded as job log lines; the rest only in the tail


def remove_stale_folders(root: str | Path | None = None) -> list[Path]:
    """Remove the rank folders and the Ray driver's staging folders (in `root`, default the
    temporary folder) whose process is gone: what ranks and drivers left when they were killed.
    Returns what was removed."""
    removed = []
    base = Path(root or tempfile.gettempdir())
    for folder in [*base.glob(f"{TMP_PREFIX}*-p*-*"), *base.glob(f"{SHIP_PREFIX}-p*-*")]:
        owner = folder.name.split("-p", 1)[1].split("-", 1)[0]
        if owner.isdigit() and folder.is_dir() and not pid_alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


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
        user: JobUser | None = None,
        fork: bool = False,
    ) -> None:
        """`fork`: fork the rank from this process's preloaded server for `python` and the rank's
        environment (`workers.executors._fork_server`) instead of starting a fresh interpreter."""
        self.rank = rank
        self._messages: collections.deque[dict[str, Any]] = collections.deque()
        self._output: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        self._log_lines: collections.deque[str] = collections.deque()
        self._logged = 0
        self._wakeup = wakeup or threading.Event()
        self._exited = threading.Event()
        self.returncode: int | None = None
        self.heard_at = time.monotonic()  # the last beat, message or output line
        # the rank's folder is ours: removed when the rank exits, however it ends
        self.tmpdir = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{rank}-p{os.getpid()}-")
        scratch = {name: os.path.join(self.tmpdir, name) for name in ("artifacts", "tmp")}
        for folder in scratch.values():
            os.mkdir(folder)
        read_fd, write_fd = os.pipe()
        life_read, self._life = os.pipe()  # our end is close-on-exec: no other child holds it
        beat_read, beat_write = os.pipe()
        child_env = {**env, PAYLOAD_ENV: json.dumps(dict(payload)), CHANNEL_FD_ENV: str(write_fd),
                     PARENT_ENV: str(os.getpid()), LIFE_FD_ENV: str(life_read),
                     BEAT_FD_ENV: str(beat_write), RANK_TMP_ENV: scratch["artifacts"],
                     **dict.fromkeys(("TMPDIR", "TMP", "TEMP"), scratch["tmp"])}
        if user is not None:  # the rank runs as the job user: its folder is the user's
            user.hand_over(self.tmpdir)
            child_env["HOME"] = user.home_or(scratch["tmp"])
        try:
            self._proc: subprocess.Popen[bytes] | ForkedProcess = start_rank(
                python, RANK_BOOT, child_env, str(cwd) if cwd else os.getcwd(),
                {CHANNEL_FD_ENV: write_fd, LIFE_FD_ENV: life_read, BEAT_FD_ENV: beat_write}, PARENT_ENV,
                f"gdnval-rank{rank}", user,
            ) if fork else subprocess.Popen(
                [python, "-c", RANK_BOOT],
                env=child_env,
                cwd=str(cwd) if cwd else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd, life_read, beat_write),
                # Own session: killing the rank's group also kills what it started. No preexec_fn
                # (unsafe in threaded parents such as the service and Ray workers): the rank sets
                # its own parent-death signal and subreaper flag in RANK_BOOT.
                start_new_session=True,
                **(user.popen() if user is not None else {}),
            )
        except BaseException:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            for fd in (beat_read, read_fd, self._life):
                os.close(fd)
            raise
        finally:
            os.close(write_fd)
            os.close(life_read)
            os.close(beat_write)
        self._channel = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        self._out_thread = threading.Thread(target=self._read_output, daemon=True)
        self._out_thread.start()
        threading.Thread(target=self._read_channel, daemon=True).start()
        threading.Thread(target=self._read_beats, args=(beat_read,), daemon=True).start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def silent_s(self) -> float:
        """Seconds since the rank last beat, wrote a message or printed a line."""
        return time.monotonic() - self.heard_at

    def _read_beats(self, fd: int) -> None:
        try:
            while os.read(fd, 64):
                self.heard_at = time.monotonic()
        except OSError:
            pass
        finally:
            os.close(fd)

    def _read_output(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            self.heard_at = time.monotonic()
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._output.append(line)
            self._logged += 1
            if self._logged <= OUTPUT_LOG_LINES:
                self._log_lines.append(line)
            elif self._logged == OUTPUT_LOG_LINES + 1:
                self._log_lines.append(f"... more output not forwarded (limit {OUTPUT_LOG_LINES} lines)")

    def _read_channel(self) -> None:
        for line in self._channel:
            self.heard_at = time.monotonic()
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                msg = {"t": "log", "rank": self.rank, "line": f"unparsable channel line: {line[:200]}"}
            self._messages.append(msg)
            self._wakeup.set()
        self._channel.close()
        self.returncode = self._proc.wait()
        shutil.rmtree(self.tmpdir, ignore_errors=True)  # a killed or timed-out rank left it
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

    def terminate(self) -> None:
        """Ask the rank to end: it kills its descendants, then itself (its life pipe closes, which
        a thread of the rank sees even while its main thread is blocked; and SIGTERM)."""
        if self._life >= 0:
            with contextlib.suppress(OSError):
                os.close(self._life)
            self._life = -1
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the rank's whole process group (it may have started children), even when the
        rank itself already exited and left members of its group behind."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if self._proc.poll() is None:
                self._proc.kill()

    def reap(self, timeout: float = 10.0) -> None:
        """End the rank (SIGTERM, `TERM_GRACE_S`, then SIGKILL of its group) and wait for it."""
        end_ranks([self], timeout=timeout)


def end_ranks(procs: list[RankProcess], grace_s: float = TERM_GRACE_S, timeout: float = 10.0) -> None:
    """End every rank of a job together: SIGTERM to all (each ends its own tree), up to `grace_s`
    for them to go, then SIGKILL every rank's group, and wait for the processes."""
    for p in procs:
        p.terminate()
    end = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p._proc.wait(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        p.kill()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p._proc.wait(timeout=timeout)
        p._exited.wait(timeout=2.0)
