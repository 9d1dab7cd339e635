"""The daemon under attack: each of the hardening issue's attacks, replayed against a real
`npu-manager serve` by hostile clients in processes of their own uids.

After each attack: the daemon is up, a well-behaved client of another uid is served, and
(where the attack is over) the daemon's descriptors and resident memory are back near
where they started. Round-trip latency under attack is measured by
`benchmarks/daemon_attacks.py`, not asserted here.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import npumanager as npu
from helpers.daemon_support import (
    ATTACKER,
    BACKGROUND_UID,
    FOREGROUND_UID,
    SOCKET_GID,
    WAIT_S,
    Child,
    DaemonProcess,
    Daemons,
    frames_sent,
    serve_command,
)
from npumanager.core.service.service import Service
from npumanager.daemon.server.server import Daemon
from npumanager.daemon.wire.protocol import (
    HELLO,
    FrameReader,
    Info,
    Welcome,
    encode,
    parse_daemon,
)
from npumanager.schemas import ModelLoadStatus
from npumanager.schemas.limits import (
    FRAMES_PER_TURN,
    LOG_BURST,
    OUTBOX_PAUSE_BYTES,
    REFUSED_CALLS_BURST,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving client processes their own uids needs root"
)

ATTACK_UID = 20021
GIB = 1 << 30
MIB = 1 << 20
CAN_LOAD_NOW = int(ModelLoadStatus.CAN_LOAD_NOW)
RSS_SLACK_KIB = 8 << 10
"""How far above its start the daemon's resident size may stay once an attack is over."""


class Attacker:
    """One hostile client process (see daemon_attacker.py)."""

    def __init__(
        self,
        socket_path: Path,
        kind: str,
        count: int,
        *,
        uid: int = ATTACK_UID,
        gid: int | None = None,
        per: int = 1,
        timeout: float = WAIT_S,
    ) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(ATTACKER),
                str(socket_path),
                str(uid),
                str(uid if gid is None else gid),
                str(SOCKET_GID),
                kind,
                str(count),
                str(per),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = _readline(self.process.stdout, timeout)
        assert line, f"the {kind} attacker ended without reporting"
        self.report: dict[str, Any] = json.loads(line)["ready"]

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write("exit\n")
            self.process.stdin.flush()
            self.process.wait(WAIT_S)


def _readline(stream: Any, timeout: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0] if result else ""


@pytest.fixture
def serve(daemon: Daemons) -> Callable[..., DaemonProcess]:
    """Start daemons (as subprocesses) whose socket group lets the test uids in."""

    def start(
        *args: str, nofile: tuple[int, int] | None = None, cwd: Path | None = None
    ) -> DaemonProcess:
        return daemon("--socket-group", str(SOCKET_GID), *args, nofile=nofile, cwd=cwd)

    return start


@pytest.fixture
def attackers() -> Iterator[list[Attacker]]:
    started: list[Attacker] = []
    yield started
    for attacker in started:
        attacker.close()


@pytest.fixture
def apps() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for app in started:
        app.close()


def attack(
    attackers: list[Attacker], daemon: DaemonProcess, kind: str, count: int, **kw: Any
) -> Attacker:
    attacker = Attacker(daemon.socket, kind, count, **kw)
    attackers.append(attacker)
    return attacker


def well_behaved(apps: list[Child], daemon: DaemonProcess, uid: int = FOREGROUND_UID) -> Child:
    """A client of another uid asks for a model and is answered: the daemon serves it."""
    app = Child(daemon.socket, uid)
    apps.append(app)
    assert "ready" in app.hello, app.hello
    request_id = 1 + len(app.seen)
    app.ok("request", id=request_id)
    assert app.event("decision", request_id)["status"] == CAN_LOAD_NOW
    app.ok("cancel", id=request_id)
    app.event("complete", request_id)
    return app


def baseline(daemon: DaemonProcess, apps: list[Child]) -> tuple[int, int]:
    """The daemon's descriptors and resident size once it has served a client."""
    warm = well_behaved(apps, daemon, uid=BACKGROUND_UID)
    warm.ok("info")
    warm.close()
    apps.remove(warm)
    wait_for(lambda: daemon.open_descriptors() == _settled(daemon))
    return daemon.open_descriptors(), daemon.rss_kib()


def _settled(daemon: DaemonProcess) -> int:
    time.sleep(0.05)
    return daemon.open_descriptors()


