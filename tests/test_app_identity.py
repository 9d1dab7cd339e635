"""Apps from the kernel: unit-name escaping, the desktop, Flatpak, Snap and service conventions,
the v2 line of /proc/PID/cgroup, pidfds, and real cgroups made as root with real processes."""

from __future__ import annotations

import ast
import errno
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.cgroup_tree import SCOPE, CgroupTree, cgroup_tree
from npumanager.apps import identity
from npumanager.apps.identity import (
    AppIdentity,
    AppKind,
    UnitNameError,
    app_of_cgroup,
    cgroup_of_pid,
    cgroup_of_pidfd,
    peer_pidfd,
    pid_of_pidfd,
    unescape_unit,
    v2_mount,
    v2_path,
)

USER = "/user.slice/user-1000.slice/user@1000.service"
UUID = "3f8e8d4e-1b2c-4d5e-8f90-0123456789ab"


def systemd_escape(text: str) -> str:
    """systemd's escaping, as ``systemd-escape`` does it: ``/`` becomes ``-``; ASCII letters,
    digits, ``:``, ``_`` and ``.`` (but a leading one) stay; every other byte is ``\\xNN``."""
    out = []
    for index, byte in enumerate(text.encode()):
        char = chr(byte)
        if char == "/":
            out.append("-")
        elif char.isascii() and (char.isalnum() or char in ":_.") and (index or char != "."):
            out.append(char)
        else:
            out.append(f"\\x{byte:02x}")
    return "".join(out)


def app(app_id: str, kind: AppKind, slice_: str | None, cgroup: str) -> AppIdentity:
    return AppIdentity(app_id=app_id, kind=kind, slice=slice_, cgroup=cgroup)


