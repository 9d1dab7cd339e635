"""The `desktop` importance source on real cgroup v2 folders, real ``user.*`` xattrs and real
inotify (as root, skipped otherwise), and on fake trees for names the real hierarchy would
not get; its ladder and value parsing by hypothesis.

Every wait is for a call back, with one generous timeout (`WAIT_S`) that only ends a hung
test; nothing sleeps."""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.cgroup_tree import cgroup_tree
from helpers.daemon_support import WAIT_S
from npumanager.apps.identity import AppIdentity
from npumanager.plugins.importance import desktop
from npumanager.plugins.importance.desktop import (
    XATTR,
    DesktopSource,
    monotonic_us,
    next_step_us,
    parse_value,
    step_of,
)
from npumanager.plugins.importance.options import DEFAULT_LADDER, DesktopOptions, Ladder
from npumanager.schemas import Importance
from npumanager.schemas.limits import LOG_BURST

VIDEO = "app-gnome-org.example.Video-1234.scope"
MAIL = "app-gnome-org.example.Mail-77.scope"
Change = tuple[str, Importance | None]


class Watching:
    """A started source and the changes it called back, in order."""

    def __init__(self, root: Path, **options: object) -> None:
        self.changes: queue.Queue[Change] = queue.Queue()
        self.source = DesktopSource(DesktopOptions.model_validate({"root": str(root), **options}))
        self.source.start(lambda app_id, importance: self.changes.put((app_id, importance)))

    def next(self) -> Change:
        return self.changes.get(timeout=WAIT_S)

    def reported_at_start(self) -> list[Change]:
        """What `start` called back before it returned (it reads the tree first)."""
        return [self.changes.get_nowait() for _ in range(self.changes.qsize())]

    def now(self, app_id: str) -> Importance | None:
        return self.source.importance(AppIdentity(app_id, "desktop-app", None, "/"))


@pytest.fixture
def watching() -> Iterator[list[Watching]]:
    started: list[Watching] = []
    yield started
    for one in started:
        one.source.close()


@pytest.fixture
def cgroups() -> Iterator[Path]:
    """A test-unique folder of the real cgroup v2 hierarchy, removed after."""
    trees = cgroup_tree()
    tree = next(trees)  # skips where cgroups cannot be made
    try:
        try:
            os.setxattr(tree.root, XATTR, b"-1")
        except OSError as error:
            pytest.skip(f"this kernel keeps user.* xattrs off cgroupfs: {error.strerror}")
        yield tree.root
    finally:
        trees.close()


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    """A plain folder tree standing in for the hierarchy (names cgroupfs would not get)."""
    try:
        os.setxattr(tmp_path, "user.npu-test", b"1")
    except OSError as error:
        pytest.skip(f"{tmp_path} keeps no user.* xattrs: {error.strerror}")
    return tmp_path


def focus(folder: Path, value: int | bytes) -> None:
    os.setxattr(folder, XATTR, value if isinstance(value, bytes) else str(value).encode())


def test_losing_the_focus_moves_the_app_down_at_the_next_event(
    cgroups: Path, watching: list[Watching]
) -> None:
    scope = cgroups / "app.slice" / VIDEO
    scope.mkdir(parents=True)
    focus(scope, -1)
    watching.append(seen := Watching(cgroups))
    assert seen.now("org.example.Video") is Importance.FOREGROUND  # read at start
    assert seen.next() == ("org.example.Video", Importance.FOREGROUND)
    focus(scope, monotonic_us())  # as Mutter writes it when the focus leaves
    assert seen.next() == ("org.example.Video", Importance.SERVICE)
    focus(scope, -1)
    assert seen.next() == ("org.example.Video", Importance.FOREGROUND)
    os.removexattr(scope, XATTR)
    assert seen.next() == ("org.example.Video", None)


def test_apps_are_seen_as_they_come_and_go(cgroups: Path, watching: list[Watching]) -> None:
    watching.append(seen := Watching(cgroups))
    slice_ = cgroups / "user@0.service" / "app.slice"
    slice_.mkdir(parents=True)  # folders made after the start are watched as they appear
    video, mail = slice_ / VIDEO, slice_ / MAIL
    video.mkdir()
    focus(video, -1)
    assert seen.next() == ("org.example.Video", Importance.FOREGROUND)
    mail.mkdir()
    focus(video, monotonic_us())  # the focus moves from Video to Mail
    focus(mail, -1)
    assert {seen.next(), seen.next()} == {  # in either order: two folders, two events
        ("org.example.Video", Importance.SERVICE),
        ("org.example.Mail", Importance.FOREGROUND),
    }
    video.rmdir()
    assert seen.next() == ("org.example.Video", None)
    mail.rmdir()
    assert seen.next() == ("org.example.Mail", None)


