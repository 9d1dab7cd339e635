"""Model hosts (`serve --model-hosts`): each connection's models are parsed, opened and run
in a process of its own, confined and unprivileged; its death ends only its own models.

Real daemons, real clients of their own uids, real host processes; every wait is for an
event (a /proc entry, an info field), with a generous bound that only ends a hang.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers.daemon_support import BACKGROUND_UID, FOREGROUND_UID, DaemonProcess
from npumanager.daemon.host.client import NOBODY, host_identity

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving client processes their own uids needs root"
)

from helpers.real_daemon import (  # noqa: E402
    app,
    granted,
    in_process_digest,
    info,
    loaded_app,
    stopped,
    wait_for,
)

LONG_ROWS = 120_000


def hosted(start: Callable[..., DaemonProcess]) -> DaemonProcess:
    return start("--model-hosts")


def host_pid(daemon: DaemonProcess, uid: int) -> int:
    (pid,) = [c["host_pid"] for c in info(daemon)["clients"] if c["uid"] == uid]
    assert isinstance(pid, int), info(daemon)["clients"]
    return pid


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def gone(pid: int) -> bool:
    try:
        return status(pid).get("State", "").startswith("Z")
    except FileNotFoundError:
        return True


def ended(events: Path, uid: int) -> list[dict[str, Any]]:
    import json

    lines = events.read_text().splitlines() if events.exists() else []
    return [e for e in map(json.loads, lines) if e.get("kind") == "ENDED" and e.get("uid") == uid]


def test_a_clients_models_run_in_a_confined_host_of_its_own_uid(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    daemon = hosted(start_onnxruntime)
    app = loaded_app(daemon, FOREGROUND_UID, model_file)
    assert app.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    pid = host_pid(daemon, FOREGROUND_UID)
    assert pid != daemon.process.pid
    seen = status(pid)
    assert seen["Uid"].split() == [str(FOREGROUND_UID)] * 4, "the app's own uid, never root"
    assert seen["Groups"].strip() == "", "no supplementary groups"
    assert seen["NoNewPrivs"].strip() == "1"
    assert seen["Seccomp"].strip() == "2", "a seccomp filter"
    assert os.readlink(f"/proc/{pid}/cwd").endswith("(deleted)"), "an empty, removed cwd"
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    assert info(daemon)["daemon"]["model_hosts"]["started"] == 1


def test_root_and_the_daemons_own_uid_get_nobody() -> None:
    assert host_identity(0, 0) == (NOBODY, NOBODY)
    assert host_identity(os.geteuid(), 0) == (NOBODY, NOBODY)
    assert host_identity(FOREGROUND_UID, 0) == (FOREGROUND_UID, NOBODY)
    assert host_identity(FOREGROUND_UID, FOREGROUND_UID) == (FOREGROUND_UID, FOREGROUND_UID)


def test_a_killed_client_takes_its_host_and_running_work_with_it(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    daemon = hosted(start_onnxruntime)
    other = loaded_app(daemon, FOREGROUND_UID, model_file)
    doomed = loaded_app(daemon, BACKGROUND_UID, model_file)
    pid = host_pid(daemon, BACKGROUND_UID)
    doomed.ok("real_submit", id=1, rows=LONG_ROWS)
    wait_for(lambda: any(d["running"] for d in info(daemon)["devices"]))
    doomed.kill9()
    wait_for(lambda: gone(pid))
    wait_for(lambda: info(daemon)["devices"][0]["running"] == 0)
    assert other.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)


def test_a_crashed_host_ends_only_its_apps_models_and_the_next_load_works(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    events = socket_dir / "events.jsonl"
    daemon = hosted(
        lambda *a: start_onnxruntime(*a, "--sink", f"jsonl:path={events},debounce_duration_ms=10")
    )
    other = loaded_app(daemon, FOREGROUND_UID, model_file)
    victim = loaded_app(daemon, BACKGROUND_UID, model_file)
    pid = host_pid(daemon, BACKGROUND_UID)
    victim.ok("real_submit", id=1, rows=LONG_ROWS)
    wait_for(lambda: any(d["running"] for d in info(daemon)["devices"]))
    os.kill(pid, signal.SIGSEGV)
    wait_for(lambda: bool(ended(events, BACKGROUND_UID)))
    assert [e["reason"] for e in ended(events, BACKGROUND_UID)] == ["CANCELLED_SYSTEM"]
    wait_for(lambda: info(daemon)["daemon"]["model_hosts"]["died"] == 1)
    again = victim.send("real_run", id=1, rows=4, value=0.5)
    assert again.get("error") == "ModelHostError", again
    assert "killed by SIGSEGV" in again["message"] and "load it again" in again["message"]
    assert other.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    granted(victim, 2)
    victim.ok("real_load", id=2, path=str(model_file))
    assert victim.ok("real_run", id=2, rows=4, value=0.5) == in_process_digest(4, 0.5)
    assert host_pid(daemon, BACKGROUND_UID) != pid
    assert daemon.alive


FILTERED = r"""
import ctypes, socket
from npumanager.daemon.host import seccomp
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # no new privileges, as the host sets first
seccomp.install()
refused = []
for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):
    try:
        socket.socket(family, socket.SOCK_DGRAM).close()
    except PermissionError:
        refused.append(family.name)
socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
for name, call in (("ptrace", lambda: libc.ptrace(0, 1, 0, 0)),
                   ("unshare", lambda: libc.unshare(0x20000)),
                   ("mount", lambda: libc.mount(b"none", b"/", None, 0, None))):
    if call() == -1 and ctypes.get_errno() == 1:
        refused.append(name)
print(" ".join(refused))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the filter is built for x86_64")
def test_the_hosts_seccomp_filter_refuses_network_sockets_tracing_and_mounting() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FILTERED], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "AF_INET",
        "AF_INET6",
        "AF_NETLINK",
        "ptrace",
        "unshare",
        "mount",
    ]


def test_a_host_that_does_not_answer_within_its_limit_is_killed() -> None:
    """A stopped host (SIGSTOP: it can never answer) is killed once `answer_s` has passed
    on a request, and says so; the limit is what is under test, not the machine's speed."""
    from npumanager.daemon.host.client import HostSettings, ModelHost
    from npumanager.errors import ModelHostError
    from npumanager.vendor_drivers.realexec.chain import chain_model

    host = ModelHost(HostSettings("onnxruntime", answer_s=1.0), FOREGROUND_UID, FOREGROUND_UID)
    try:
        os.kill(host.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(host.pid))
        with pytest.raises(ModelHostError, match="did not answer count within 1.0 s"):
            host.count(chain_model(), {})
        wait_for(lambda: gone(host.pid))
        with pytest.raises(ModelHostError, match="the model host was stopped"):
            host.count(chain_model(), {})
    finally:
        host.kill()


