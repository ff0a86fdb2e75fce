"""A rank forked from the preloaded server is what a fresh `python -c` would be, but for torch.

Each test runs the same code both ways: forked by `workers.executors._fork_server` and started
by `subprocess.Popen` as a fresh interpreter, with one environment, working folder and pair of
passed descriptors, and compares what the code saw.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.waiting import wait_until
from workers.executors._fork_server import IDLE_SERVERS, ForkedProcess, fork_server, start_rank

pytestmark = pytest.mark.slow  # interpreters that import torch

# What a rank's code sees of its process; printed as one JSON line, then a line on stderr.
REPORT = r"""
import ctypes, json, os, sys, tempfile
preloaded = "torch" in sys.modules
import torch
fd = int(os.environ["TEST_NOTE_FD"])
os.write(fd, b"through the passed pipe")
os.close(fd)
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
print(json.dumps({
    "preloaded": preloaded,
    "env": {k: v for k, v in os.environ.items() if k not in ("TEST_NOTE_FD", "TEST_PARENT")},
    "c_env": libc.getenv(b"TEST_VALUE").decode(),
    "parent": os.environ["TEST_PARENT"] == str(os.getppid()),
    "cwd": os.getcwd(),
    "path": sys.path,
    "argv": sys.argv,
    "name": __name__,
    "session_leader": os.getsid(0) == os.getpid() == os.getpgid(0),
    "stdin": os.path.realpath("/proc/self/fd/0"),
    "fds": len(os.listdir("/proc/self/fd")),
    "tmp": tempfile.gettempdir(),
    "threads": torch.get_num_threads(),
}))
print("on stderr", file=sys.stderr)
"""


def _env(tmp_path: Path, threads: str = "1") -> dict[str, str]:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return {
        "PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": threads,
        "TEST_VALUE": "seen by C", "TMPDIR": str(scratch), "TEST_PARENT": "",
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "first"), "relative"]),
    }


def _run(tmp_path: Path, code: str, *, fork: bool, env: dict[str, str] | None = None
         ) -> tuple[int, list[str], bytes]:
    """(exit code, output lines, what came through the passed pipe)."""
    env = dict(env or _env(tmp_path))
    note_read, note_write = os.pipe()
    try:
        if fork:
            proc: ForkedProcess | subprocess.Popen[bytes] = start_rank(
                sys.executable, code, env, str(tmp_path), {"TEST_NOTE_FD": note_write}, "TEST_PARENT",
                "test-rank")
        else:
            env.update(TEST_NOTE_FD=str(note_write), TEST_PARENT=str(os.getpid()))
            proc = subprocess.Popen(
                [sys.executable, "-c", code], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(note_write,),
                start_new_session=True)
    finally:
        os.close(note_write)
    assert proc.stdout is not None
    out = proc.stdout.read().decode().splitlines()
    code_ = proc.wait(timeout=120)
    with os.fdopen(note_read, "rb") as note:
        return code_, out, note.read()


def test_a_forked_rank_sees_what_a_fresh_interpreter_sees(tmp_path: Path) -> None:
    fresh_code, fresh_out, fresh_note = _run(tmp_path, REPORT, fork=False)
    forked_code, forked_out, forked_note = _run(tmp_path, REPORT, fork=True)
    assert fresh_code == forked_code == 0, (fresh_out, forked_out)
    assert fresh_note == forked_note == b"through the passed pipe"
    assert fresh_out[1] == forked_out[1] == "on stderr"  # stderr goes where stdout goes
    fresh, forked = json.loads(fresh_out[0]), json.loads(forked_out[0])
    assert (fresh.pop("preloaded"), forked.pop("preloaded")) == (False, True)
    assert fresh == forked
    assert forked["path"][:3] == ["", str(tmp_path / "first"), str(tmp_path / "relative")]
    assert forked["tmp"] == str(tmp_path / "scratch") and forked["c_env"] == "seen by C"
    assert forked["session_leader"] and forked["parent"] and forked["stdin"] == "/dev/null"


@pytest.mark.parametrize(
    ("code", "status", "output"),
    [
        ("import sys; sys.exit(3)", 3, []),
        ("import sys; sys.exit('said why')", 1, ["said why"]),
        ("raise KeyError('k')", 1, ["KeyError: 'k'"]),
        ("import atexit; atexit.register(print, 'at exit')", 0, ["at exit"]),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, []),
    ],
)
def test_a_forked_rank_ends_as_a_fresh_one_would(
    tmp_path: Path, code: str, status: int, output: list[str]
) -> None:
    code = "import os; os.close(int(os.environ['TEST_NOTE_FD']))\n" + code
    for fork in (False, True):
        returncode, out, _ = _run(tmp_path, code, fork=fork)
        assert returncode == status, (fork, out)
        assert out[-len(output):] == output if output else out == [], (fork, out)


def test_one_server_per_start_up_environment(tmp_path: Path) -> None:
    """Ranks of one environment share a server; a thread count (read by OpenMP at load) that
    differs gets a server of its own, and each rank runs with its own."""
    one, two = _env(tmp_path, "1"), _env(tmp_path, "2")
    assert fork_server(sys.executable, one) is fork_server(sys.executable, {**one, "RANK": "3"})
    assert fork_server(sys.executable, one) is not fork_server(sys.executable, two)
    for env, threads in ((one, 1), (two, 2)):
        returncode, out, _ = _run(tmp_path, REPORT, fork=True, env=env)
        assert returncode == 0 and json.loads(out[0])["threads"] == threads, out


def test_a_rank_is_named_killed_and_waited_for_like_a_popen(tmp_path: Path) -> None:
    env = _env(tmp_path)
    note_read, note_write = os.pipe()
    proc = start_rank(sys.executable, "import time; time.sleep(600)", env, str(tmp_path),
                      {"TEST_NOTE_FD": note_write}, "TEST_PARENT", "test-rank")
    os.close(note_write)
    os.close(note_read)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    assert proc.poll() is None
    assert Path(f"/proc/{proc.pid}/comm").read_text() == "test-rank\n"  # what ps -o comm and pgrep show
    server = int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert Path(f"/proc/{server}/comm").read_text() == "gdnval-ranksrv\n"
    waited = threading.Thread(target=proc.wait)  # a second waiter, as the rank's reader thread is
    waited.start()
    os.killpg(proc.pid, signal.SIGKILL)  # the rank leads its own group
    assert proc.wait(timeout=30) == -signal.SIGKILL
    waited.join(30)
    assert not waited.is_alive() and proc.poll() == -signal.SIGKILL


def test_idle_servers_beyond_the_limit_end_and_a_busy_one_stays(tmp_path: Path) -> None:
    busy_env = _env(tmp_path, "5")
    note_read, note_write = os.pipe()
    busy = start_rank(sys.executable, "import time; time.sleep(600)", busy_env, str(tmp_path),
                      {"TEST_NOTE_FD": note_write}, "TEST_PARENT", "test-rank")
    os.close(note_write)
    os.close(note_read)
    try:
        busy_server = fork_server(sys.executable, busy_env)
        idle = [fork_server(sys.executable, _env(tmp_path, str(n))) for n in (6, 7, 8, 9)]
        assert IDLE_SERVERS == 2  # of 6, 7 and 8 (9 is the newest), the two used last stay
        wait_until(lambda: not idle[0].alive, 30, "the idle server used longest ago ends")
        assert all(server.alive for server in (*idle[1:], busy_server))
    finally:
        os.killpg(busy.pid, signal.SIGKILL)
        busy.wait(30)
