"""Apps, not uids: the daemon finds each client's app in its process's cgroup at hello and
gives each app a HAL uid of its own, so two apps of one person are two apps to the arbiter
and the device scheduler.

Real cgroup v2 folders (made as root under this process's own cgroup), real client
processes of one uid moved into them before they connect, a real `npu-manager serve`.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers.cgroup_tree import CgroupTree, cgroup_tree
from helpers.daemon_support import FOREGROUND_UID, Child, DaemonProcess
from npumanager.apps.identity import AppIdentity
from npumanager.apps.registry import (
    HAL_UID_FIRST,
    MAX_APPS_PER_UID,
    AppRegistry,
    fallback_id,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving client processes their own uids needs root"
)

VIDEO = "user@20001.service/app.slice/app-gnome-org.example.Video-1234.scope"
INDEXER = "user@20001.service/background.slice/app-gnome-org.example.Indexer@77.service"
CALL = "user@20001.service/app.slice/app-gnome-org.example.Call-99.scope"


@pytest.fixture
def cgroups() -> Iterator[CgroupTree]:
    yield from cgroup_tree()


@pytest.fixture
def start_apps(
    start_onnxruntime: Callable[..., DaemonProcess], cgroups: CgroupTree
) -> Callable[..., DaemonProcess]:
    """`start_onnxruntime` with the default importance sources, the `desktop` one watching
    this test's own tree: tests on other workers set the focus of apps of the same ids in
    theirs, and the most important of an app id's cgroups would win."""
    sources = ("rules", f"desktop:root={cgroups.root}", "slices")

    def start(*args: str) -> DaemonProcess:
        return start_onnxruntime(*(a for s in sources for a in ("--importance", s)), *args)

    return start


def client_in(daemon: DaemonProcess, tree: CgroupTree | None, rel: str | None) -> Child:
    where = None if tree is None or rel is None else tree.root / rel
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
    child = Child(daemon.socket, FOREGROUND_UID, cgroup=where)
    daemon.children.append(child)  # type: ignore[attr-defined]
    assert "ready" in child.hello, child.hello
    return child


def test_two_apps_of_one_uid_are_two_apps_with_hal_uids_of_their_own(
    start_apps: Callable[..., DaemonProcess], cgroups: CgroupTree
) -> None:
    served = start_apps()
    video = client_in(served, cgroups, VIDEO).hello["ready"]
    video_again = client_in(served, cgroups, VIDEO).hello["ready"]
    indexer = client_in(served, cgroups, INDEXER).hello["ready"]
    shell = client_in(served, None, None).hello["ready"]

    assert video["app_id"] == "org.example.Video" == video_again["app_id"]
    assert indexer["app_id"] == "org.example.Indexer"
    assert video["hal_uid"] == video_again["hal_uid"], "two processes of one app are one app"
    assert HAL_UID_FIRST <= video["hal_uid"] != indexer["hal_uid"] >= HAL_UID_FIRST
    assert video["uid"] == indexer["uid"] == shell["uid"] == FOREGROUND_UID
    assert shell["app_id"] == fallback_id(FOREGROUND_UID)
    assert shell["hal_uid"] == FOREGROUND_UID, "a process in no app's cgroup: its uid, as before"

    from helpers.real_daemon import info

    clients = {
        (c["app_id"], c["hal_uid"]) for c in info(served)["clients"] if c["uid"] == FOREGROUND_UID
    }
    assert clients == {
        ("org.example.Video", video["hal_uid"]),
        ("org.example.Indexer", indexer["hal_uid"]),
        (fallback_id(FOREGROUND_UID), FOREGROUND_UID),
    }


def test_an_apps_requests_reach_the_arbiter_under_its_hal_uid(
    start_apps: Callable[..., DaemonProcess], cgroups: CgroupTree
) -> None:
    served = start_apps()
    video = client_in(served, cgroups, VIDEO)
    video.ok("request", id=1, size=0)
    decision = video.event("decision", 1)
    assert decision["status"] is not None
    from helpers.real_daemon import info

    seen = info(served)  # as management: everything
    requests = [r for entries in seen["requests"].values() for r in entries]
    assert [r["uid"] for r in requests] == [video.hello["ready"]["hal_uid"]]
    own = video.ok("info")  # as the app's own uid: its apps' requests, under their HAL uids
    assert [r["uid"] for entries in own["requests"].values() for r in entries] == [
        video.hello["ready"]["hal_uid"]
    ]