# (the process's cgroup, (app id, kind, slice, the app unit's cgroup where not the same))
FOUND: list[tuple[str, tuple[str, AppKind, str | None, str | None]]] = [
    (  # GNOME Shell's scope
        f"{USER}/app.slice/app-gnome-org.gnome.Nautilus-1234.scope",
        ("org.gnome.Nautilus", "desktop-app", "app.slice", None),
    ),
    (  # Flatpak, with the process in a sub-cgroup of its scope
        f"{USER}/app.slice/app-flatpak-org.mozilla.firefox-5678.scope/tab-3",
        (
            "org.mozilla.firefox",
            "flatpak",
            "app.slice",
            f"{USER}/app.slice/app-flatpak-org.mozilla.firefox-5678.scope",
        ),
    ),
    (  # an escaped dash in the app id
        f"{USER}/app.slice/app-gnome-org.example\\x2dDash-99.scope",
        ("org.example-Dash", "desktop-app", "app.slice", None),
    ),
    (  # an escaped leading dot and UTF-8
        f"{USER}/app.slice/app-gnome-\\x2ecaf\\xc3\\xa9-7.scope",
        (".café", "desktop-app", "app.slice", None),
    ),
    (  # KDE: no launcher
        f"{USER}/app.slice/app-org.kde.konsole-a1b2.scope",
        ("org.kde.konsole", "desktop-app", "app.slice", None),
    ),
    (
        f"{USER}/app.slice/app-gnome-org.gnome.Evince@12345.service",
        ("org.gnome.Evince", "desktop-app", "app.slice", None),
    ),
    (
        f"{USER}/app.slice/app-org.kde.dolphin@0a1b2c3d.service",
        ("org.kde.dolphin", "desktop-app", "app.slice", None),
    ),
    (  # a service with no random part
        f"{USER}/app.slice/app-gnome-org.gnome.Evince.service",
        ("org.gnome.Evince", "desktop-app", "app.slice", None),
    ),
    (  # a service with a random part after a dash (systemd's own example)
        f"{USER}/app.slice/app-gnome-org.gnome.Evince-12345.service",
        ("org.gnome.Evince", "desktop-app", "app.slice", None),
    ),
    (
        f"{USER}/app.slice/app-gnome-org.gnome.Software@autostart.service",
        ("org.gnome.Software", "desktop-app", "app.slice", None),
    ),
    (  # the innermost app wins; inside another unit it runs in no slice of its own
        f"{USER}/app.slice/app-gnome-org.gnome.Terminal-1.scope/app-gnome-org.a.Calc-2.scope",
        ("org.a.Calc", "desktop-app", None, None),
    ),
    (
        f"{USER}/app.slice/snap.firefox.firefox-{UUID}.scope",
        ("snap.firefox.firefox", "snap", "app.slice", None),
    ),
    (  # older snapd: a dot before the uuid; a dash in a snap name, escaped or not
        f"{USER}/app.slice/snap.hello-world.sh.{UUID}.scope",
        ("snap.hello-world.sh", "snap", "app.slice", None),
    ),
    (
        f"{USER}/app.slice/snap.hello\\x2dworld.sh-{UUID}.scope",
        ("snap.hello-world.sh", "snap", "app.slice", None),
    ),
    (
        f"/system.slice/snap.foo.hook.configure-{UUID}.scope",
        ("snap.foo.hook.configure", "snap", "system.slice", None),
    ),
    ("/system.slice/snap.lxd.daemon.service", ("snap.lxd.daemon", "snap", "system.slice", None)),
    (  # D-Bus activated, in an app slice of its own
        f"{USER}/app.slice/app-dbus\\x2d:1.2\\x2dorg.kde.kdeconnect.slice/"
        "dbus-:1.2-org.kde.kdeconnect@0.service",
        ("org.kde.kdeconnect", "dbus", "app.slice", None),
    ),
    ("/system.slice/camera.service", ("camera.service", "service", "system.slice", None)),
    (
        "/system.slice/camera.service/worker",
        ("camera.service", "service", "system.slice", "/system.slice/camera.service"),
    ),
    ("/system.slice/getty@tty1.service", ("getty@tty1.service", "service", "system.slice", None)),
    (  # a service's name is kept as systemctl writes it
        "/system.slice/foo\\x2dbar.service",
        ("foo\\x2dbar.service", "service", "system.slice", None),
    ),
    (
        f"{USER}/session.slice/org.gnome.Shell@wayland.service",
        ("org.gnome.Shell@wayland.service", "service", "session.slice", None),
    ),
    (  # the outermost slice below the user manager
        f"{USER}/background.slice/background-indexer.slice/tracker-miner-fs-3.service",
        ("tracker-miner-fs-3.service", "service", "background.slice", None),
    ),
    (  # an app inside a service runs in no slice of its own
        "/system.slice/kiosk.service/app-cage-org.example.Cam-1.scope",
        ("org.example.Cam", "desktop-app", None, None),
    ),
    (  # a container's service, by the innermost unit
        "/machine.slice/systemd-nspawn@box.service/payload/system.slice/camera.service",
        ("camera.service", "service", "system.slice", None),
    ),
    (  # another cgroup namespace's process
        "/../../app.slice/app-gnome-org.a.B-1.scope",
        ("org.a.B", "desktop-app", "app.slice", None),
    ),
    (  # an invalid innermost name is passed over
        "/system.slice/foo.service/app-gnome-" + "a" * 250 + "-1.scope",
        ("foo.service", "service", "system.slice", "/system.slice/foo.service"),
    ),
]


@pytest.mark.parametrize(("path", "expected"), FOUND, ids=[p.rsplit("/", 1)[-1] for p, _ in FOUND])
def test_the_app_of_a_cgroup(
    path: str, expected: tuple[str, AppKind, str | None, str | None]
) -> None:
    app_id, kind, slice_, unit = expected
    assert app_of_cgroup(path) == app(app_id, kind, slice_, unit or path)


NONE = [
    "/",
    "",
    "/init.scope",
    "/user.slice/user-1000.slice/session-2.scope",
    f"{USER}/init.scope",
    f"{USER}/app.slice/app-org.gnome.Terminal.slice/vte-spawn-1a2b.scope",
    f"{USER}/app.slice/app-gnome.slice",
    "/system.slice/docker-0123abcd.scope",
    "/run-u5.scope",
    # malformed: a bad escape, bytes that are not UTF-8, a control character, no id, an
    # instance on a scope, a random part systemd would not write, a uuid that is not one
    f"{USER}/app.slice/app-gnome-bad\\xZZ-1.scope",
    f"{USER}/app.slice/app-gnome-bad\\xff-1.scope",
    f"{USER}/app.slice/app-gnome-evil\\x0a-1.scope",
    f"{USER}/app.slice/app-gnome--1.scope",
    f"{USER}/app.slice/app-gnome-x@1.scope",
    f"{USER}/app.slice/app-gnome-x-1:2.scope",
    f"{USER}/app.slice/app-a-b-c-d-1.scope",
    f"{USER}/app.slice/snap.firefox.firefox-not-a-uuid.scope",
    # a name that is not UTF-8, as os.fsdecode gives it, and one longer than systemd allows
    os.fsdecode(b"/app.slice/app-gnome-caf\xe9-1.scope"),
    "/app.slice/app-gnome-" + "a" * 250 + "-1.scope",
]