def wait_for(check: Callable[[], bool], timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def assert_recovered(daemon: DaemonProcess, start: tuple[int, int], apps: list[Child]) -> None:
    """The attack is over: up, serving, descriptors as at the start, memory near it."""
    fds, rss = start
    assert daemon.alive, daemon.log()
    for app in apps:
        app.close()
    apps.clear()
    assert wait_for(lambda: daemon.open_descriptors() <= fds), (
        f"descriptors: {daemon.open_descriptors()} open, {fds} at the start"
    )
    assert wait_for(lambda: daemon.rss_kib() <= rss + RSS_SLACK_KIB), (
        f"resident size {daemon.rss_kib()} KiB, {rss} KiB at the start"
    )
    well_behaved(apps, daemon)


def admin_info(daemon: DaemonProcess, **options: Any) -> dict[str, Any]:
    with npu.DaemonClient(daemon.socket) as admin:
        return admin.info(**options)


# 1. Identity beyond 2**31 ----------------------------------------------------------------


def test_a_uid_or_gid_of_2_to_the_31_or_more_cannot_stop_the_daemon(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker], apps: list[Child]
) -> None:
    daemon = serve()
    huge = attack(attackers, daemon, "hello", 1, uid=4294967294, gid=4294967294)
    (answer,) = huge.report["answers"]
    assert answer["op"] == "error" and "uid 4294967294 is outside" in answer["message"], answer
    big_gid = attack(attackers, daemon, "hello", 1, uid=ATTACK_UID, gid=3_000_000_000)
    (welcome,) = big_gid.report["answers"]
    assert welcome["op"] == "welcome" and welcome["gid"] == 3_000_000_000, welcome
    assert daemon.alive, daemon.log()
    well_behaved(apps, daemon)


# 2 and 3. Another's work; more than the grant ---------------------------------------------


def test_a_client_cannot_cancel_another_clients_work(
    serve: Callable[..., DaemonProcess], apps: list[Child]
) -> None:
    daemon = serve()
    victim, thief = Child(daemon.socket, BACKGROUND_UID), Child(daemon.socket, FOREGROUND_UID)
    apps += [victim, thief]
    for app in (victim, thief):
        app.ok("request", id=1)
        app.event("decision", 1)
        app.ok("load", id=1, weight_bytes=MIB)
    work = victim.ok("submit", id=1, cost_cycles=10**15)
    reply = thief.send("cancel_work", id=1, work_id=work)
    assert reply.get("error") == "UnknownWorkError", reply
    assert "not live work of model" in reply["message"]
    victim.ok("cancel_work", id=1, work_id=work)  # still the victim's, and still live


@pytest.mark.parametrize("policy", ["budget", "pressure"])
def test_a_client_cannot_load_more_than_its_grant(
    serve: Callable[..., DaemonProcess], apps: list[Child], policy: str
) -> None:
    args = ["--policy", policy] + (["--max-budget", "5"] if policy == "budget" else [])
    daemon = serve(*args)
    with npu.DaemonClient(daemon.socket) as admin:
        admin.set_uid_importance(BACKGROUND_UID, npu.IMPORTANCE_CACHED)
        admin.set_uid_importance(FOREGROUND_UID, npu.IMPORTANCE_FOREGROUND)
    background = Child(daemon.socket, BACKGROUND_UID)
    apps.append(background)
    declared = MIB if policy == "pressure" else None
    background.ok("request", id=1, size=npu.NPU_MODEL_SIZE_LESS_THAN_1GB, weight_bytes=declared)
    background.event("decision", 1)
    background.ok("load", id=1, weight_bytes=declared or GIB)
    for _ in range(5):
        reply = background.send("load_more", id=1, weight_bytes=GIB)
        assert reply.get("error") == "CapacityError", reply
        assert "request 1 was granted" in reply["message"], reply
    foreground = Child(daemon.socket, FOREGROUND_UID)
    apps.append(foreground)
    foreground.ok("request", id=2, size=npu.NPU_MODEL_SIZE_GREATER_THAN_2G)
    assert foreground.event("decision", 2)["status"] == CAN_LOAD_NOW
    foreground.ok("load", id=2, weight_bytes=4 * GIB)
    device = admin_info(daemon)["devices"][0]
    assert device["weight_memory_used_bytes"] == (declared or GIB) + 4 * GIB


# 4. Descriptors ---------------------------------------------------------------------------


def test_one_uid_cannot_take_every_descriptor(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker], apps: list[Child]
) -> None:
    daemon = serve(nofile=(256, 256))
    start = baseline(daemon, apps)
    hog = attack(attackers, daemon, "connections", 300)
    assert hog.report["held"] == 64, hog.report
    assert hog.report["refusal"]["kind"] == "QuotaExceededError", hog.report
    assert "--max-connections-per-uid" in hog.report["refusal"]["message"]
    well_behaved(apps, daemon)
    assert admin_info(daemon)["daemon"]["refused"] == 300 - 64
    hog.close()
    assert_recovered(daemon, start, apps)


