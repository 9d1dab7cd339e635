"""The daemon as a systemd service: socket activation under Debian's real
`systemd-socket-activate`, READY/STOPPING/WATCHDOG on a notify socket the test listens
on, and unit files that `systemd-analyze verify` accepts."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import npumanager as npu
from helpers.daemon_support import WAIT_S, Daemons
from npumanager.cli.units import NAMES, render
from npumanager.daemon.peer import answers
from npumanager.daemon.server.systemd import Notifier, inherited_sockets, notify_address
from npumanager.errors import NpuManagerError

ACTIVATE = shutil.which("systemd-socket-activate")
needs_activate = pytest.mark.skipif(
    ACTIVATE is None, reason="needs systemd-socket-activate (Debian's systemd package)"
)
SERVE = [sys.executable, "-m", "npumanager", "serve", "--log-level", "debug"]
TRUE = shutil.which("true") or "/bin/true"


class NotifyListener:
    """A datagram socket standing in for the service manager's NOTIFY_SOCKET."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []

    def wait_for(self, state: str, timeout: float = WAIT_S) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(state in message.split("\n") for message in self.messages):
                return self.messages
            with contextlib.suppress(TimeoutError):
                self.messages.append(self.sock.recv(4096).decode())
        raise AssertionError(f"no {state} within {timeout} s; got {self.messages}")

    def collect(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                self.messages.append(self.sock.recv(4096).decode())

    def count(self, state: str) -> int:
        return sum(state in message.split("\n") for message in self.messages)

    def wait_count(self, state: str, times: int) -> None:
        """Receive until `state` came `times` times (an event), within `WAIT_S`."""
        deadline = time.monotonic() + WAIT_S
        while self.count(state) < times:
            assert time.monotonic() < deadline, (state, times, self.messages)
            self.collect(0.1)


def activated(socket_path: Path, notify: str, *extra_env: str) -> subprocess.Popen[bytes]:
    assert ACTIVATE is not None
    env = [f"--setenv=NOTIFY_SOCKET={notify}", *(f"--setenv={e}" for e in extra_env)]
    # systemd-socket-activate passes on only what it is told to: keep this test's import path.
    env += [f"--setenv={name}" for name in ("PYTHONPATH",) if name in os.environ]
    return subprocess.Popen(
        [ACTIVATE, "--listen", str(socket_path), "--fdname=npu", *env, *SERVE],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stop(process: subprocess.Popen[bytes], listener: NotifyListener) -> None:
    """SIGTERM: the daemon says STOPPING=1 and exits cleanly."""
    process.send_signal(signal.SIGTERM)
    listener.wait_for("STOPPING=1")
    assert process.wait(WAIT_S) == 0


def reap(process: subprocess.Popen[bytes]) -> str:
    """Kill the process if it is still running; its stderr."""
    if process.poll() is None:
        process.kill()
    return process.communicate()[1].decode()


@needs_activate
def test_socket_activation_serves_the_inherited_socket_and_notifies(socket_dir: Path) -> None:
    path = socket_dir / "npu.sock"
    listener = NotifyListener(str(socket_dir / "notify"))
    process = activated(path, str(socket_dir / "notify"), "WATCHDOG_USEC=200000")
    try:
        deadline = time.monotonic() + WAIT_S
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        # systemd-socket-activate starts the daemon on the first connection.
        with npu.DaemonClient(path) as client:
            info = client.info()
        assert info["daemon"]["socket"] == str(path)
        assert info["daemon"]["pid"] == process.pid, "the daemon is the activated process"
        messages = listener.wait_for("READY=1")
        ready = next(m for m in messages if "READY=1" in m.split("\n"))
        assert f"MAINPID={process.pid}" in ready and f"STATUS=serving on {path}" in ready
        # WATCHDOG_USEC of 0.2 s: a WATCHDOG=1 every 0.1 s, so three come soon; how soon is
        # the machine's business, that they keep coming is the daemon's.
        listener.wait_count("WATCHDOG=1", 3)
        stop(process, listener)
    finally:
        stderr = reap(process)
    assert "serving the socket systemd passed" in stderr, stderr
    assert f"serving on {path}:" in stderr, "the log names the socket systemd passed"
    assert "removed" not in stderr and f"{path} is left to systemd" in stderr, stderr
    assert path.exists(), "an inherited socket belongs to its socket unit: it is left in place"


@needs_activate
def test_an_abstract_notify_socket_is_used(socket_dir: Path) -> None:
    name = f"npu-test-{os.getpid()}"
    listener = NotifyListener(b"\0" + name.encode())
    path = socket_dir / "npu.sock"
    process = activated(path, f"@{name}")
    try:
        deadline = time.monotonic() + WAIT_S
        while not answers(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        listener.wait_for("READY=1")
        stop(process, listener)
    finally:
        reap(process)


def test_notify_addresses() -> None:
    assert notify_address({"NOTIFY_SOCKET": "/run/systemd/notify"}) == "/run/systemd/notify"
    assert notify_address({"NOTIFY_SOCKET": "@abc"}) == b"\0abc"
    assert notify_address({}) is None
    assert notify_address({"NOTIFY_SOCKET": "relative"}) is None
    assert Notifier({}).notify("READY=1") is False, "outside systemd nothing is sent"
    assert Notifier({"WATCHDOG_USEC": "3000000"}).watchdog_s == 1.5
    assert Notifier({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "1"}).watchdog_s is None


def test_activation_variables_for_another_process_are_ignored_and_removed() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "npu", "HOME": "/root"}
    assert inherited_sockets(env) == []
    assert env == {"HOME": "/root"}, "read once, not passed on to children"
    with pytest.raises(NpuManagerError, match="must be numbers"):
        inherited_sockets({"LISTEN_PID": "x", "LISTEN_FDS": "1"})


def test_an_inherited_descriptor_that_is_not_a_socket_is_one_line(socket_dir: Path) -> None:
    # Descriptor 3 is /dev/null, and LISTEN_PID names the exec'd daemon (same pid).
    launcher = (
        "import os, sys; os.dup2(os.open('/dev/null', os.O_RDONLY), 3); "
        "os.set_inheritable(3, True); "
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); "
        "os.execv(sys.executable, sys.argv[1:])"
    )
    result = subprocess.run(
        [sys.executable, "-c", launcher, *SERVE, "--socket", str(socket_dir / "x.sock")],
        check=False,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert result.returncode == 2, result
    assert "inherited descriptor 3 (fd3) is not a socket" in result.stderr
    assert "Traceback" not in result.stderr


# Unit files ---------------------------------------------------------------------------


def test_units_print_every_file_with_where_it_goes() -> None:
    result = subprocess.run(
        # An --exec outside the folders the unit's sandbox hides (this venv's Python may not be).
        [sys.executable, "-m", "npumanager", "units", "--driver", "openvino", "--exec", TRUE],
        check=True,
        capture_output=True,
        text=True,
    )
    for place in (
        "# /etc/systemd/system/npu-manager.socket",
        "# /etc/systemd/system/npu-manager.service",
        "# /etc/sysusers.d/npu-manager.conf",
    ):
        assert place in result.stdout
    assert "ListenStream=/run/npu-manager/npu.sock" in result.stdout
    assert f"ExecStart={TRUE} serve --driver openvino" in result.stdout
    for key in ("Type=notify", "WatchdogSec=", "RuntimeDirectory=", "MemoryPressureWatch="):
        assert key in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "npumanager", "units", "bogus"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "no unit named 'bogus'; the units are npu-manager.socket" in bad.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    executable = tmp_path / "npu-manager"
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    for name in NAMES[:2]:
        (tmp_path / name).write_text(render(name, executable=str(executable)))
    result = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / n) for n in NAMES[:2])],
        check=False,
        capture_output=True,
        text=True,
    )
    complaints = [
        line
        for line in result.stderr.splitlines()
        # systemd before 254 does not know MemoryPressureWatch= and says so; that is all.
        if "MemoryPressureWatch" not in line and line.strip()
    ]
    assert result.returncode == 0 and complaints == [], result.stderr