@pytest.mark.parametrize("path", NONE)
def test_no_app(path: str) -> None:
    assert app_of_cgroup(path) is None


@pytest.mark.parametrize(
    ("name", "path", "expected"),
    [
        ("org.example\\x2dDash", False, "org.example-Dash"),
        ("\\x2ehidden\\x20file", False, ".hidden file"),
        ("caf\\xC3\\xA9", False, "café"),
        ("a-b", False, "a-b"),
        ("home-user-x", True, "/home/user/x"),
        ("home-user\\x2dname", True, "/home/user-name"),
        ("-", True, "/"),
        ("dev-disk-by\\x2duuid-1234", True, "/dev/disk/by-uuid/1234"),
    ],
)
def test_unescape(name: str, path: bool, expected: str) -> None:
    assert unescape_unit(name, path=path) == expected


@pytest.mark.parametrize(
    ("name", "path", "said"),
    [
        ("a\\b", False, "backslash"),
        ("a\\x4", False, "backslash"),
        ("a\\xzz", False, "backslash"),
        ("a\\xff", False, "not UTF-8"),
        ("a\\xc3", False, "not UTF-8"),
        (os.fsdecode(b"a\xff"), False, "not text"),
        ("-home", True, "normalised"),
        ("home--x", True, "normalised"),
        ("home-..-x", True, "normalised"),
        ("", True, "normalised"),
    ],
)
def test_a_bad_escape_says_what_is_allowed(name: str, path: bool, said: str) -> None:
    with pytest.raises(UnitNameError, match=said):
        unescape_unit(name, path=path)


TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="/"), min_size=1)


@given(TEXT)
def test_unescape_undoes_systemds_escape(text: str) -> None:
    assert unescape_unit(systemd_escape(text)) == text


@given(st.lists(TEXT.filter(lambda s: s not in (".", "..")), max_size=5))
def test_unescape_undoes_systemds_path_escape(parts: list[str]) -> None:
    escaped = systemd_escape("/".join(parts)) if parts else "-"
    assert unescape_unit(escaped, path=True) == "/" + "/".join(parts)


APP_IDS = st.text(
    st.characters(exclude_categories=("C", "Z"), exclude_characters="/"), min_size=1, max_size=12
)


@given(
    APP_IDS, st.sampled_from(["app-gnome-{}-42.scope", "app-KDE-{}@ab12.service", "app-{}-7.scope"])
)
def test_any_escaped_app_id_comes_back(app_id: str, form: str) -> None:
    path = f"{USER}/app.slice/" + form.format(systemd_escape(app_id))
    assert app_of_cgroup(path) == app(app_id, "desktop-app", "app.slice", path)


HYBRID = (
    b"9:name=systemd:/\n8:pids:/\n4:memory:/process_api/12ab\n1:cpu:/\n"
    b"0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-a.B-1.scope\n"
)


def test_the_v2_line_of_a_hybrid_host() -> None:
    assert v2_path(HYBRID) == f"{USER}/app.slice/app-gnome-a.B-1.scope"
    assert v2_path(b"0::/\n") == "/"
    assert v2_path(b"0::/a:b:c\n") == "/a:b:c"  # only the path may hold a colon
    assert v2_path(b"0::/app.slice/caf\xe9\n") == os.fsdecode(b"/app.slice/caf\xe9")
    assert v2_path(b"9:name=systemd:/\n1:cpu:/\n") is None  # v1 only
    assert v2_path(b"") is None