def test_many_uids_fill_the_daemon_but_management_always_gets_in(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker]
) -> None:
    daemon = serve("--max-connections-per-uid", "1000", nofile=(256, 256))
    hogs = [attack(attackers, daemon, "connections", 150, uid=ATTACK_UID + i) for i in range(2)]
    held = sum(h.report["held"] for h in hogs)
    info = admin_info(daemon)  # root: management, past the limit
    assert held == info["daemon"]["max_connections"] == 256 - 32 - 16
    assert hogs[1].report["refusal"]["message"].startswith("the daemon is at its limit")


@pytest.mark.skipif(
    resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2048, reason="needs a hard limit of 2048"
)
def test_the_daemon_raises_its_descriptor_limit_to_the_hard_limit(
    serve: Callable[..., DaemonProcess],
) -> None:
    daemon = serve(nofile=(128, 2048))
    limits = Path(f"/proc/{daemon.process.pid}/limits").read_text()
    line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
    assert line.split()[3:5] == ["2048", "2048"], line
    assert admin_info(daemon)["daemon"]["max_connections"] == 2048 - 32 - 16


def test_an_idle_connection_is_closed_after_the_idle_timeout(
    serve: Callable[..., DaemonProcess], apps: list[Child]
) -> None:
    daemon = serve("--idle-timeout", "0.3")
    busy = Child(daemon.socket, BACKGROUND_UID)
    apps.append(busy)
    busy.ok("request", id=1)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.settimeout(WAIT_S)
        idle.connect(str(daemon.socket))
        idle.sendall(encode(HELLO))
        frames = _read_until_closed(idle)
    assert [f["op"] for f in frames] == ["welcome", "error"], frames
    assert "idle for 0.3 s" in frames[1]["message"]
    assert busy.ok("info")["request_counts"]["granted"] == 1, "a client holding a request stays"


def _read_until_closed(sock: socket.socket) -> list[dict[str, Any]]:
    reader, frames = FrameReader(), []
    while chunk := sock.recv(65536):
        frames += [json.loads(body) for body in reader.feed(chunk)]
    return frames


# 5 and 6. Memory --------------------------------------------------------------------------


def test_partial_frames_are_held_to_the_buffer_budget_and_memory_comes_back(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker], apps: list[Child]
) -> None:
    daemon = serve("--max-buffered-mib", "32", "--max-connections-per-uid", "1000")
    start = baseline(daemon, apps)
    flood = attack(attackers, daemon, "partial", 200)
    assert daemon.rss_kib() < start[1] + (32 + 32) * 1024, "buffers stay within the budget"
    assert admin_info(daemon)["daemon"]["dropped_over_budget"] >= 200 - 32
    flood.close()
    assert_recovered(daemon, start, apps)


def test_clients_that_never_read_are_not_served_until_they_read(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker], apps: list[Child]
) -> None:
    daemon = serve()
    start = baseline(daemon, apps)
    readers = attack(attackers, daemon, "no_read", 12, per=6000)
    assert wait_for(lambda: admin_info(daemon)["daemon"]["backpressure_pauses"] >= 12)
    stats = admin_info(daemon)["daemon"]
    # Each holds at most its pause threshold of replies, one slice more, one read of frames.
    assert stats["buffered_bytes"] <= 12 * (OUTBOX_PAUSE_BYTES + 192 * 1024), stats
    assert stats["dropped_slow"] == 0, "paused, not dropped: they may still read"
    well_behaved(apps, daemon)
    readers.close()
    assert_recovered(daemon, start, apps)


def test_one_uid_cannot_hold_more_live_requests_than_its_cap(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker], apps: list[Child]
) -> None:
    daemon = serve()
    start = baseline(daemon, apps)
    hoarder = attack(attackers, daemon, "requests", 3000)
    assert hoarder.report["errors"] == {"QuotaExceededError": 3000 - 1024}, hoarder.report
    assert sum(admin_info(daemon)["request_counts"].values()) == 1024
    hoarder.close()
    assert_recovered(daemon, start, apps)


def test_a_silent_connection_pins_nobody_elses_buffers(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker], apps: list[Child]
) -> None:
    daemon = serve()
    start = baseline(daemon, apps)
    attack(attackers, daemon, "silent", 1)
    attack(attackers, daemon, "send_and_close", 150)

    # While the silent one still waits out its 10 s hello timeout, the others are gone, and
    # so are their buffers: the event waited for is either the memory back or the silent
    # one dropped, and it must be the first (the silent one and the admin remain).
    def recovered() -> bool:
        return daemon.rss_kib() <= start[1] + RSS_SLACK_KIB

    assert wait_for(lambda: recovered() or admin_info(daemon)["daemon"]["connections"] < 2)
    assert recovered(), f"resident size {daemon.rss_kib()} KiB, {start[1]} KiB at the start"
    assert admin_info(daemon)["daemon"]["connections"] == 2, "the silent one still waits"


