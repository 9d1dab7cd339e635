"""A daemon in a subprocess and client apps in their own processes, for the daemon tests."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npumanager.daemon.peer import answers

if TYPE_CHECKING:
    from npumanager.core.service.service import Service
    from npumanager.daemon.server.connection import Connection
    from npumanager.daemon.server.server import Daemon

# The scripts a test runs by path, each in a process of its own (they import only
# npumanager and the standard library).
CHILD = Path(__file__).with_name("daemon_child.py")
AS_USER = Path(__file__).with_name("daemon_as_user.py")
ATTACKER = Path(__file__).with_name("daemon_attacker.py")
LOAD_WORKER = Path(__file__).with_name("daemon_load.py")
SOCKET_GID = 20000
"""The group that owns the test daemon's socket; children in it may connect."""
MANAGEMENT_GID = 20010
FOREGROUND_UID = 20001
BACKGROUND_UID = 20002
OUTSIDER_UID = 20003
WAIT_S = 120.0
"""How long a test waits for an event (a reply, a daemon listening or exiting) before it is
taken as hung: only a hang outlasts it, on however busy a machine (a daemon's background
work runs under `SCHED_IDLE`, and crawls beside programs that keep the cores busy). A wait
that shows something does *not* happen passes a short timeout of its own."""

Message = dict[str, Any]


def serve_command(socket_path: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "npumanager",
        "serve",
        "--socket",
        str(socket_path),
        "--log-level",
        "debug",
        *args,
    ]