def test_time_moves_the_app_down_the_ladder_by_deadlines(
    cgroups: Path, watching: list[Watching]
) -> None:
    scope = cgroups / VIDEO
    scope.mkdir()
    focus(scope, monotonic_us())
    watching.append(seen := Watching(cgroups, ladder="VISIBLE@0/SERVICE@0.2/CACHED@0.4"))
    steps = []
    while not steps or steps[-1] is not Importance.CACHED:
        app_id, importance = seen.next()  # nothing is written: only the deadlines move it
        assert app_id == "org.example.Video"
        assert importance is not None
        steps.append(importance)
    assert steps == sorted(set(steps))  # each step falls; a busy machine may skip some
    assert seen.source._next_due_us() is None  # at the bottom: nothing more to wait for


def test_several_cgroups_of_one_app_take_the_most_important(
    cgroups: Path, watching: list[Watching]
) -> None:
    first, second = cgroups / VIDEO, cgroups / "app-gnome-org.example.Video-99.scope"
    first.mkdir()
    second.mkdir()
    focus(first, monotonic_us())
    focus(second, -1)
    watching.append(seen := Watching(cgroups))
    assert seen.next() == ("org.example.Video", Importance.FOREGROUND)
    second.rmdir()
    assert seen.next() == ("org.example.Video", Importance.SERVICE)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"soon", "not -1 or a time"),
        (b"-5", "not -1 or a time"),
        (b"1e9", "not -1 or a time"),
        (b"\xff\xfe", "not -1 or a time"),
        (b"99999999999999999999", "not -1 or a time"),
        (b"9999999999999999999", "later than now"),
        (b"1" * 40, "40 bytes long"),
    ],
)
def test_garbage_is_no_opinion_and_one_log_line(
    cgroups: Path,
    watching: list[Watching],
    caplog: pytest.LogCaptureFixture,
    value: bytes,
    why: str,
) -> None:
    scope = cgroups / VIDEO
    scope.mkdir()
    focus(scope, -1)
    watching.append(seen := Watching(cgroups))
    assert seen.next() == ("org.example.Video", Importance.FOREGROUND)
    with caplog.at_level(logging.WARNING, logger=desktop.__name__):
        focus(scope, value)
        assert seen.next() == ("org.example.Video", None)
        focus(scope, value)  # the same garbage again: no second line
        focus(scope, -1)
        assert seen.next() == ("org.example.Video", Importance.FOREGROUND)
    lines = [r.getMessage() for r in caplog.records if r.name == desktop.__name__]
    assert len(lines) == 1
    assert why in lines[0]
    assert f"{VIDEO}: " in lines[0]


def test_the_default_root_is_the_mounted_hierarchy(cgroups: Path, watching: list[Watching]) -> None:
    scope = cgroups / VIDEO
    scope.mkdir()
    focus(scope, -1)
    source = DesktopSource()
    source.start(lambda app_id, importance: None)
    try:
        assert source.importance(AppIdentity("org.example.Video", "desktop-app", None, "/")) == (
            Importance.FOREGROUND
        )
    finally:
        source.close()
    assert not any(t.name == "importance-desktop" for t in threading.enumerate())


def test_names_follow_identitys_rules_on_a_fake_tree(
    fake_tree: Path, watching: list[Watching]
) -> None:
    user = fake_tree / "user.slice" / "user-1000.slice" / "user@1000.service"
    named = {
        "app.slice/app-gnome-org.example.My\\x2dApp-12.scope": "org.example.My-App",
        "app.slice/app-flatpak-org.gnome.Maps-3.scope": "org.gnome.Maps",
        "app.slice/snap.firefox.firefox-0a1b2c3d-0000-4000-8000-00000000abcd.scope": (
            "snap.firefox.firefox"
        ),
        "background.slice/app-gnome-" + "a" * 230 + "-1.scope": "a" * 230,
    }
    for rel in named:
        (user / rel).mkdir(parents=True, exist_ok=True)
        focus(user / rel, -1)
    no_app = [
        user / "app.slice" / "app-gnome-\\xff-1.scope",  # an escape that is not UTF-8
        Path(os.fsdecode(bytes(user / "app.slice") + b"/app-gnome-\xff\xfe-2.scope")),
        user / "session.slice" / "session-2.scope",
        user / "app.slice" / "app-gnome-org.example.Video-1234.scope" / "inner",
    ]
    for folder in no_app:
        folder.mkdir(parents=True)
        focus(folder, -1)
    watching.append(seen := Watching(fake_tree))
    found = dict(seen.reported_at_start())
    assert found == {app_id: Importance.FOREGROUND for app_id in named.values()}
    assert seen.now("org.example.Video") is None  # a folder inside an app is the app's
    inner = user / "app.slice" / VIDEO / "inner" / "deeper"
    inner.mkdir()  # not watched: no event, while the next app still is
    late = user / "app.slice" / "app-gnome-org.example.Late-5.scope"
    late.mkdir()
    focus(late, -1)
    assert seen.next() == ("org.example.Late", Importance.FOREGROUND)


