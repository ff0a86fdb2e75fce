"""Rank processes forked from an interpreter that has imported torch once, not once per rank.

Importing torch costs a fresh interpreter about two CPU-seconds; a job of eight ranks pays it
eight times, all at once, on the cores its ranks then share. A fork server pays it once: it is
an interpreter started with the ranks' environment that imports `PRELOAD` (third-party code
only: never the project, whose code is the job's commit) and then forks a child per rank. The
child becomes what `python -c CODE` started with the rank's environment would be: its own
session, that environment (`os.environ` and the C environment), that working folder, the
`sys.path` a fresh interpreter would build from it, stdin from /dev/null, stdout and stderr to
the executor's pipe, and the executor's pipes as inheritable descriptors whose numbers its
variables name; `tempfile` forgets the server's folder. What is read only at start-up (by the
loader, the interpreter, OpenMP and BLAS, and torch's import: `START_UP_NAMES`,
`START_UP_PREFIXES`) must be the rank's already, so a server is started with just those of the
rank's variables and keyed by them: ranks of another thread count, hash seed or library path
get a server of their own. At most `IDLE_SERVERS` servers without a running child are kept.

A server lives as long as the process that started it: it ends when its control socket closes
(that process ended) or its parent changes; it runs in its own session, so a Ctrl-C meant for
a `gdnval run` reaches the executor, which ends its ranks itself. Its children's parent-death
signal (set by `RANK_BOOT`) ends them with it. The executor learns a child's exit status from
the server, over a socket of that child's (`ForkedProcess`, a `subprocess.Popen` look-alike).
"""

from __future__ import annotations

import array
import collections
import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO

from workers.job_env import JobUser

PRELOAD = ("torch", "torch.distributed")
# Read at start-up: by the loader and libc, the interpreter (all PYTHON* but the path, which the
# child sets), OpenMP and BLAS as they load, and torch's import (its logging, compile and JIT
# settings; numpy's). A server's environment is these of the rank's, and its key.
START_UP_NAMES = frozenset({"PATH", "LANG", "LANGUAGE"})
START_UP_PREFIXES = ("LD_", "MALLOC_", "LC_", "PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_",
                     "TORCH", "PYTORCH_", "KINETO_", "FX_", "COMPILE_", "NPY_", "NUMPY_")
IDLE_SERVERS = 2  # servers with no running child kept for later ranks; older ones are ended
START_TIMEOUT_S = 300.0  # the first rank waits for the server's imports, on a machine busy with others
MAX_FDS = 16