def test_a_hal_uid_is_stable_for_its_app_while_the_daemon_runs() -> None:
    registry = AppRegistry()
    cam = AppIdentity("org.example.Cam", "desktop-app", "app.slice", "/app-x-Cam-1.scope")
    first = registry.app_for(1000, cam)
    other = registry.app_for(1000, AppIdentity("org.example.Mail", "flatpak", None, "/b"))
    again = registry.app_for(1000, cam)
    of_another_person = registry.app_for(1001, cam)
    assert first is again and first.hal_uid == HAL_UID_FIRST
    assert other.hal_uid == HAL_UID_FIRST + 1
    assert of_another_person.hal_uid == HAL_UID_FIRST + 2, "one app id, two people: two apps"
    assert registry.app_for(1000, None).hal_uid == 1000


def test_a_uid_that_names_too_many_apps_gets_its_fallback_beyond_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = AppRegistry()
    for index in range(MAX_APPS_PER_UID):
        app = registry.app_for(1000, AppIdentity(f"a{index}", "desktop-app", None, f"/{index}"))
        assert app.hal_uid >= HAL_UID_FIRST
    beyond = registry.app_for(1000, AppIdentity("one.more", "desktop-app", None, "/x"))
    registry.app_for(1000, AppIdentity("and.another", "desktop-app", None, "/y"))
    assert beyond.app_id == fallback_id(1000) and beyond.hal_uid == 1000
    assert [r.message for r in caplog.records].count(
        f"uid 1000 has more than {MAX_APPS_PER_UID} apps; app 'one.more' and later ones count "
        "as uid:1000"
    ) == 1
    assert registry.app_for(1001, AppIdentity("a0", "desktop-app", None, "/0")).hal_uid > 1000