def test_a_folder_moved_out_takes_its_apps_with_it(
    fake_tree: Path, watching: list[Watching]
) -> None:
    root, outside = fake_tree / "tree", fake_tree / "outside"
    slice_ = root / "background.slice"
    (slice_ / VIDEO).mkdir(parents=True)
    focus(slice_ / VIDEO, 0)
    watching.append(seen := Watching(root))
    assert seen.next() == ("org.example.Video", Importance.CACHED)
    slice_.rename(root / "renamed.slice")  # a move within the tree changes no app
    slice_ = root / "renamed.slice"
    slice_.rename(outside)  # a move out is a removal...
    assert seen.next() == ("org.example.Video", None)
    focus(outside / VIDEO, -1)  # no longer watched
    outside.rename(slice_)  # ...and a move in an arrival
    assert seen.next() == ("org.example.Video", Importance.FOREGROUND)


def test_start_needs_a_folder_and_close_ends_the_thread(tmp_path: Path) -> None:
    source = DesktopSource(DesktopOptions(root=str(tmp_path)))
    source.close()  # never started: nothing to stop
    source.start(lambda app_id, importance: None)
    with pytest.raises(RuntimeError, match="started already"):
        source.start(lambda app_id, importance: None)
    source.close()
    source.close()
    assert not any(t.name == "importance-desktop" for t in threading.enumerate())


def test_complaints_are_one_per_cgroup_and_a_burst_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    complaints = desktop._Complaints(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger=desktop.__name__):
        for n in range(LOG_BURST + 5):
            complaints.bad(f"/app-{n}".encode(), "bad")
            complaints.bad(f"/app-{n}".encode(), "bad")
        assert len(caplog.records) == LOG_BURST
        now[0] += 3600
        complaints.good(b"/app-0")
        complaints.bad(b"/app-0", "bad again")
    assert len(caplog.records) == LOG_BURST + 1


ladders = st.lists(
    st.tuples(st.floats(0.001, 1000), st.sampled_from(list(Importance)[1:-1])),
    min_size=0,
    max_size=4,
).map(
    lambda steps: tuple(
        zip(
            [0.0, *sorted({s for s, _ in steps})][: len({i for _, i in steps}) + 1],
            sorted({Importance.VISIBLE, *(i for _, i in steps)}),
            strict=False,
        )
    )
)


@given(ladders, st.integers(0, 10**12), st.integers(0, 10**12))
def test_the_ladder_falls_with_age_and_changes_only_at_its_deadlines(
    ladder: Ladder, since: int, age: int
) -> None:
    DesktopOptions(ladder=ladder)  # a valid ladder
    now = since + age
    here = step_of(ladder, age)
    assert step_of(ladder, 0) == ladder[0][1]
    assert here >= step_of(ladder, max(0, age - 1))  # never rises with age
    due = next_step_us(ladder, since, now)
    if due is None:
        assert here == ladder[-1][1]
    else:
        assert due > now
        assert step_of(ladder, due - 1 - since) == here
        assert step_of(ladder, due - since) > here


@given(st.integers(-(2**70), 2**70), st.integers(0, 2**63 - 1))
def test_values_are_minus_one_or_a_past_time(value: int, now: int) -> None:
    parsed = parse_value(str(value).encode(), now)
    if value == -1 or 0 <= value <= now:
        assert parsed == value
    else:
        assert isinstance(parsed, str)


def test_the_default_ladder_is_documented_and_valid() -> None:
    assert DesktopOptions().ladder == DEFAULT_LADDER
    assert DesktopOptions(ladder="service@0/cached@600").ladder == DEFAULT_LADDER
    assert DesktopOptions(ladder={"SERVICE": 0, "CACHED": 600}).ladder == DEFAULT_LADDER
    assert errno.ENODATA  # a missing attribute reads as ENODATA: no opinion