def test_a_client_killed_mid_load_stops_its_load_and_the_daemon_keeps_none_of_it(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    """The model (256 MiB) is parsed and opened in the host: kill -9 the client while its
    host opens it, and the host is gone, the loader free, the daemon as big as before."""
    import json

    from helpers.onnx_builders import constant_model

    big = socket_dir / "big.onnx"
    big.write_bytes(constant_model(256 << 20).SerializeToString())
    big.chmod(0o644)
    daemon = hosted(start_onnxruntime)
    loaded_app(daemon, BACKGROUND_UID, model_file).close()  # the daemon warm, a host come and gone
    baseline = daemon.rss_kib()
    loader = app(daemon, FOREGROUND_UID)
    granted(loader)
    assert loader.process.stdin is not None
    loader.process.stdin.write(json.dumps({"op": "real_load", "id": 1, "path": str(big)}) + "\n")
    loader.process.stdin.flush()
    wait_for(lambda: info(daemon)["daemon"]["model_loads"] == {"queued": 0, "running": 1})
    wait_for(lambda: isinstance(host_of(daemon, FOREGROUND_UID), int))
    pid = host_of(daemon, FOREGROUND_UID)
    loader.kill9()
    wait_for(lambda: gone(pid))
    wait_for(lambda: info(daemon)["daemon"]["model_loads"] == {"queued": 0, "running": 0})
    wait_for(lambda: daemon.rss_kib() <= baseline + (16 << 10))
    assert info(daemon)["devices"][0]["models_loaded"] == 0


def host_of(daemon: DaemonProcess, uid: int) -> int | None:
    pids = [c["host_pid"] for c in info(daemon)["clients"] if c["uid"] == uid]
    return pids[0] if pids else None


DAEMON_THAT_DIES = r"""
import sys, threading
import numpy as np
sys.path.insert(0, sys.argv[1])
from helpers.real_daemon import endless_model
from npumanager.daemon.host.client import HostSettings, ModelHost
from npumanager.vendor_drivers.realexec.session import Call

host = ModelHost(HostSettings("onnxruntime"), int(sys.argv[2]), int(sys.argv[2]))
session = host.open(0, host.count(endless_model(), {}), 0)
feeds = {"x": np.zeros((1, 256), np.float32)}
threading.Thread(target=session.run, args=(feeds, Call(False)), daemon=True).start()
print(host.pid, flush=True)
sys.stdin.read()
"""


def running_threads(pid: int) -> int:
    """How many of the process's threads are running or runnable (state R)."""
    count = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except FileNotFoundError:
            continue
        count += stat.rsplit(") ", 1)[1].startswith("R")
    return count


def test_a_host_whose_daemon_dies_ends_at_once_even_mid_inference() -> None:
    """A daemon killed while its host runs an inference only a cancel would end: the host
    is gone at once (its daemon's end closed, and the parent-death signal), not left
    running an endless model for ever."""
    import subprocess
    import sys

    tests = str(Path(__file__).parent)
    daemon = subprocess.Popen(
        [sys.executable, "-c", DAEMON_THAT_DIES, tests, str(FOREGROUND_UID)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stdout is not None
        pid = int(daemon.stdout.readline())
        wait_for(lambda: running_threads(pid) > 0)  # the endless run, on a thread of its own
        daemon.kill()
        daemon.wait()
        wait_for(lambda: gone(pid))
    finally:
        daemon.kill()
        daemon.wait()


def test_a_dead_hosts_error_holds_nothing_of_its_caller_once_caught() -> None:
    """The error a caller gets when its host dies lets go of the caller's frame as soon as
    it is caught, with no cycle for the collector: a lane's frame holds a client's shared
    segment, which stayed mapped until a full collection ran (found by a killed client's
    segment still mapped after 120 s)."""
    import gc
    import threading
    import weakref

    from npumanager.daemon.host.client import HostSettings, ModelHost
    from npumanager.errors import ModelHostError

    class Inputs:
        """Stands for the arrays over a client's segment that a caller's frame holds."""

    host = ModelHost(HostSettings("onnxruntime"), FOREGROUND_UID, FOREGROUND_UID)
    held: list[weakref.ref[Inputs]] = []
    errors: list[str] = []
    asked = threading.Event()

    def caller() -> None:
        inputs = Inputs()
        held.append(weakref.ref(inputs))
        asked.set()
        try:
            host.ask("count", timeout=None)  # a stopped host never answers
        except ModelHostError as exc:
            errors.append(str(exc))

    gc.disable()
    try:
        os.kill(host.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(host.pid))
        thread = threading.Thread(target=caller)
        thread.start()
        asked.wait()
        wait_for(lambda: bool(host._waiting))
        host.kill()
        thread.join()
        assert errors == ["the model host was stopped"]
        assert held[0]() is None, "the caught error still holds the caller's frame"
    finally:
        gc.enable()
        host.kill()


def test_an_apps_connections_share_one_host_each_uid_its_own_and_hosts_are_capped(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    """One host per app (not per connection): two connections of one app run in the same
    host; another uid's app gets one of its own; past `--max-hosts` a load is refused."""
    daemon = start_onnxruntime("--model-hosts", "--max-hosts", "2")
    first = loaded_app(daemon, FOREGROUND_UID, model_file)
    second = loaded_app(daemon, FOREGROUND_UID, model_file)
    for child in (first, second):
        assert child.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    clients = info(daemon)["clients"]
    pids = {c["host_pid"] for c in clients if c["uid"] == FOREGROUND_UID}
    assert len(pids) == 1 and None not in pids, clients
    other = loaded_app(daemon, BACKGROUND_UID, model_file)
    assert other.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    assert host_pid(daemon, BACKGROUND_UID) not in pids
    hosts = info(daemon)["daemon"]["model_hosts"]
    assert (hosts["running"], hosts["started"], hosts["max_hosts"]) == (2, 2, 2)

    third = app(daemon, NOBODY)
    granted(third)
    refused = third.send("real_load", id=1, path=str(model_file))
    assert refused.get("error") == "QuotaExceededError", refused
    assert "2 model hosts, its cap (serve --max-hosts)" in refused["message"]

    first.close()  # the app's other connection keeps the host
    assert second.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    (pid,) = pids
    assert not gone(pid)
    second.close()
    wait_for(lambda: gone(pid))  # its last connection took it