def test_clients_find_the_system_services_socket_when_they_have_no_daemon_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from npumanager.daemon import peer

    system = tmp_path / "run" / "npu.sock"
    monkeypatch.setattr(peer, "SYSTEM_SOCKET_PATH", str(system))
    (tmp_path / "user").mkdir(mode=0o700)  # platformdirs takes only a private runtime dir
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "user"))
    monkeypatch.delenv("NPUMANAGER_SOCKET", raising=False)
    user = tmp_path / "user" / "npu-manager" / "npu.sock"
    assert peer.default_socket_path() == user, "neither exists: the error names the user's"
    system.parent.mkdir(parents=True)
    system.touch()
    assert peer.default_socket_path() == system
    user.parent.mkdir(parents=True)
    user.touch()
    assert peer.default_socket_path() == user, "a user's own daemon comes first"
    monkeypatch.setenv("NPUMANAGER_SOCKET", "/elsewhere.sock")
    assert peer.default_socket_path() == Path("/elsewhere.sock")


def test_ready_is_said_once_the_importance_sources_run(daemon: Daemons) -> None:
    """READY=1 means serving with everything started: a client that comes at once is ranked
    by the sources, and the daemon opens no descriptor of its own after it."""
    started: list[str] = []

    class Source:
        def start(self, changed: object) -> None:
            started.append("started")

        def importance(self, app: object) -> None:
            return None

        def close(self) -> None:
            pass

    class Recording(Notifier):
        def notify(self, *states: str) -> bool:
            if "READY=1" in states:
                started.append("READY=1")
            return super().notify(*states)

    daemon.on_a_thread(
        npu.Service("vnpu", "status_quo", clock="real"),
        notifier=Recording({}),
        importance_sources=[("recording", Source())],  # type: ignore[list-item]
    )
    deadline = time.monotonic() + WAIT_S
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started == ["started", "READY=1"]