def test_a_dropped_connection_is_freed_at_once_without_the_garbage_collector(
    socket_dir: Path,
) -> None:
    service = Service("vnpu", "status_quo", clock="real")
    daemon = Daemon(service, socket_dir / "npu.sock")
    daemon.bind()
    thread = threading.Thread(target=daemon.serve_forever)
    thread.start()
    gc.disable()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(daemon.socket_path))
            client.sendall(encode(HELLO))
            assert wait_for(lambda: len(daemon.connections) == 1)
            connection = weakref.ref(next(iter(daemon.connections.values())))
        assert wait_for(lambda: not daemon.connections)
        assert wait_for(lambda: connection() is None), gc.get_referrers(connection())
    finally:
        gc.enable()
        daemon.stop()
        thread.join(WAIT_S)


# 7 and 8. Info at any size, and floods of it ---------------------------------------------


def test_info_stays_useful_past_eight_thousand_live_requests(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker]
) -> None:
    daemon = serve("--max-requests-per-uid", "20000")
    attack(attackers, daemon, "requests", 9000)
    command = [sys.executable, "-m", "npumanager", "info", "--socket", str(daemon.socket)]
    shown = subprocess.run(
        [*command, "--json"], check=False, capture_output=True, text=True, timeout=WAIT_S
    )
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["request_counts"]["granted"] == 9000
    assert len(document["requests"]["granted"]) == 100, "a summary by default"
    paged = subprocess.run(
        [*command, "--json", "--limit", "500", "--offset", "8900"],
        check=False,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert [r["id"] for r in json.loads(paged.stdout)["requests"]["granted"]] == list(
        range(8900, 9000)
    )
    text = subprocess.run(command, check=False, capture_output=True, text=True, timeout=WAIT_S)
    assert "9000 live requests in all: 9000 granted" in text.stdout, text.stdout


def test_a_flood_of_info_is_answered_from_a_snapshot(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker], apps: list[Child]
) -> None:
    daemon = serve()
    before = admin_info(daemon)["daemon"]["info_snapshots"]
    flood = attack(attackers, daemon, "flood_info", 5000)
    assert flood.report["answered"] == 5000
    taken = admin_info(daemon)["daemon"]["info_snapshots"] - before
    assert taken <= 4 + flood.report["seconds"] / 0.25, (taken, flood.report)
    well_behaved(apps, daemon)


# 9. Shutdown ------------------------------------------------------------------------------


def test_shutdown_takes_a_bounded_time_whatever_the_clients_do(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker]
) -> None:
    daemon = serve()
    no_read = attack(attackers, daemon, "no_read", 30, per=400)
    assert admin_info(daemon)["daemon"]["buffered_bytes"] > 0, "replies wait unread"
    # The daemon hands out its last frames for SHUTDOWN_FLUSH_S in all, then closes: it ends
    # while all 30 still hold their connections and have read nothing. Waiting for them
    # would never end; the stop's timeout only bounds that hang.
    assert daemon.stop() == 0, daemon.log()
    assert no_read.process.poll() is None, "the clients still hold their connections"


# 10. The socket's files ------------------------------------------------------------------