def test_cgroup_of_a_pid_in_a_fake_proc(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_bytes(HYBRID)
    assert cgroup_of_pid(42, tmp_path) == f"{USER}/app.slice/app-gnome-a.B-1.scope"
    assert cgroup_of_pid(43, tmp_path) is None  # gone, or hidden by hidepid


def fake_pidfd(proc: Path, fd: int, pid: int) -> Path:
    fdinfo = proc / "self" / "fdinfo" / str(fd)
    fdinfo.parent.mkdir(parents=True, exist_ok=True)
    fdinfo.write_text(f"pos:\t0\nflags:\t02000002\nPid:\t{pid}\nNSpid:\t{pid}\n")
    return fdinfo


def test_the_pid_of_a_pidfd(tmp_path: Path) -> None:
    fake_pidfd(tmp_path, 5, 4242)
    fake_pidfd(tmp_path, 6, -1)  # reaped
    fake_pidfd(tmp_path, 7, 0)  # in a pid namespace we cannot see
    (tmp_path / "self" / "fdinfo" / "8").write_text("pos:\t0\nflags:\t02\n")
    assert pid_of_pidfd(5, tmp_path) == 4242
    assert pid_of_pidfd(6, tmp_path) is None
    assert pid_of_pidfd(7, tmp_path) is None
    with pytest.raises(ValueError, match="not a pidfd"):
        pid_of_pidfd(8, tmp_path)


@pytest.mark.parametrize("reused", [False, True])
def test_a_pid_reused_while_its_cgroup_is_read_is_caught(tmp_path: Path, reused: bool) -> None:
    """The cgroup file is a FIFO: the reader blocks in it until the writer, which has opened
    it, has ended the pidfd's real process (reaped: its pid free for another) or not, so
    the order is certain."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=PIPE)
    pidfd = os.pidfd_open(child.pid)
    (tmp_path / "4242").mkdir()
    fifo = tmp_path / "4242" / "cgroup"
    os.mkfifo(fifo)

    def another_process_takes_the_pid() -> None:
        with fifo.open("wb") as writer:  # returns once the reader has opened it
            if reused:
                child.kill()
                child.wait()
            writer.write(b"0::/system.slice/other.service\n")

    thread = threading.Thread(target=another_process_takes_the_pid)
    thread.start()
    try:
        found = cgroup_of_pidfd(pidfd, 4242, tmp_path)
    finally:
        if thread.is_alive():  # raised before opening the FIFO: let the writer open it
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        thread.join()
        os.close(pidfd)
        child.kill()
        child.wait()
    assert found == (None if reused else "/system.slice/other.service")


def test_a_pid_we_cannot_see_or_a_missing_cgroup_file_is_none(tmp_path: Path) -> None:
    pidfd = os.pidfd_open(os.getpid())
    try:
        assert cgroup_of_pidfd(pidfd, 0, tmp_path) is None  # another pid namespace
        assert cgroup_of_pidfd(pidfd, 4242, tmp_path) is None
    finally:
        os.close(pidfd)


MOUNTINFO_HYBRID = (
    b"31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    b"32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    b"40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    b"41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MOUNTINFO_HYBRID, Path("/sys/fs/cgroup/unified")),
        (
            b"30 23 0:26 / /sys/fs/cgroup rw,nosuid,relatime shared:4 - cgroup2 cgroup2 rw\n",
            Path("/sys/fs/cgroup"),
        ),
        (
            b"30 23 0:26 / /mnt/cg\\040v2 rw shared:4 master:1 - cgroup2 none rw\n",
            Path("/mnt/cg v2"),
        ),
        # a bind mount of a subtree, then the hierarchy's root
        (
            b"50 23 0:26 /docker/ab /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
            b"51 23 0:26 / /run/cg rw - cgroup2 cgroup2 rw\n",
            Path("/run/cg"),
        ),
        (MOUNTINFO_HYBRID.replace(b"cgroup2", b"cgroup"), None),
        (b"", None),
    ],
)
def test_where_cgroup_v2_is_mounted(tmp_path: Path, text: bytes, expected: Path | None) -> None:
    (tmp_path / "mountinfo").write_bytes(text)
    assert v2_mount(tmp_path / "mountinfo") == expected
    assert v2_mount(tmp_path / "missing") is None


def test_the_peer_of_a_socket_pair_is_this_process() -> None:
    a, b = socket.socketpair()
    with a, b:
        pidfd = peer_pidfd(a)
        if pidfd is None:
            pytest.skip("this kernel has no SO_PEERPIDFD (Linux 6.5)")
        try:
            assert pid_of_pidfd(pidfd) == os.getpid()
        finally:
            os.close(pidfd)


class RefusingSocket:
    def __init__(self, code: int) -> None:
        self.code = code

    def getsockopt(self, level: int, option: int) -> int:
        assert (level, option) == (socket.SOL_SOCKET, identity.SO_PEERPIDFD)
        raise OSError(self.code, os.strerror(self.code))


def test_a_kernel_without_so_peerpidfd_gives_none_and_a_gone_peer_raises() -> None:
    assert peer_pidfd(cast(socket.socket, RefusingSocket(errno.ENOPROTOOPT))) is None
    assert peer_pidfd(cast(socket.socket, RefusingSocket(errno.ENODATA))) is None
    with pytest.raises(ProcessLookupError):
        peer_pidfd(cast(socket.socket, RefusingSocket(errno.ESRCH)))


def test_the_module_is_a_leaf() -> None:
    """It imports the standard library, the errors and the schemas, nothing else."""
    tree = ast.parse(Path(identity.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    allowed = ("npumanager.errors", "npumanager.schemas")
    strays = [
        n
        for n in names
        if n.split(".")[0] not in sys.stdlib_module_names
        and not any(n == a or n.startswith(a + ".") for a in allowed)
    ]
    assert strays == []


# Real cgroups, as root: a tree of our own under this process's cgroup, real processes in it.


@pytest.fixture
def cgroups() -> Iterator[CgroupTree]:
    yield from cgroup_tree()


def test_a_real_process_in_an_app_scope(cgroups: CgroupTree) -> None:
    child = cgroups.spawn(SCOPE)
    expected = cgroups.path(SCOPE)
    pidfd = os.pidfd_open(child.pid)
    try:
        assert cgroup_of_pid(child.pid) == expected
        assert cgroup_of_pidfd(pidfd, child.pid) == expected
        assert app_of_cgroup(expected) == app(
            "org.example.Cam", "desktop-app", "app.slice", expected
        )
    finally:
        os.close(pidfd)


def test_two_processes_of_one_app_are_one_app(cgroups: CgroupTree) -> None:
    """Two instances (scopes) of one app, and a process in a sub-cgroup of one of them."""
    other = "app.slice/app-gnome-org.example.Cam-43.scope/worker"
    first, second = cgroups.spawn(SCOPE), cgroups.spawn(other)
    apps = [app_of_cgroup(cgroup_of_pid(c.pid) or "") for c in (first, second)]
    assert [a.app_id if a else None for a in apps] == ["org.example.Cam"] * 2
    assert apps[1] is not None and apps[1].cgroup == cgroups.path(other.rpartition("/")[0])


def test_a_cgroup_named_in_bytes_that_are_not_utf8(cgroups: CgroupTree) -> None:
    odd = os.fsdecode(b"caf\xe9")
    inside, alone = cgroups.spawn(f"{odd}/{SCOPE}"), cgroups.spawn(f"{odd}/x")
    found = cgroup_of_pid(inside.pid)
    assert found == cgroups.path(f"{odd}/{SCOPE}")
    assert os.fsencode(found).endswith(b"/caf\xe9/" + SCOPE.encode())
    assert app_of_cgroup(found) is not None
    assert app_of_cgroup(cgroup_of_pid(alone.pid) or "") is None


def test_a_reaped_process_has_no_cgroup_by_its_pidfd(cgroups: CgroupTree) -> None:
    child = cgroups.spawn(SCOPE)
    pidfd = os.pidfd_open(child.pid)
    try:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
        assert pid_of_pidfd(pidfd) is None
        assert cgroup_of_pidfd(pidfd, child.pid) is None
    finally:
        os.close(pidfd)


PEER = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)"


def test_a_socket_peer_by_its_pidfd(cgroups: CgroupTree, tmp_path: Path) -> None:
    address = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        listener.listen()
        listener.settimeout(120)  # only so that a child that never connects cannot hang us
        child = cgroups.spawn(SCOPE, address, code=PEER)
        conn, _ = listener.accept()
    with conn:
        pidfd = peer_pidfd(conn)
        if pidfd is None:
            pytest.skip("this kernel has no SO_PEERPIDFD (Linux 6.5)")
        try:
            assert pid_of_pidfd(pidfd) == child.pid
            found = app_of_cgroup(cgroup_of_pidfd(pidfd, child.pid) or "")
            assert found is not None and found.app_id == "org.example.Cam"
        finally:
            os.close(pidfd)