# The server: self-contained, like RANK_BOOT, so it imports nothing of the project.
SERVER = r"""
import array, atexit, importlib, json, os, select, signal, socket, struct, sys, tempfile, traceback

PARENT = os.getppid()
CONTROL = socket.socket(fileno=int(sys.argv[1]))


def call_me(name):
    # what ps -o comm, top and pgrep show: the command line stays the server's
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


call_me("gdnval-ranksrv")
SETTINGS = json.loads(sys.argv[2])
BASE_PATH = sys.path[1:]
# the server's environment is the part of the ranks' read at start-up: what it holds beyond
# theirs, the interpreter added at start (PEP 538's LC_CTYPE), as it will to a fresh rank's
STARTED_WITH = dict(os.environ)
for name in SETTINGS["preload"]:
    try:
        importlib.import_module(name)
    except Exception as exc:  # a rank that needs it fails the same way a fresh one would
        print("fork server: cannot preload %s: %r" % (name, exc), file=sys.stderr, flush=True)
signal.signal(signal.SIGINT, signal.SIG_IGN)
WAKE_R, WAKE_W = os.pipe()
os.set_blocking(WAKE_W, False)
signal.set_wakeup_fd(WAKE_W)
signal.signal(signal.SIGCHLD, lambda signum, frame: None)
children = {}  # pid -> its status socket


def become(request, fds):
    status, out, passed = fds[0], fds[1], fds[2:]
    os.setsid()
    call_me(request["name"])
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    env = request["env"]
    env.update({k: v for k, v in STARTED_WITH.items() if k not in env})
    for name, fd in zip(request["fd_env"], passed):
        env[name] = str(fd)
        os.set_inheritable(fd, True)
    env[request["parent_env"]] = str(os.getppid())
    keep = {0, 1, 2, *passed}
    for owner in (CONTROL, *children.values()):
        owner.detach()  # closed below: no object of the server's may close a number reused later
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    # the path a fresh `python -c` builds: "" (the working folder), PYTHONPATH made absolute,
    # then the interpreter's own, each once
    path = [""]
    for entry in [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + BASE_PATH:
        if entry not in path:
            path.append(entry)
    sys.path[:] = path
    sys.argv[:] = ["-c"]
    importlib.invalidate_caches()
    tempfile.tempdir = None
    code = 0
    try:
        main = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compile(request["code"], "<string>", "exec"), main)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr, flush=True)
            code = 1
        os._exit(code & 0xFF)


def receive(size):
    data = b""
    while len(data) < size:
        chunk = CONTROL.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def serve_one():
    # a request: its length (8 bytes, carrying the descriptors), then its JSON
    fds = array.array("i")
    try:
        head, ancdata, _, _ = CONTROL.recvmsg(8, socket.CMSG_SPACE(SETTINGS["max_fds"] * fds.itemsize))
        for level, kind, item in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(item[: len(item) - (len(item) % fds.itemsize)])
        fds = list(fds)
        if len(head) < 8:
            head += receive(8 - len(head)) if head else b""
        if not head:
            return False
        body = receive(struct.unpack("!Q", head)[0])
    except (OSError, EOFError):
        return False
    try:
        request = json.loads(body)
        pid = os.fork()
    except Exception:
        traceback.print_exc()
        for fd in fds:
            os.close(fd)
        return True
    if pid == 0:
        become(request, fds)
    for fd in fds[1:]:
        os.close(fd)
    status = socket.socket(fileno=fds[0])
    children[pid] = status
    try:
        status.sendall(b"pid %d\n" % pid)
    except OSError:
        pass
    return True


def reap():
    while children:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = children.pop(pid, None)
        if status is not None:
            try:
                status.sendall(b"exit %d\n" % os.waitstatus_to_exitcode(wait_status))
            except OSError:
                pass
            status.close()


while True:
    ready, _, _ = select.select([CONTROL, WAKE_R], [], [], 1.0)
    if WAKE_R in ready:
        os.read(WAKE_R, 512)
    reap()
    if os.getppid() != PARENT:
        break
    if CONTROL in ready and not serve_one():
        break
"""