def _serve_once(
    socket_path: Path, *args: str, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, *serve_command(socket_path, *args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def test_a_planted_lock_symlink_is_refused_and_not_followed(socket_dir: Path) -> None:
    target = socket_dir / "owned-by-root"
    (socket_dir / "npu.sock.lock").symlink_to(target)
    result = _serve_once(socket_dir / "npu.sock")
    assert result.returncode == 2, result
    assert "npu.sock.lock is a symbolic link" in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert not target.exists() and not (socket_dir / "npu.sock").exists()


def test_a_lock_file_of_another_owner_is_refused(socket_dir: Path) -> None:
    lock = socket_dir / "npu.sock.lock"
    lock.touch()
    os.chown(lock, BACKGROUND_UID, BACKGROUND_UID)
    result = _serve_once(socket_dir / "npu.sock")
    assert result.returncode == 2 and "not a regular file owned by uid 0" in result.stderr


def test_a_clean_exit_removes_the_socket_and_the_lock(
    serve: Callable[..., DaemonProcess], socket_dir: Path
) -> None:
    daemon = serve()
    assert (socket_dir / "npu.sock.lock").exists()
    assert daemon.stop() == 0
    assert not (socket_dir / "npu.sock").exists()
    assert not (socket_dir / "npu.sock.lock").exists()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
def test_a_socket_group_that_cannot_be_set_leaves_no_socket(socket_dir: Path) -> None:
    # Root without CAP_CHOWN may give a file only a group it is in, as any other user.
    no_chown = ("setpriv", "--bounding-set", "-chown")
    result = _serve_once(
        socket_dir / "npu.sock", "--socket-group", str(SOCKET_GID), prefix=no_chown
    )
    assert result.returncode == 2, result
    assert "cannot set the group of" in result.stderr
    assert list(socket_dir.iterdir()) == [], "no socket and no lock left behind"


def test_a_missing_socket_directory_is_an_error(socket_dir: Path) -> None:
    result = _serve_once(socket_dir / "no" / "such" / "npu.sock")
    assert result.returncode == 2
    assert "does not exist; create it or choose --socket" in result.stderr
    assert not (socket_dir / "no").exists()


# 11. What info shows, and what the log says ----------------------------------------------


def test_info_shows_a_plain_client_its_own_details_and_counts_for_the_rest(
    serve: Callable[..., DaemonProcess], apps: list[Child]
) -> None:
    daemon = serve()
    mine, theirs = Child(daemon.socket, FOREGROUND_UID), Child(daemon.socket, BACKGROUND_UID)
    apps += [mine, theirs]
    with npu.DaemonClient(daemon.socket) as admin:
        admin.set_uid_importance(BACKGROUND_UID, npu.IMPORTANCE_CACHED)
        admin.set_uid_importance(FOREGROUND_UID, npu.IMPORTANCE_FOREGROUND)
    for app in (mine, theirs):
        app.ok("request", id=5)
        app.event("decision", 5)
    info = mine.ok("info")
    assert {c["uid"] for c in info["clients"]} == {FOREGROUND_UID}
    assert info["clients_total"] == 2
    assert {c["uid"] for c in info["priorities"]} == {FOREGROUND_UID}
    assert info["priorities_total"] >= 2
    assert {r["uid"] for r in info["requests"]["granted"]} == {FOREGROUND_UID}
    assert info["request_counts"]["granted"] == 2
    assert info["page"]["scope"] == "own"
    every = admin_info(daemon)
    assert {c["uid"] for c in every["clients"]} >= {FOREGROUND_UID, BACKGROUND_UID}


def test_log_lines_caused_by_clients_are_rate_limited(
    serve: Callable[..., DaemonProcess], attackers: list[Attacker]
) -> None:
    daemon = serve()
    attack(attackers, daemon, "garbage", 100)
    assert daemon.stop() == 0
    closing = [line for line in daemon.log().splitlines() if "closing uid" in line]
    assert LOG_BURST <= len(closing) <= LOG_BURST + 1, closing


# 12. Models are data -----------------------------------------------------------------------


SECRET = b"root-only: the daemon must never hand these 64 bytes to a client......"[:64]


@pytest.fixture(params=["in-daemon", "model-hosts"])
def real_daemon(
    request: pytest.FixtureRequest, socket_dir: Path, serve: Callable[..., DaemonProcess]
) -> DaemonProcess:
    """An onnxruntime daemon whose working directory holds a file only root may read;
    models opened in the daemon, or in hosts of the clients' own."""
    pytest.importorskip("onnxruntime")
    secret = socket_dir / "secret.bin"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    hosts = ("--model-hosts",) if request.param == "model-hosts" else ("--no-model-hosts",)
    return serve("--driver", "onnxruntime", *hosts, cwd=socket_dir)


def test_a_file_only_the_daemon_can_read_named_as_external_data_is_never_read(
    socket_dir: Path, real_daemon: DaemonProcess, apps: list[Child]
) -> None:
    """The runtime, given a model's bytes, would resolve `secret.bin` against the daemon's
    working directory and hand its bytes back as the output (x = 0, y = x + c)."""
    from helpers.onnx_builders import WIDTH, external_model

    daemon = real_daemon
    model = socket_dir / "thief.onnx"
    model.write_bytes(external_model("secret.bin").SerializeToString())
    model.chmod(0o644)
    thief = Child(daemon.socket, ATTACK_UID)
    apps.append(thief)
    thief.ok("request", id=1, size=0)
    assert thief.event("decision", 1)["status"] == CAN_LOAD_NOW
    loaded = thief.send("real_load", id=1, path=str(model), as_bytes=True)
    if "error" not in loaded:  # the hole: show what leaked
        leaked = thief.send("real_run", id=1, rows=1, width=WIDTH, value=0.0)
        raise AssertionError(f"a model naming secret.bin was loaded and ran: {leaked}")
    assert loaded["error"] == "IllegalArgumentError", loaded
    assert "'secret.bin', which did not come with the model" in loaded["message"]
    # by path, the client opens the weights file beside the model itself, as its own uid
    by_path = thief.send("real_load", id=1, path=str(model))
    assert by_path.get("error") == "IllegalArgumentError", by_path
    assert "cannot open the model's weights file" in by_path["message"]
    assert "Permission denied" in by_path["message"]
    assert admin_info(daemon)["devices"][0]["models_loaded"] == 0
    well_behaved(apps, daemon)


def test_weights_in_constant_nodes_count_against_the_grant(
    socket_dir: Path, real_daemon: DaemonProcess, apps: list[Child]
) -> None:
    from helpers.onnx_builders import constant_model

    daemon = real_daemon
    model = socket_dir / "constants.onnx"
    model.write_bytes(constant_model(32 * MIB).SerializeToString())
    model.chmod(0o644)
    hoarder = Child(daemon.socket, ATTACK_UID)
    apps.append(hoarder)
    hoarder.ok("request", id=1, size=0, weight_bytes=1024)
    assert hoarder.event("decision", 1)["status"] == CAN_LOAD_NOW
    for _ in range(3):
        reply = hoarder.send("real_load", id=1, path=str(model))
        assert reply.get("error") == "CapacityError", reply
        assert f"hold {32 * MIB + 16} bytes, more than the 1024 its grant" in reply["message"]
    device = admin_info(daemon)["devices"][0]
    assert (device["models_loaded"], device["weight_memory_used_bytes"]) == (0, 0)
    well_behaved(apps, daemon)


def test_models_are_counted_per_uid_across_its_connections_from_the_services_records(
    serve: Callable[..., DaemonProcess], apps: list[Child]
) -> None:
    """Two connections of one uid share its model cap; a model its request gives back
    (in the service's records) is room again at once."""
    daemon = serve("--max-models-per-uid", "2")
    first, second = Child(daemon.socket, FOREGROUND_UID), Child(daemon.socket, FOREGROUND_UID)
    apps += [first, second]
    for app in (first, second):
        app.ok("request", id=1, size=npu.NPU_MODEL_SIZE_LESS_THAN_1GB)
        assert app.event("decision", 1)["status"] == CAN_LOAD_NOW
        app.ok("load", id=1, weight_bytes=MIB)
    refused = first.send("load_more", id=1, weight_bytes=MIB)
    assert refused.get("error") == "QuotaExceededError", refused
    assert f"uid {FOREGROUND_UID} holds 2 models through the daemon" in refused["message"]
    second.ok("unloaded", id=1)
    second.event("complete", 1)
    first.ok("load_more", id=1, weight_bytes=MIB)
    assert admin_info(daemon)["devices"][0]["models_loaded"] == 2


# 13. Loads are bounded ---------------------------------------------------------------------


def test_a_flood_of_loads_is_bounded_per_connection_and_its_descriptors_come_back(
    serve: Callable[..., DaemonProcess],
    attackers: list[Attacker],
    apps: list[Child],
    model_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """400 load frames, each re-sending one descriptor, without waiting: at most
    `MAX_LOADS_PER_CONNECTION` wait at a time, the rest are refused with their descriptors
    closed (past a burst of refusals the app is held back, and its frames wait in its
    socket), and everything comes back when the client goes."""
    pytest.importorskip("onnxruntime")
    daemon = serve("--driver", "onnxruntime")
    for _ in range(2):  # the runtime's own memory is in the baseline, and its arenas warm
        warm = Child(daemon.socket, BACKGROUND_UID)
        warm.ok("request", id=1, size=0)
        assert warm.event("decision", 1)["status"] == CAN_LOAD_NOW
        warm.ok("real_load", id=1, path=str(model_file))
        warm.close()
    start = baseline(daemon, apps)
    monkeypatch.setenv("NPU_ATTACK_MODEL", str(model_file))
    flood = attack(attackers, daemon, "load_flood", 400, timeout=600)
    replies = flood.report["replies"]
    assert sum(n for kind, n in replies.items() if kind != "in_flight_refusals") == 400
    assert replies.get("in_flight_refusals", 0) >= REFUSED_CALLS_BURST, replies
    assert admin_info(daemon)["daemon"]["refusal_holds"] > 0
    assert replies.get("DaemonError", 0) == 0, replies
    # The last reply leaves before the loader's thread marks its load done: wait for that.
    idle = {"queued": 0, "running": 0}
    assert wait_for(lambda: admin_info(daemon)["daemon"]["model_loads"] == idle, timeout=120), (
        "every load was answered"
    )
    well_behaved(apps, daemon)
    flood.close()
    assert_recovered(daemon, start, apps)


def _slow_model(socket_dir: Path) -> Path:
    """A model the runtime takes seconds to open (256 MiB in a Constant node)."""
    from helpers.onnx_builders import constant_model

    big = socket_dir / "big.onnx"
    big.write_bytes(constant_model(256 * MIB).SerializeToString())
    big.chmod(0o644)
    return big


def _start_load(child: Child, model: Path) -> None:
    """Grant the child a request and have it load `model`, without waiting for the reply."""
    child.ok("request", id=1, size=0)
    assert child.event("decision", 1)["status"] == CAN_LOAD_NOW
    assert child.process.stdin is not None
    child.process.stdin.write(json.dumps({"op": "real_load", "id": 1, "path": str(model)}) + "\n")
    child.process.stdin.flush()


def test_sigterm_drops_queued_loads_and_does_not_wait_for_the_one_in_progress(
    socket_dir: Path, serve: Callable[..., DaemonProcess], apps: list[Child]
) -> None:
    """Two clients load a model that takes seconds to open; SIGTERM once one is opening
    and the other waits: the daemon ends, socket and lock removed, without either."""
    pytest.importorskip("onnxruntime")
    big = _slow_model(socket_dir)
    daemon = serve("--driver", "onnxruntime")
    for uid in (FOREGROUND_UID, BACKGROUND_UID):
        child = Child(daemon.socket, uid)
        apps.append(child)
        _start_load(child, big)
    loads = {"queued": 1, "running": 1}
    assert wait_for(lambda: admin_info(daemon)["daemon"]["model_loads"] == loads, timeout=120)
    assert daemon.stop(timeout=120) == 0, daemon.log()
    assert "1 queued model load dropped; the load in progress is not waited for" in daemon.log()
    assert not daemon.socket.exists() and not list(socket_dir.glob("*.lock"))
    for child in apps:
        reply = child.expect(lambda m: m.get("reply") == "real_load")
        assert reply.get("error") == "DaemonUnavailableError", reply


def test_a_dead_clients_queued_load_is_dropped_at_once(
    socket_dir: Path, serve: Callable[..., DaemonProcess], apps: list[Child]
) -> None:
    pytest.importorskip("onnxruntime")
    big = _slow_model(socket_dir)
    daemon = serve("--driver", "onnxruntime")
    opening, waiting = Child(daemon.socket, FOREGROUND_UID), Child(daemon.socket, BACKGROUND_UID)
    apps += [opening, waiting]
    for child, loads in ((opening, (0, 1)), (waiting, (1, 1))):
        _start_load(child, big)
        expected = dict(zip(("queued", "running"), loads, strict=True))
        assert wait_for(
            lambda e=expected: admin_info(daemon)["daemon"]["model_loads"] == e, timeout=120
        )
    fds = daemon.open_descriptors()
    waiting.kill9()
    assert wait_for(lambda: admin_info(daemon)["daemon"]["loads_dropped"] == 1)
    # The daemon's own threads open descriptors for a moment (the audit reads /proc, an
    # info call's connection): wait for the count to fall below, rather than read it once.
    assert wait_for(lambda: daemon.open_descriptors() < fds), (
        "its connection and its model's descriptor closed"
    )
    reply = opening.expect(lambda m: m.get("reply") == "real_load", timeout=120)
    assert "error" not in reply, reply
    device = admin_info(daemon)["devices"][0]
    assert device["models_loaded"] == 1, "the dead client's model was never opened"


def test_a_descriptor_that_cannot_be_read_is_the_clients_error_and_logs_nothing(
    socket_dir: Path, serve: Callable[..., DaemonProcess], model_file: Path
) -> None:
    """An O_PATH descriptor passes `fstat` as a regular file but cannot be read."""
    pytest.importorskip("onnxruntime")
    from npumanager.daemon.wire import protocol as p

    daemon = serve("--driver", "onnxruntime")
    with npu.DaemonClient(daemon.socket, uses_feature=True) as client:
        request = npu.ModelLoadRequest.Builder(1).set_size(0).build()
        with client.manager().reserve(request, timeout_s=WAIT_S):
            for _ in range(50):
                fd = os.open(model_file, os.O_PATH)
                try:
                    with pytest.raises(npu.IllegalArgumentError, match="cannot be read"):
                        client.call(p.LoadRealModel, request_id=1, descriptor=True, fds=[fd])
                finally:
                    os.close(fd)
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.log() and "internal error" not in daemon.log()


def test_a_driver_without_real_models_refuses_load_real_before_the_file_is_looked_at(
    socket_dir: Path, serve: Callable[..., DaemonProcess]
) -> None:
    """On vnpu, `load_real` is refused on the loop before its descriptor is looked at or
    a load queued (a pipe would else be refused as not a regular file): a flood of them
    costs the daemon's loader nothing."""
    from npumanager.daemon.wire import protocol as p

    daemon = serve()
    with npu.DaemonClient(daemon.socket, uses_feature=True) as client:
        request = npu.ModelLoadRequest.Builder(1).set_size(0).build()
        with client.manager().reserve(request, timeout_s=WAIT_S):
            for _ in range(3):
                read_end, write_end = os.pipe()
                try:
                    with pytest.raises(npu.IllegalArgumentError, match="runs no real models"):
                        client.call(p.LoadRealModel, request_id=1, descriptor=True, fds=[read_end])
                finally:
                    os.close(read_end)
                    os.close(write_end)
    assert daemon.stop() == 0


def test_a_clients_replies_leave_as_its_own_slice_ends(socket_dir: Path) -> None:
    """A connection's replies are written when its slice of the loop ends, not after every
    other client's slice of the turn: a flood on one connection holds no one's answer."""
    service = Service("vnpu", "budget")
    daemon = Daemon(service, socket_dir / "npu.sock")
    daemon.bind()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(daemon.socket_path))
        assert daemon._binding is not None
        daemon._accept(daemon._binding.listener, 0)
        (connection,) = daemon.transport.connections.values()
        client.sendall(encode(HELLO))
        daemon.transport.io(connection.sock, selectors.EVENT_READ)  # its slice, no more
        answer = client.recv(65536, socket.MSG_DONTWAIT)  # BlockingIOError: not yet sent
        (frame,) = FrameReader().feed(answer)
        assert isinstance(parse_daemon(frame), Welcome)
        assert not daemon.transport.dirty
    finally:
        client.close()
        daemon.stop()
        daemon.serve_forever()
        service.close()


def test_an_app_with_many_connections_gets_one_share_of_a_turn(socket_dir: Path) -> None:
    """Forty connections of one app, each with a pipeline of `info` calls, get one app's
    slice of a turn of the loop between them; another app's one call is answered in the
    same turn."""
    import dataclasses

    service = Service("vnpu", "budget")
    daemon = Daemon(service, socket_dir / "npu.sock")
    daemon.bind()
    clients = []
    try:
        for _ in range(41):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(str(daemon.socket_path))
            clients.append(client)
        assert daemon._binding is not None
        while daemon.stats.accepted < len(clients):
            daemon._accept(daemon._binding.listener, 0)
        connections = sorted(daemon.transport.connections.values(), key=lambda c: c.fd)
        for client, connection in zip(clients, connections, strict=True):
            client.sendall(encode(HELLO))
            daemon.transport.shares.new_turn()  # a turn each: all are one app's until hello
            daemon.transport.io(connection.sock, selectors.EVENT_READ)
            assert frames_sent(client) == 1, "welcomed"
        for _ in range(len(clients)):  # slow hellos left some waiting a turn: none now
            if not daemon.transport.backlog:
                break
            daemon._loop_turn()
        assert not daemon.transport.backlog
        other = connections[-1]
        assert other.app is not None
        other.app = dataclasses.replace(other.app, app_id="org.example.Other")
        pipeline = b"".join(encode(Info(seq=i)) for i in range(100))
        for client in clients[:-1]:
            client.sendall(pipeline)
        clients[-1].sendall(encode(Info(seq=1)))
        daemon._loop_turn()
        answered = [frames_sent(client) for client in clients]
        assert answered[-1] == 1, "the other app's call is answered in the same turn"
        assert 0 < sum(answered[:-1]) <= FRAMES_PER_TURN, answered
        for _ in range(3):
            daemon._loop_turn()
        assert sum(frames_sent(client) for client in clients[:-1]) > 0, "the crowd goes on"
    finally:
        for client in clients:
            client.close()
        daemon.stop()
        daemon.serve_forever()
        service.close()


def test_accepting_is_time_sliced_a_few_connections_a_turn(socket_dir: Path) -> None:
    """A storm of connections is accepted `ACCEPTS_PER_TURN` at a time: between two
    batches the loop serves every client's frames."""
    from npumanager.daemon.server.server import ACCEPTS_PER_TURN

    service = Service("vnpu", "budget")
    daemon = Daemon(service, socket_dir / "npu.sock")
    daemon.bind()
    clients = []
    try:
        for _ in range(2 * ACCEPTS_PER_TURN + 3):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(str(daemon.socket_path))
            clients.append(client)
        assert daemon._binding is not None
        listener = daemon._binding.listener
        daemon._accept(listener, 0)
        assert daemon.stats.accepted == ACCEPTS_PER_TURN
        daemon._accept(listener, 0)
        daemon._accept(listener, 0)
        assert daemon.stats.accepted == 2 * ACCEPTS_PER_TURN + 3
    finally:
        for client in clients:
            client.close()
        daemon.stop()
        daemon.serve_forever()
        service.close()
