"""`npu-manager serve` with client apps in separate processes, each with its own real uid.

The daemon runs as a subprocess (or, where a test must see the device's events, as a
`Daemon` on a thread of the test process); every app is a child process that starts as
root and drops to its uid before it connects, so who it is can only come from the kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import npumanager as npu
from helpers.daemon_support import (
    BACKGROUND_UID,
    FOREGROUND_UID,
    MANAGEMENT_GID,
    OUTSIDER_UID,
    SOCKET_GID,
    WAIT_S,
    Child,
    DaemonProcess,
    Daemons,
    daemon_on_a_thread,
    serve_command,
)
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.service.service import Service
from npumanager.daemon.peer import answers
from npumanager.daemon.wire.protocol import FrameReader, Welcome, encode
from npumanager.schemas import EndReason, ModelLoadRequestStatus, ModelLoadStatus, UnloadReason
from npumanager.schemas.limits import PROTOCOL_VERSION

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving client processes their own uids needs root"
)
GIB = 1 << 30
BIG = npu.NPU_MODEL_SIZE_GREATER_THAN_2G
CAN_LOAD_NOW = int(ModelLoadStatus.CAN_LOAD_NOW)
WAIT_FOR_UNLOAD = int(ModelLoadStatus.WAIT_FOR_UNLOAD)
COMPLETE = int(ModelLoadRequestStatus.COMPLETE)


@pytest.fixture
def start(daemon: Daemons) -> Iterator[Callable[..., DaemonProcess]]:
    """Start daemons whose socket group lets the test uids in; their `child` apps are closed
    first, then the daemons stopped (`daemon`)."""
    children: list[Child] = []

    def start_daemon(*args: str) -> DaemonProcess:
        process = daemon("--socket-group", str(SOCKET_GID), *args)
        process.children = children  # type: ignore[attr-defined]
        return process

    yield start_daemon
    for child in children:
        child.close()


def child(daemon: DaemonProcess, uid: int, **kwargs: object) -> Child:
    app = Child(daemon.socket, uid, **kwargs)  # type: ignore[arg-type]
    daemon.children.append(app)  # type: ignore[attr-defined]
    return app


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "npumanager", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


# The spec's flow, two processes, two uids ------------------------------------------------


@needs_root
@pytest.mark.parametrize("policy", ["turn_taking", "budget"])
def test_foreground_app_waits_for_background_app_to_unload(
    start: Callable[..., DaemonProcess], policy: str
) -> None:
    daemon = start("--policy", policy)
    background = child(daemon, BACKGROUND_UID)
    foreground = child(daemon, FOREGROUND_UID)
    with npu.DaemonClient(daemon.socket) as admin:
        admin.set_uid_importance(BACKGROUND_UID, npu.IMPORTANCE_CACHED)
        admin.set_uid_importance(FOREGROUND_UID, npu.IMPORTANCE_FOREGROUND)

    background.ok("auto_unload", on=False)
    background.ok("request", id=1, size=BIG, weight_bytes=3 * GIB)
    assert background.event("decision", 1)["status"] == CAN_LOAD_NOW
    background.ok("load", id=1, size=BIG, weight_bytes=3 * GIB)

    foreground.ok("request", id=1, size=BIG)
    assert foreground.event("decision", 1)["status"] == WAIT_FOR_UNLOAD
    asked = background.event("unload", 1)
    assert asked["reason"] == int(UnloadReason.HIGHER_PRIORITY_REQUEST)
    with pytest.raises(AssertionError):  # nothing more until the background app unloads
        foreground.event("decision", 1, timeout=0.3)

    background.ok("unloaded", id=1, size=BIG)
    assert background.event("complete", 1)["status"] == COMPLETE
    assert foreground.event("decision", 1)["status"] == CAN_LOAD_NOW


@needs_root
def test_identity_is_the_kernels_not_the_messages(start: Callable[..., DaemonProcess]) -> None:
    daemon = start()
    apps = [child(daemon, uid) for uid in (FOREGROUND_UID, BACKGROUND_UID)]
    for app in apps:
        ready = app.hello["ready"]
        assert ready["uid"] == ready["os_uid"] == app.uid
        assert ready["pid"] == ready["os_pid"] == app.process.pid
    with npu.DaemonClient(daemon.socket) as admin:
        assert admin.uid == os.getuid()
        clients = {(c["uid"], c["pid"]) for c in admin.info()["clients"]}
    assert {(a.uid, a.process.pid) for a in apps} <= clients

    # A hello that names a uid is not this protocol: refused, connection closed.
    reply = _raw_exchange(
        daemon.socket, [_frame({"op": "hello", "version": PROTOCOL_VERSION, "uid": 0})]
    )
    assert reply[0]["op"] == "error" and "uid" in reply[0]["message"]


@needs_root
def test_socket_admits_owner_and_group_only(start: Callable[..., DaemonProcess]) -> None:
    daemon = start()
    mode = daemon.socket.stat()
    assert stat.S_ISSOCK(mode.st_mode)
    assert stat.S_IMODE(mode.st_mode) == 0o660
    assert mode.st_gid == SOCKET_GID
    outsider = child(daemon, OUTSIDER_UID, groups=(OUTSIDER_UID,))
    assert outsider.hello["connect_error"] == "DaemonUnavailableError"
    assert "permission denied" in outsider.hello["message"]


# Permissions --------------------------------------------------------------------------


@needs_root
def test_management_calls_need_the_permission(start: Callable[..., DaemonProcess]) -> None:
    daemon = start("--policy", "budget", "--management-group", str(MANAGEMENT_GID))
    app = child(daemon, FOREGROUND_UID)
    for op, fields in [
        ("set_policy", {"policy": "status_quo"}),
        ("set_importance", {"uid": FOREGROUND_UID, "importance": 100}),
        ("set_access", {"uid": FOREGROUND_UID, "attribute": True}),
    ]:
        reply = app.send(op, **fields)
        assert reply["error"] == "NpuPermissionError", reply
        assert "management permission" in reply["message"]
    with npu.DaemonClient(daemon.socket) as admin:
        info = admin.info()
    assert info["policy"]["name"] == "budget"
    assert all(c["uid"] != FOREGROUND_UID for c in info["priorities"])

    manager = child(daemon, OUTSIDER_UID, groups=(SOCKET_GID, MANAGEMENT_GID))
    assert manager.ok("set_policy", policy="turn_taking") == "turn_taking"
    manager.ok("set_importance", uid=FOREGROUND_UID, importance=100)
    info = manager.ok("info")
    assert info["policy"]["name"] == "turn_taking"
    assert {"uid": FOREGROUND_UID, "priority": 100}.items() <= next(
        c for c in info["priorities"] if c["uid"] == FOREGROUND_UID
    ).items()


@needs_root
def test_attribution_to_another_uid_needs_can_attribute_other_uid(
    start: Callable[..., DaemonProcess],
) -> None:
    daemon = start()
    app = child(daemon, FOREGROUND_UID)
    app.ok("request", id=1)
    assert app.event("decision", 1)["status"] == CAN_LOAD_NOW
    app.ok("load", id=1, weight_bytes=1 << 20)
    assert isinstance(app.ok("submit", id=1), int)
    refused = app.send("submit", id=1, original_uid=BACKGROUND_UID)
    assert refused["error"] == "NpuPermissionError"
    with npu.DaemonClient(daemon.socket) as admin:
        admin.set_uid_access(FOREGROUND_UID, can_attribute_other_uid=True)
    assert isinstance(app.ok("submit", id=1, original_uid=BACKGROUND_UID), int)


@needs_root
def test_a_connection_acts_only_on_its_own_requests(start: Callable[..., DaemonProcess]) -> None:
    daemon = start()
    owner = child(daemon, BACKGROUND_UID)
    other = child(daemon, FOREGROUND_UID)
    owner.ok("request", id=7)
    assert owner.event("decision", 7)["status"] == CAN_LOAD_NOW
    model = owner.ok("load", id=7, weight_bytes=1 << 20)["model"]
    for op in ("cancel", "unloaded"):
        reply = other.send(op, id=7)
        assert reply["error"] == "UnknownRequestError", reply
    reply = other.send("submit_to", id=7, model=model)
    assert reply["error"] == "UnknownModelError", reply
    info = other.ok("info")
    assert info["request_counts"]["loaded"] == 1, "still loaded; the other uid sees its count"
    assert info["requests"]["loaded"] == [], "but not another uid's details"
    info = owner.ok("info")
    assert [(r["uid"], r["id"]) for r in info["requests"]["loaded"]] == [(BACKGROUND_UID, 7)]


# Death ----------------------------------------------------------------------------------


@needs_root
def test_killed_client_frees_its_share_for_the_next(start: Callable[..., DaemonProcess]) -> None:
    daemon = start("--policy", "turn_taking")
    holder = child(daemon, BACKGROUND_UID)
    waiter = child(daemon, FOREGROUND_UID)
    with npu.DaemonClient(daemon.socket) as admin:
        admin.set_uid_importance(BACKGROUND_UID, npu.IMPORTANCE_FOREGROUND)
        admin.set_uid_importance(FOREGROUND_UID, npu.IMPORTANCE_CACHED)
    holder.ok("request", id=1)
    assert holder.event("decision", 1)["status"] == CAN_LOAD_NOW
    holder.ok("load", id=1, weight_bytes=1 << 20)
    waiter.ok("request", id=1)
    waiter.expect(lambda m: m.get("event") == "decision")
    with pytest.raises(AssertionError):
        waiter.expect(lambda m: m.get("status") == CAN_LOAD_NOW, timeout=0.3)

    killed_at = time.monotonic_ns()
    holder.kill9()
    # How soon is measured in benchmarks/ipc.py; the expect's timeout only bounds a hang.
    granted = waiter.expect(
        lambda m: m.get("event") == "decision" and m.get("status") == CAN_LOAD_NOW
    )
    assert granted["at_ns"] > killed_at, "granted once the holder was killed, not before"
    with npu.DaemonClient(daemon.socket) as admin:
        info = admin.info()
    assert all(c["uid"] != BACKGROUND_UID for c in info["clients"])
    assert [r["uid"] for r in info["requests"]["granted"]] == [FOREGROUND_UID]


@needs_root
def test_killed_clients_work_ends_cancelled_system(socket_dir: Path) -> None:
    events: list[WorkEvent] = []
    service = Service("vnpu", "turn_taking", clock="real")
    service.add_listener(events.extend)
    with daemon_on_a_thread(service, socket_dir / "npu.sock", socket_group=SOCKET_GID) as daemon:
        victim = Child(daemon.socket_path, BACKGROUND_UID)
        victim.ok("request", id=1)
        victim.event("decision", 1)
        victim.ok("load", id=1, weight_bytes=1 << 20)
        work = [victim.ok("submit", id=1, cost_cycles=60_000_000_000) for _ in range(3)]
        _wait(lambda: any(e.id == work[0] and e.kind == EventKind.STARTED for e in events))
        victim.kill9()
        _wait(lambda: sum(e.kind == EventKind.ENDED and e.id in work for e in events) == 3)
        ended = {e.id: e.reason for e in events if e.kind == EventKind.ENDED}
        assert [ended[w] for w in work] == [EndReason.CANCELLED_SYSTEM] * 3
        _wait(lambda: not daemon.describe()["clients"])
        snapshot = daemon.describe()
        assert all(not requests for requests in snapshot["requests"].values())
        assert snapshot["devices"][0]["models_loaded"] == 0
        assert snapshot["daemon"]["deaths"] == 1


def _wait(condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


# Lifecycle ------------------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_completes_live_requests_and_removes_the_socket(
    start: Callable[..., DaemonProcess], sig: int
) -> None:
    daemon = start()
    app = child(daemon, FOREGROUND_UID)
    app.ok("request", id=1)
    app.event("decision", 1)
    app.ok("load", id=1, weight_bytes=1 << 20)
    app.ok("request", id=2)
    app.event("decision", 2)
    assert daemon.stop(sig) == 0, daemon.log()
    assert {app.event("complete", i)["status"] for i in (1, 2)} <= {
        COMPLETE,
        int(ModelLoadRequestStatus.CANCELLED),
    }
    assert not daemon.socket.exists()
    assert "shutting down" in daemon.log()


def test_refuses_a_second_daemon_and_replaces_a_stale_socket(socket_dir: Path) -> None:
    path = socket_dir / "npu.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: a crashed daemon's leftover
    first = DaemonProcess(socket_dir)
    try:
        second = subprocess.run(
            serve_command(path),
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        assert second.returncode == 2
        assert second.stderr.strip().splitlines() == [
            f"npu-manager: error: a daemon is already serving {path}"
        ]
        assert "replacing the stale socket" in first.log()
    finally:
        assert first.stop() == 0


def test_refuses_a_path_that_is_not_a_socket(socket_dir: Path) -> None:
    path = socket_dir / "npu.sock"
    path.write_text("not a socket")
    result = subprocess.run(
        serve_command(path), capture_output=True, text=True, timeout=WAIT_S, check=False
    )
    assert result.returncode == 2
    assert "is not a socket" in result.stderr and "Traceback" not in result.stderr
    assert path.read_text() == "not a socket"


def test_connect_without_a_daemon_says_so(socket_dir: Path) -> None:
    path = socket_dir / "none.sock"
    with pytest.raises(npu.DaemonUnavailableError, match="no npu-manager daemon is listening"):
        npu.connect(path)
    for verb in (["info"], ["set-policy", "budget"], ["set-importance", "10001", "CACHED"]):
        result = run_cli(*verb, "--socket", str(path))
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [
            f"npu-manager: error: no npu-manager daemon is listening on {path} "
            "(start one with `npu-manager serve`)"
        ]


def test_a_client_of_a_killed_daemon_gets_a_clear_error(
    start: Callable[..., DaemonProcess],
) -> None:
    daemon = start()
    manager = npu.connect(daemon.socket, uses_feature=True)
    request = npu.ModelLoadRequest.Builder(1).build()
    manager.request_can_load_model(request, npu.ModelLoadRequestCallback())
    with pytest.raises(npu.DuplicateRequestError, match="already live"):
        manager.request_can_load_model(request, npu.ModelLoadRequestCallback())
    daemon.stop(signal.SIGKILL)
    with pytest.raises(npu.DaemonUnavailableError, match="the daemon closed the connection"):
        manager.cancel_model_load(request)
    manager.close()


def test_a_remote_manager_refuses_virtual_time(start: Callable[..., DaemonProcess]) -> None:
    daemon = start()
    with npu.connect(daemon.socket) as manager:
        backend = manager._service
        assert backend.clock == "real" and not backend.quiescent()
        with pytest.raises(npu.IllegalArgumentError, match="needs a virtual clock"):
            backend.advance(1)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_descriptors_the_daemon_pauses_accepting_instead_of_spinning(
    socket_dir: Path,
) -> None:
    import resource

    path = socket_dir / "npu.sock"
    log = (socket_dir / "serve.log").open("wb")
    process = subprocess.Popen(serve_command(path), stderr=log)
    resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (64, 64))
    daemon_log = socket_dir / "serve.log"
    try:
        _wait(lambda: answers(path))
        socks = []
        for _ in range(80):  # more than the daemon has descriptors for
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))  # the kernel queues what the daemon cannot accept
            sock.sendall(HELLO)
            socks.append(sock)
        _wait(lambda: "cannot accept connections" in daemon_log.read_text())
        before = _cpu_seconds(process.pid)
        time.sleep(1.0)
        assert _cpu_seconds(process.pid) - before < 0.5, "the daemon spins on accept"
        for sock in socks[:60]:
            sock.close()
        last = socks[-1]
        last.settimeout(WAIT_S)
        (size,) = struct.unpack(">I", last.recv(4))
        assert json.loads(last.recv(size))["op"] == "welcome"  # accepted once fds came back
        for sock in socks[60:]:
            sock.close()
        with npu.DaemonClient(path) as admin:
            assert admin.info()["daemon"]["accept_pauses"] >= 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT_S) == 0, daemon_log.read_text()
        log.close()


def test_a_connection_that_never_says_hello_is_closed(socket_dir: Path) -> None:
    service = Service("vnpu", clock="real")
    with daemon_on_a_thread(service, socket_dir / "npu.sock", hello_timeout_s=0.2) as daemon:
        polite = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        polite.connect(str(daemon.socket_path))
        polite.sendall(HELLO)
        polite.settimeout(WAIT_S)
        (size,) = struct.unpack(">I", polite.recv(4))
        assert json.loads(polite.recv(size))["op"] == "welcome"  # its hello was taken
        replies = _raw_exchange(daemon.socket_path, [])
        assert replies == [
            {
                "op": "error",
                "seq": None,
                "kind": "ProtocolError",
                "message": "no hello within 0.2 s",
            }
        ]
        time.sleep(0.3)
        assert len(daemon.describe()["clients"]) == 1, "a connection that said hello stays"
        polite.close()


# The CLI verbs --------------------------------------------------------------------------


def test_cli_verbs_against_a_running_daemon(start: Callable[..., DaemonProcess]) -> None:
    daemon = start("--policy", "status_quo")
    sock = str(daemon.socket)

    changed = run_cli("set-policy", "budget", "--max-budget", "8", "--weights", "1,2,4",
                      "--socket", sock, "--json")  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout) == {
        "policy": "budget",
        "params": {"max_budget": 8, "weights": [1, 2, 4]},
    }
    assert run_cli("set-importance", "10123", "foreground", "--socket", sock).stdout == (
        "uid 10123 importance is now FOREGROUND (100)\n"
    )
    access = run_cli("set-access", "10123", "--attribute-other-uid", "--socket", sock)
    assert access.returncode == 0, access.stderr

    manager = npu.connect(daemon.socket, uses_feature=True)
    decided = threading.Event()

    class App(npu.ModelLoadRequestCallback):
        def on_can_load_model(self, request: object, status: object, listener: object) -> None:
            decided.set()

    manager.request_can_load_model(npu.ModelLoadRequest.Builder(3).set_size(1).build(), App())
    assert decided.wait(WAIT_S)

    document = json.loads(run_cli("info", "--socket", sock, "--json").stdout)
    assert document["policy"] == {
        "name": "budget",
        "params": {"weights": [1, 2, 4], "max_budget": 8},
    }
    config = next(c for c in document["priorities"] if c["uid"] == 10123)
    assert config["priority"] == 100 and config["can_attribute_other_uid"] is True
    granted = document["requests"]["granted"]
    assert [(r["id"], r["size"], r["weight"]) for r in granted] == [(3, "BETWEEN_1GB_AND_2GB", 2)]
    device = document["devices"][0]
    assert device["weight_memory_bytes"] > 0 and device["temperature_c"] > 0
    assert document["daemon"]["socket"] == sock

    text = run_cli("info", "--socket", sock).stdout
    assert "policy: budget (weights=[1, 2, 4], max_budget=8)" in text
    assert "granted" in text and "BETWEEN_1GB_AND_2GB" in text and "THERMAL" in text
    manager.close()


def test_serve_sends_telemetry_to_its_sinks(
    start: Callable[..., DaemonProcess], socket_dir: Path
) -> None:
    log = socket_dir / "events.jsonl"
    daemon = start("--sink", f"jsonl:path={log},debounce_duration_ms=50", "--sink", "memory")
    with npu.connect(daemon.socket, uses_feature=True) as manager:
        decided = threading.Event()

        class App(npu.ModelLoadRequestCallback):
            def on_can_load_model(self, request: object, status: object, listener: object) -> None:
                decided.set()

        request = npu.ModelLoadRequest.Builder(11).build()
        manager.request_can_load_model(request, App())
        assert decided.wait(WAIT_S)
        manager.cancel_model_load(request)
        _wait(lambda: json.loads(run_cli("info", "--socket", str(daemon.socket), "--json").stdout)[
            "sinks"]["memory"]["delivered"] >= 3)  # fmt: skip
    text = run_cli("info", "--socket", str(daemon.socket)).stdout
    assert "SINK" in text and "jsonl" in text and "memory" in text
    assert daemon.stop() == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    mine = [r for r in records if r.get("uid") == os.getuid() and r.get("requestId") == 11]
    assert [r["type"] for r in mine] == [
        "model_load_requested",
        "model_load_state_changed",
        "model_load_state_changed",
    ]
    assert [r.get("state") for r in mine[1:]] == ["CAN_LOAD_NOW", "CANCELLED"]
    assert any(r["type"] == "device_sample" for r in records)


@pytest.mark.parametrize(
    "spec", ["nonesuch", "jsonl:path", "jsonl:=3", ":port=1", "jsonl:max_bytes=0"]
)
def test_serve_rejects_a_bad_sink_in_one_line(socket_dir: Path, spec: str) -> None:
    path = socket_dir / "npu.sock"
    result = subprocess.run(
        [*serve_command(path), "--sink", spec],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npu-manager: error: "), result.stderr
    assert not path.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["set-policy", "status-quo", "--max-budget", "3"], "apply to the budget policy only"),
        (
            ["set-policy", "budget", "--weights", "1,x,4"],
            "--weights must be 3 comma-separated ints",
        ),
        (["set-policy", "budget", "--max-budget", "0"], "--max-budget must be 1.."),
        (["set-policy", "nonesuch"], "nonesuch"),
        (["set-importance", "10123", "VERY"], "importance must be one of FOREGROUND"),
        (["set-importance", "10123", "1001"], "a number 0..1000"),
        (["set-access", "10123"], "say what to change"),
        (["set-importance", "99999999999", "FOREGROUND"], "UID must be a uid 0..2147483647"),
        (["set-importance", "--", "-5", "FOREGROUND"], "UID must be a uid 0..2147483647; got -5"),
        (["set-access", "99999999999", "--direct-access"], "UID must be a uid 0..2147483647"),
        (["info", "--timeout", "0"], "--timeout must be more than 0"),
    ],
)
def test_cli_verbs_reject_bad_input_in_one_line(
    start: Callable[..., DaemonProcess], args: list[str], message: str
) -> None:
    daemon = start()
    if "--" in args:  # options go before the end of options
        at = args.index("--")
        args = [*args[:at], "--socket", str(daemon.socket), *args[at:]]
    else:
        args = [*args, "--socket", str(daemon.socket)]
    result = run_cli(*args)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npu-manager: error: "), result.stderr
    assert message in lines[0]
    assert daemon.alive


# Bad frames -----------------------------------------------------------------------------


def _frame(body: object) -> bytes:
    data = json.dumps(body).encode() if not isinstance(body, bytes) else body
    return struct.pack(">I", len(data)) + data


def _raw_exchange(
    path: Path, frames: list[bytes], timeout: float = WAIT_S, expect: int | None = None
) -> list[dict[str, object]]:
    """Send raw frames on a fresh connection; the daemon's frames until it closes, or until
    `expect` of them came (then this side closes)."""
    reader = FrameReader()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(path))
    replies: list[dict[str, object]] = []
    try:
        sock.sendall(b"".join(frames))
        while expect is None or len(replies) < expect:
            chunk = sock.recv(65536)
            if not chunk:
                break
            replies += [json.loads(body) for body in reader.feed(chunk)]
    finally:
        sock.close()
    return replies


HELLO = _frame({"op": "hello", "version": PROTOCOL_VERSION})


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([struct.pack(">I", (1 << 20) + 1)], "frame length 1048577 is not allowed"),
        ([struct.pack(">I", 0)], "frame length 0 is not allowed"),
        ([_frame(b"{not json")], "invalid frame"),
        ([_frame({"op": "info", "seq": 1})], "the first frame of a connection must be a hello"),
        ([_frame({"op": "hello", "version": 99})], "protocol version 99 is not supported"),
        ([HELLO, _frame({"op": "launch", "seq": 1})], "invalid frame"),
        ([HELLO, _frame({"op": "cancel", "seq": 1, "request_id": "7"})], "request_id"),
        ([HELLO, _frame({"op": "info", "seq": -1})], "seq"),
        ([HELLO, HELLO], "a connection says hello only once"),
    ],
)
def test_a_bad_frame_gets_an_error_and_the_connection_closes(
    start: Callable[..., DaemonProcess], frames: list[bytes], message: str
) -> None:
    daemon = start()
    replies = _raw_exchange(daemon.socket, frames)
    error = replies[-1]
    assert error["op"] == "error" and error.get("seq") is None
    assert error["kind"] == "ProtocolError" and message in str(error["message"])
    with npu.DaemonClient(daemon.socket) as admin:
        info = admin.info()
    assert info["daemon"]["protocol_errors"] == 1
    assert info["daemon"]["connections"] == 1 and len(info["clients"]) == 1
    assert daemon.alive


def test_a_failed_call_is_an_error_reply_and_the_connection_stays(
    start: Callable[..., DaemonProcess],
) -> None:
    daemon = start()
    replies = _raw_exchange(
        daemon.socket,
        [
            HELLO,
            _frame({"op": "cancel", "seq": 5, "request_id": 9}),
            _frame({"op": "info", "seq": 6}),
        ],
        expect=3,
    )
    assert replies[0]["op"] == "welcome"
    assert replies[1] == {
        "op": "error",
        "seq": 5,
        "kind": "UnknownRequestError",
        "message": "request 9 is not a live request of this client",
    }
    assert replies[2]["op"] == "reply" and replies[2]["seq"] == 6


def test_daemon_verbs_check_the_socket_and_give_up_after_their_timeout(socket_dir: Path) -> None:
    empty = run_cli("info", "--socket", "")
    assert empty.returncode == 2
    assert "--socket must name the daemon's socket file; got an empty path" in empty.stderr
    # A socket that accepts and never answers: the verb gives up, in one line.
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(socket_dir / "silent.sock"))
    silent.listen(1)
    try:
        result = run_cli("info", "--socket", str(socket_dir / "silent.sock"), "--timeout", "0.5")
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "cannot reach the daemon" in result.stderr and "timed out" in result.stderr
    finally:
        silent.close()
    # A daemon that welcomes the verb and never answers its call: the verb says it gave up
    # after its --timeout, not the 30 s default.
    with _mute_daemon(socket_dir / "mute.sock") as mute:
        result = run_cli("info", "--socket", str(mute), "--timeout", "0.5")
    assert result.returncode == 2, result
    assert result.stderr.strip().splitlines() == [
        "npu-manager: error: the daemon did not answer within 0.5 s"
    ], result.stderr


@contextlib.contextmanager
def _mute_daemon(path: Path) -> Iterator[Path]:
    """A socket that welcomes one client as a daemon would, then never answers it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            reader = FrameReader()
            while not list(reader.feed(connection.recv(65536))):  # its hello
                pass
            welcome = Welcome(
                version=PROTOCOL_VERSION,
                uid=0,
                pid=0,
                gid=0,
                daemon_pid=os.getpid(),
                management=True,
                app_id="uid:0",
                hal_uid=0,
            )
            connection.sendall(encode(welcome))
            while connection.recv(65536):  # until the client hangs up
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        thread.join(WAIT_S)
        listener.close()