def test_a_peer_whose_cgroup_cannot_be_read_is_its_uids_app_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As under `hidepid`: /proc shows the daemon nothing of the peer (an empty fake /proc)."""
    registry = AppRegistry(proc=tmp_path)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        first = registry.identify(ours, os.getuid(), os.getpid())
        second = registry.identify(ours, os.getuid(), os.getpid())
    assert first is second and first.app_id == fallback_id(os.getuid())
    assert first.pids[os.getpid()] == 2
    registry.left(first, os.getpid())
    registry.left(first, os.getpid())
    assert first.pids == {}
    assert sum("could not be read" in r.message for r in caplog.records) == 1


def test_a_uid_in_the_hal_range_is_refused_at_hello(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    served = start_onnxruntime()
    child = Child(served.socket, HAL_UID_FIRST)
    served.children.append(child)  # type: ignore[attr-defined]
    assert "connect_error" in child.hello, child.hello
    assert f"from {HAL_UID_FIRST} up are its apps' HAL uids" in child.hello["message"]


# Importance: pins above sources, per app ------------------------------------------------


def importance_of(seen: dict[str, object], hal_uid: int) -> str | None:
    rows = [p for p in seen["priorities"] if p["uid"] == hal_uid]  # type: ignore[attr-defined]
    return rows[0]["importance"] if rows else None


def test_an_app_id_pinned_before_the_app_exists_ranks_it_when_it_comes(
    start_apps: Callable[..., DaemonProcess], cgroups: CgroupTree
) -> None:
    from helpers.real_daemon import info

    served = start_apps()
    import npumanager as npu

    with npu.DaemonClient(served.socket) as admin:
        admin.set_app_importance("org.example.Video", npu.IMPORTANCE_FOREGROUND)
        video = client_in(served, cgroups, VIDEO).hello["ready"]
        indexer = client_in(served, cgroups, INDEXER).hello["ready"]
        seen = info(served)
        assert importance_of(seen, video["hal_uid"]) == "FOREGROUND"
        assert importance_of(seen, indexer["hal_uid"]) == "CACHED", "slices: background.slice"

        admin.set_uid_importance(FOREGROUND_UID, npu.IMPORTANCE_VISIBLE)
        seen = info(served)
        assert importance_of(seen, video["hal_uid"]) == "FOREGROUND", "the app's pin wins"
        assert importance_of(seen, indexer["hal_uid"]) == "VISIBLE", "every app of the uid"

        admin.set_app_importance("org.example.Video", None)
        assert importance_of(info(served), video["hal_uid"]) == "VISIBLE"
        admin.set_uid_importance(FOREGROUND_UID, None)
        seen = info(served)
        assert importance_of(seen, indexer["hal_uid"]) == "CACHED", "the sources again"
        assert importance_of(seen, video["hal_uid"]) == "GONE", "nothing ranks it"


def test_set_importance_by_app_id_at_the_command_line(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    import subprocess
    import sys

    served = start_onnxruntime()
    command = [str(Path(sys.executable).with_name("npu-manager")), "set-importance"]
    done = subprocess.run(
        [*command, "camera.service", "FOREGROUND", "--socket", str(served.socket)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "app camera.service importance is now FOREGROUND (100)\n"
    done = subprocess.run(
        [*command, "camera.service", "auto", "--socket", str(served.socket), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert json_of(done.stdout) == {
        "uid": None,
        "app_id": "camera.service",
        "importance": None,
        "name": None,
    }


def json_of(text: str) -> object:
    import json

    return json.loads(text)


def test_apps_lists_each_app_with_its_importance_and_its_source(
    start_apps: Callable[..., DaemonProcess], cgroups: CgroupTree
) -> None:
    import subprocess
    import sys

    import npumanager as npu
    from helpers.daemon_support import BACKGROUND_UID

    served = start_apps()
    video = client_in(served, cgroups, VIDEO)
    client_in(served, cgroups, INDEXER)
    other = Child(served.socket, BACKGROUND_UID)
    served.children.append(other)  # type: ignore[attr-defined]
    with npu.DaemonClient(served.socket) as admin:
        admin.set_app_importance("org.example.Video", npu.IMPORTANCE_FOREGROUND)
    command = [str(Path(sys.executable).with_name("npu-manager")), "apps"]
    done = subprocess.run(
        [*command, "--json", "--socket", str(served.socket)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    apps = {a["app_id"]: a for a in json_of(done.stdout)["apps"]}  # type: ignore[index]
    seen = apps["org.example.Video"]
    assert seen["uid"] == FOREGROUND_UID
    assert seen["hal_uid"] == video.hello["ready"]["hal_uid"]
    assert (seen["importance"], seen["importance_source"]) == ("FOREGROUND", "pinned app")
    assert seen["pids"] == [video.hello["ready"]["os_pid"]]
    assert seen["cgroup"].endswith("/app-gnome-org.example.Video-1234.scope")
    assert seen["slice"] == "app.slice"
    indexer = apps["org.example.Indexer"]
    assert (indexer["importance"], indexer["importance_source"]) == ("CACHED", "slices")
    shell = apps[f"uid:{BACKGROUND_UID}"]
    assert (shell["importance"], shell["importance_source"]) == (None, "none")
    assert indexer["slice"] == "background.slice"
    assert shell["hal_uid"] == BACKGROUND_UID

    own = {a["app_id"] for a in video.ok("info")["apps"]}
    assert own == {"org.example.Video", "org.example.Indexer"}, "its own uid's apps only"

    text = subprocess.run(
        [*command, "--socket", str(served.socket)], capture_output=True, text=True, check=False
    )
    assert text.returncode == 0, text.stderr
    header, *rows = text.stdout.splitlines()
    assert header.split()[:4] == ["APP", "ID", "UID", "HAL"]
    assert any(r.split()[0] == "org.example.Video" and "pinned" in r for r in rows)


def test_focus_written_as_mutter_writes_it_reaches_the_arbiter(
    start_apps: Callable[..., DaemonProcess], cgroups: CgroupTree
) -> None:
    """The `desktop` source (a default where cgroup v2 is mounted; here on the test's tree):
    -1 in the app's cgroup's user.xdg.inactive-since is focus; a time is focus lost, ranked
    below it."""
    import time

    from helpers.real_daemon import info, wait_for

    served = start_apps()
    video = client_in(served, cgroups, VIDEO).hello["ready"]
    call = client_in(served, cgroups, CALL).hello["ready"]
    focus = "user.xdg.inactive-since"
    os.setxattr(cgroups.root / VIDEO, focus, b"-1")
    wait_for(lambda: importance_of(info(served), video["hal_uid"]) == "FOREGROUND")
    lost_at = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)
    os.setxattr(cgroups.root / VIDEO, focus, str(lost_at).encode())
    os.setxattr(cgroups.root / CALL, focus, b"-1")
    wait_for(lambda: importance_of(info(served), call["hal_uid"]) == "FOREGROUND")
    wait_for(lambda: importance_of(info(served), video["hal_uid"]) == "SERVICE")
    sources = {a["app_id"]: a["importance_source"] for a in info(served)["apps"]}
    assert sources["org.example.Call"] == sources["org.example.Video"] == "desktop"


def test_a_process_holding_the_device_without_the_manager_is_shown_with_its_app(
    start_apps: Callable[..., DaemonProcess], cgroups: CgroupTree
) -> None:
    """No accelerator here: /dev/null stands in for its node (`--device-node`), held by a
    process of its own uid in an app's cgroup; the daemon's own descriptors never count."""
    import subprocess
    import sys

    from helpers.real_daemon import info, wait_for

    served = start_apps("--device-node", "/dev/null")
    holder = cgroups.spawn(
        INDEXER,
        code="import os, sys; os.setuid(20001); f = open('/dev/null'); sys.stdin.read()",
    )
    expected = (holder.pid, "org.example.Indexer", 20001, "/dev/null")

    def seen() -> list[dict[str, object]]:
        users = info(served)["device_users"]
        return [u for u in users if (u["pid"], u["app_id"], u["uid"], u["node"]) == expected]

    wait_for(lambda: bool(seen()))  # it opens the node, and is moved into the app's cgroup
    (user,) = seen()
    assert user["driver"] is None and user["resident_bytes"] == 0, "no DRM device: no usage"
    assert served.process.pid not in {u["pid"] for u in info(served)["device_users"]}
    command = [str(Path(sys.executable).with_name("npu-manager")), "apps"]
    text = subprocess.run(
        [*command, "--socket", str(served.socket)], capture_output=True, text=True, check=False
    )
    assert "using the device without the manager:" in text.stdout, text.stdout + text.stderr
    refused = subprocess.run(
        [str(Path(sys.executable).with_name("npu-manager")), "serve", "--device-node", "/etc"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "--device-node /etc: not a character device (an accelerator's node is one, e.g. "
        "/dev/accel/accel0)"
    ), refused.stderr


def test_quotas_hold_per_app_and_per_uid_both(
    start_apps: Callable[..., DaemonProcess], cgroups: CgroupTree
) -> None:
    served = start_apps("--max-requests-per-app", "2", "--max-requests-per-uid", "5")
    video = client_in(served, cgroups, VIDEO)
    indexer = client_in(served, cgroups, INDEXER)
    shell = client_in(served, None, None)
    for request_id in (1, 2):
        video.ok("request", id=request_id, size=0)
    refused = video.send("request", id=3, size=0)
    assert refused.get("error") == "QuotaExceededError", refused
    assert refused["message"] == (
        "app org.example.Video holds 2 requests through the daemon, its limit (set by serve "
        "--max-requests-per-app); release some first"
    )
    for request_id in (1, 2):  # another app of the same uid has its own
        indexer.ok("request", id=request_id, size=0)
    shell.ok("request", id=1, size=0)  # the uid's own processes: the uid's cap alone
    over = shell.send("request", id=2, size=0)
    assert over.get("error") == "QuotaExceededError", over
    assert over["message"].startswith(f"uid {FOREGROUND_UID} holds 5 requests"), over


def test_a_process_that_exits_during_its_hello_is_its_uids_app(tmp_path: Path) -> None:
    """The peer is gone before the daemon looks (its pidfd cannot be had, or leads
    nowhere): the fallback, never another process's cgroup by a reused pid."""
    import subprocess
    import sys

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        code = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(path)!r})"
        gone = subprocess.run([sys.executable, "-c", code], check=True)
        assert gone.returncode == 0  # it connected, and has exited
        accepted, _ = listener.accept()
        with accepted:
            app = AppRegistry().identify(accepted, os.getuid(), 999_999)
    assert (app.app_id, app.hal_uid) == (fallback_id(os.getuid()), os.getuid())


def test_a_client_cannot_name_its_own_app_or_hal_uid(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    from npumanager.daemon.wire.protocol import FrameReader
    from npumanager.schemas.limits import PROTOCOL_VERSION

    served = start_onnxruntime()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(served.socket))
        body = json.dumps(
            {
                "op": "hello",
                "version": PROTOCOL_VERSION,
                "uses_feature": True,
                "app_id": "org.example.Bank",
                "hal_uid": 1879048192,
            }
        ).encode()
        sock.sendall(len(body).to_bytes(4, "big") + body)
        reader = FrameReader()
        frames: list[object] = []
        while not frames:
            data = sock.recv(65536)
            assert data, "the daemon closed without saying why"
            frames = list(reader.feed(data))
    said = json.loads(frames[0])  # type: ignore[arg-type]
    assert (said["op"], said["kind"]) == ("error", "ProtocolError"), said
    assert "hello.app_id: Extra inputs are not permitted" in said["message"], said