class DaemonProcess:
    """`npu-manager serve` as a subprocess, its stderr kept in a file."""

    def __init__(
        self,
        directory: Path,
        *args: str,
        name: str = "npu.sock",
        nofile: tuple[int, int] | None = None,
        user: tuple[int, int] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.socket = directory / name
        self.log_path = directory / f"{name}.log"
        self._log = self.log_path.open("wb")
        command = serve_command(self.socket, *args)
        if nofile is not None:
            command = ["prlimit", f"--nofile={nofile[0]}:{nofile[1]}", *command]
        if user is not None:  # (uid, gid): a daemon that serves as that uid (daemon_as_user.py)
            command = [sys.executable, str(AS_USER), *map(str, user), *command[4:]]
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        notify_path = directory / f"{name}.notify"
        self._notify.bind(str(notify_path))
        notify_path.chmod(0o666)  # a daemon that serves as a test uid sends to it too
        self.process = subprocess.Popen(
            command,
            stderr=self._log,
            stdout=subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, "NOTIFY_SOCKET": str(notify_path)},
        )
        self.wait_ready()

    def wait_ready(self, timeout: float = WAIT_S) -> None:
        """Wait for the daemon's ``READY=1``, as systemd waits for a ``Type=notify`` service.

        Not for the socket to listen: it listens before the daemon has started everything
        (the importance sources' inotify and pipes), and a test that counts the daemon's
        descriptors takes its baseline once they are open."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the daemon exited early:\n{self.log()}")
            self._notify.settimeout(min(0.5, max(0.0, deadline - time.monotonic())))
            try:
                if "READY=1" in self._notify.recv(4096).decode().splitlines():
                    assert answers(self.socket), "READY=1 before the socket listens"
                    return
            except TimeoutError:
                pass
        raise AssertionError(f"the daemon was not ready within {timeout} s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = WAIT_S) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout)
        self._log.close()
        self._notify.close()
        return code

    def open_descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS for the daemon")


class Child:
    """A client app in its own process with its own uid (see daemon_child.py)."""

    def __init__(
        self,
        socket_path: Path,
        uid: int,
        gid: int | None = None,
        groups: tuple[int, ...] = (),
        cgroup: Path | None = None,
    ) -> None:
        """`cgroup`: a cgroup v2 folder the process joins before it connects (its app's)."""
        self.uid = uid
        groups = groups or (SOCKET_GID,)
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                str(socket_path),
                str(uid),
                str(uid if gid is None else gid),
                ",".join(map(str, groups)),
                *([str(cgroup)] if cgroup is not None else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._messages: queue.Queue[Message | None] = queue.Queue()
        self.seen: list[Message] = []
        self._backlog: list[Message] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.hello = self.expect(lambda m: "ready" in m or "connect_error" in m)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._messages.put(json.loads(line))
        self._messages.put(None)

    def _incoming(self, timeout: float) -> Iterator[Message]:
        yield from list(self._backlog)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                message = self._messages.get(timeout=remaining)
            except queue.Empty:
                return
            if message is None:
                self._messages.put(None)
                return
            self.seen.append(message)
            self._backlog.append(message)
            yield message

    def expect(self, predicate: Callable[[Message], bool], timeout: float = WAIT_S) -> Message:
        """The first message (old or new) that matches; it is consumed."""
        for message in self._incoming(timeout):
            if predicate(message):
                self._backlog.remove(message)
                return message
        raise AssertionError(
            f"uid {self.uid}: no matching message within {timeout} s; seen {self.seen}"
        )

    def event(self, kind: str, request_id: int, timeout: float = WAIT_S) -> Message:
        return self.expect(lambda m: m.get("event") == kind and m.get("id") == request_id, timeout)

    def send(self, op: str, timeout: float = WAIT_S, **fields: Any) -> Message:
        """Run one command in the child; its reply (result or error)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        return self.expect(lambda m: m.get("reply") == op, timeout)

    def ok(self, op: str, **fields: Any) -> Any:
        reply = self.send(op, **fields)
        assert "error" not in reply, reply
        return reply["result"]

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(WAIT_S)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.write('{"op": "exit"}\n')
                self.process.stdin.flush()
                self.process.wait(WAIT_S)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(WAIT_S)


def open_socket_dir(base: str = "/tmp") -> Path:
    """A fresh directory every test uid may enter (pytest's own are private to root)."""
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="npu-daemon-", dir=base))
    os.chmod(directory, 0o755)
    return directory


@contextlib.contextmanager
def daemon_on_a_thread(service: Service, path: Path, **options: Any) -> Iterator[Daemon]:
    """A `Daemon` serving on a thread of this process, so a test can see its service."""
    from npumanager.daemon.server.server import Daemon

    daemon = Daemon(service, path, **options)
    daemon.bind()
    thread = threading.Thread(target=daemon.serve_forever)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        thread.join(WAIT_S)


class Daemons:
    """The daemons one test starts, their sockets in one directory (the `daemon` fixture).

    `daemons(*args)` is `npu-manager serve ARGS...` as a subprocess, `daemons.on_a_thread(
    service)` a `Daemon` in this process. `stop_all` (at the end of the test) stops the
    ones still running; a subprocess must then exit 0.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[DaemonProcess] = []
        self._on_threads = contextlib.ExitStack()

    def __call__(
        self,
        *args: str,
        nofile: tuple[int, int] | None = None,
        user: tuple[int, int] | None = None,
        cwd: Path | None = None,
    ) -> DaemonProcess:
        process = DaemonProcess(self.directory, *args, nofile=nofile, user=user, cwd=cwd)
        self.started.append(process)
        return process

    def on_a_thread(self, service: Service, **options: Any) -> Daemon:
        return self._on_threads.enter_context(
            daemon_on_a_thread(service, self.directory / "npu.sock", **options)
        )

    def stop_all(self) -> None:
        self._on_threads.close()
        failed = [
            f"exit {code}:\n{process.log()}"
            for process in self.started
            if process.alive and (code := process.stop()) != 0
        ]
        assert not failed, "\n".join(failed)


def frames_sent(client: socket.socket) -> int:
    """How many frames the daemon has sent `client` since the last look (read without
    waiting)."""
    from npumanager.daemon.wire.base import FrameReader

    reader, count = FrameReader(), 0
    while True:
        try:
            data = client.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return count
        count += sum(1 for _ in reader.feed(data))


@contextlib.contextmanager
def stepped_daemon(path: Path) -> Iterator[Daemon]:
    """A daemon (vnpu, budget) on `path` that a test drives turn by turn: no thread."""
    from npumanager.core.service.service import Service
    from npumanager.daemon.server.server import Daemon

    service = Service("vnpu", "budget")
    daemon = Daemon(service, path)
    daemon.bind()
    try:
        yield daemon
    finally:
        daemon.stop()
        daemon.serve_forever()
        service.close()


def welcomed(daemon: Daemon) -> tuple[socket.socket, Connection]:
    """A new client of a stepped daemon, its hello answered in a turn of its own, and its
    connection."""
    import selectors

    from npumanager.daemon.wire.protocol import HELLO, encode

    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(daemon.socket_path))
    assert daemon._binding is not None
    known = set(daemon.transport.connections)
    daemon._accept(daemon._binding.listener, 0)
    (fd,) = set(daemon.transport.connections) - known
    connection = daemon.transport.connections[fd]
    client.sendall(encode(HELLO))
    daemon.transport.shares.new_turn()
    daemon.transport.io(connection.sock, selectors.EVENT_READ)
    assert frames_sent(client) == 1, "welcomed"
    return client, connection