def test_an_undeclared_feature_is_one_clean_log_line(start: Callable[..., DaemonProcess]) -> None:
    daemon = start()
    request = {"op": "request", "seq": 1, "request": {"id": 1, "size": 0, "priority": 0}}
    _raw_exchange(daemon.socket, [HELLO, _frame(request)], expect=3)
    assert daemon.stop() == 0
    lines = [line for line in daemon.log().splitlines() if "without declaring" in line]
    assert len(lines) == 1, daemon.log()
    assert "FeatureWarning: uid 0 uses the NPU without declaring the feature" in lines[0]
    assert "warnings.warn" not in daemon.log() and ".py:" not in daemon.log()


def test_info_shows_importance_names_and_the_device_of_a_loaded_model(
    start: Callable[..., DaemonProcess],
) -> None:
    daemon = start("--policy", "budget")
    sock = str(daemon.socket)
    assert run_cli("set-importance", "10123", "FOREGROUND", "--socket", sock).returncode == 0
    manager = npu.connect(daemon.socket, uses_feature=True)
    loaded = threading.Event()

    class App(npu.ModelLoadRequestCallback):
        def on_can_load_model(self, request: Any, status: object, listener: Any) -> None:
            manager.load_model(request, weight_bytes=64 << 20)
            listener.notify_model_loaded(request)
            loaded.set()

    manager.request_can_load_model(npu.ModelLoadRequest.Builder(4).set_size(0).build(), App())
    assert loaded.wait(WAIT_S)
    _wait(
        lambda: json.loads(run_cli("info", "--socket", sock, "--json").stdout)["requests"]["loaded"]
    )
    document = json.loads(run_cli("info", "--socket", sock, "--json").stdout)
    (request,) = document["requests"]["loaded"]
    assert request["device"] == 0
    config = next(c for c in document["priorities"] if c["uid"] == 10123)
    assert config["importance"] == "FOREGROUND"
    text = run_cli("info", "--socket", sock).stdout
    assert "IMPORTANCE" in text and "FOREGROUND" in text and "PINNED" in text
    row = next(line for line in text.splitlines() if line.startswith("loaded"))
    assert row.split()[-1] == "0", "the device column of a loaded request"
    manager.close()