def server_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` read at start-up: a server's environment."""
    return {k: v for k, v in env.items()
            if (k in START_UP_NAMES or k.startswith(START_UP_PREFIXES)) and k != "PYTHONPATH"}


class ForkedProcess:
    """A rank forked by a `ForkServer`, with the part of `subprocess.Popen` ranks use: `pid`,
    `stdout`, `returncode`, `poll`, `wait` and `kill`. Its exit status comes from the server."""

    def __init__(self, status: socket.socket, stdout: IO[bytes], server: ForkServer) -> None:
        self.stdout = stdout
        self.returncode: int | None = None
        self._status = status
        self._server = server
        self._exited = threading.Event()
        self.pid = int(self._line(server).removeprefix("pid "))
        threading.Thread(target=self._await_exit, name=f"gdnval-forked-{self.pid}", daemon=True).start()

    def _line(self, server: ForkServer) -> str:
        reader = self._status.makefile("rb")
        self._reader = reader
        ready, _, _ = select.select([self._status], [], [], START_TIMEOUT_S)
        line = reader.readline().decode() if ready else ""
        if not line.startswith("pid "):
            self._status.close()
            self.stdout.close()
            raise OSError(f"the rank fork server started no rank{server.describe_failure()}")
        return line.strip()

    def _await_exit(self) -> None:
        line = self._reader.readline().decode().strip()
        # no status: the server died, and its children with it (their parent-death signal)
        self.returncode = int(line.removeprefix("exit ")) if line.startswith("exit ") else -signal.SIGHUP
        self._reader.close()
        self._status.close()
        with _servers_lock:
            self._server.running -= 1
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """One preloaded interpreter (`python`, `env` less `PER_RANK`, `user`) that forks ranks."""

    def __init__(self, python: str, env: Mapping[str, str], user: JobUser | None = None) -> None:
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._lock = threading.Lock()
        self._errors: collections.deque[str] = collections.deque(maxlen=20)
        self.running = 0  # children started and not yet ended; changed under `_servers_lock`
        self.used_at = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                [python, "-c", SERVER, str(theirs.fileno()),
                 json.dumps({"preload": PRELOAD, "max_fds": MAX_FDS})],
                env=server_environment(env), cwd="/", stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(theirs.fileno(),),
                start_new_session=True, **(user.popen() if user is not None else {}),
            )
        finally:
            theirs.close()
        threading.Thread(target=self._read_errors, daemon=True).start()

    def _read_errors(self) -> None:
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            self._errors.append(raw.decode("utf-8", "replace").rstrip("\n"))
        self._proc.wait()  # the server ended (its control socket closed): no zombie is left

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def describe_failure(self) -> str:
        code = self._proc.poll()
        state = "running" if code is None else f"exited with code {code}"
        tail = "\n".join(self._errors)
        return f" (server pid {self._proc.pid} {state})" + (f":\n{tail}" if tail else "")

    def start(self, code: str, env: Mapping[str, str], cwd: str, fds: Mapping[str, int],
              parent_env: str, name: str) -> ForkedProcess:
        """Fork a child running `code` as `python -c` would, in `env` and `cwd`, with `fds` (the
        variable naming each one -> our descriptor) passed on, `parent_env` set to its parent and
        `name` as its process name (at most 15 characters kept)."""
        if len(fds) + 2 > MAX_FDS:
            raise ValueError(f"{len(fds)} descriptors to pass; a fork server passes at most {MAX_FDS - 2}")
        request = json.dumps({"code": code, "env": dict(env), "cwd": cwd, "fd_env": list(fds),
                              "parent_env": parent_env, "name": name}).encode()
        ours, status = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_read, out_write = os.pipe()
        try:
            passed: Sequence[int] = [status.fileno(), out_write, *fds.values()]
            rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", passed).tobytes())
            with self._lock:  # one request at a time on the stream: its length, then its JSON
                self._control.sendmsg([struct.pack("!Q", len(request))], [rights])
                self._control.sendall(request)
        except OSError as exc:
            ours.close()
            os.close(out_read)
            raise OSError(f"cannot reach the rank fork server: {exc}{self.describe_failure()}") from exc
        finally:
            status.close()
            os.close(out_write)
        return ForkedProcess(ours, os.fdopen(out_read, "rb"), self)


    def close(self) -> None:
        """Let the server end (at its control socket's end): for one without a running child."""
        self._control.close()


_servers: dict[tuple, ForkServer] = {}
_servers_lock = threading.RLock()


def fork_server(python: str, env: Mapping[str, str], user: JobUser | None = None) -> ForkServer:
    """This process's server for ranks of `python` with `env` as `user`: started on first use,
    started anew when the last one died; idle servers beyond `IDLE_SERVERS` are ended."""
    key = (python, None if user is None else user.uid, tuple(sorted(server_environment(env).items())))
    with _servers_lock:
        server = _servers.get(key)
        if server is None or not server.alive:
            server = _servers[key] = ForkServer(python, env, user)
            idle = sorted((s for s in _servers.values() if s.running == 0 and s is not server),
                          key=lambda s: s.used_at, reverse=True)
            for old in idle[IDLE_SERVERS:]:
                _servers.pop(next(k for k, s in _servers.items() if s is old))
                old.close()
        server.used_at = time.monotonic()
        return server


def start_rank(python: str, code: str, env: Mapping[str, str], cwd: str, fds: Mapping[str, int],
               parent_env: str, name: str, user: JobUser | None = None) -> ForkedProcess:
    """`code` forked from the server for `python`, `env` and `user` (see `ForkServer.start`)."""
    with _servers_lock:
        server = fork_server(python, env, user)
        server.running += 1
    try:
        return server.start(code, env, cwd, fds, parent_env, name)
    except BaseException:
        with _servers_lock:
            server.running -= 1
        raise