def test_text_info_shows_the_health_readings(start: Callable[..., DaemonProcess]) -> None:
    daemon = start("--health", "linux")
    text = run_cli("info", "--socket", str(daemon.socket))
    assert text.returncode == 0, text.stderr
    assert "health:" in text.stdout, text.stdout
    rows = text.stdout.split("health:", 1)[1]
    assert "SOURCE" in rows and "linux" in rows, rows
    if Path("/proc/pressure/memory").exists():
        assert "system" in rows and "some avg10" in rows, rows


def _signal_thread(pid: int, tid: int, sig: int) -> None:
    """Send `sig` to one thread of another process (tgkill), as the kernel may pick any
    thread for a signal sent to the process."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    sys_tgkill = 234  # x86_64
    if libc.syscall(sys_tgkill, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="tgkill's syscall number is x86_64's")
def test_a_sigterm_that_lands_on_any_thread_stops_an_idle_daemon(daemon: Daemons) -> None:
    """The kernel hands a process's signal to any thread that does not block it; Python runs
    the handler on the main thread only, which sleeps in the loop's selector: the signal
    must wake it there."""
    served = daemon()
    pid = served.process.pid
    others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    assert others, "the daemon runs threads besides its main one"
    _signal_thread(pid, others[0], signal.SIGTERM)
    try:
        code = served.process.wait(WAIT_S)  # a hang guard: it exits at once or never
    except subprocess.TimeoutExpired:
        served.process.kill()
        raise AssertionError("SIGTERM on a thread other than the main one was ignored") from None
    assert code == 0, served.log()
    assert "SIGTERM: shutting down" in served.log()
