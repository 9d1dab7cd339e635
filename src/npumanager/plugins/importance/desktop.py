"""The ``desktop`` importance source: which app has the focus, from GNOME's compositor.

Mutter (since 41) writes the extended attribute ``user.xdg.inactive-since`` on the cgroup of
an app's own unit (``app-gnome-org.gnome.Nautilus-1234.scope``): ``-1`` when one of the
app's windows gets the focus, and when the focus leaves the app, the time it left, in
microseconds of ``CLOCK_MONOTONIC`` (GLib's ``g_get_monotonic_time()``; Mutter's
``src/core/display.c``), written as decimal text. So:

- ``-1``: the app has the focus: ``FOREGROUND``;
- a time ``T``: the app lost the focus ``now - T`` ago, and stands on the ladder's step for
  that age (option ``ladder``, default ``SERVICE@0/CACHED@600``): at once ``SERVICE`` (out
  of the device's focus band), ten minutes later ``CACHED``;
- no attribute (the compositor never focused the app, or is not Mutter): no opinion.

A value that is not ``-1`` or a whole number of at most 19 digits, that is not UTF-8, or a
time later than now (not this machine's ``CLOCK_MONOTONIC``: another time namespace, or
garbage) is no opinion, with one log line (at most once per cgroup until it reads well
again, and at most `LOG_BURST` lines per `LOG_WINDOW_S`). An app id with several cgroups (two
launches of one app) takes the most important of them; the same app id run by two users is
one app id here.

Nothing is polled: a thread waits on inotify for ``IN_ATTRIB`` on every app's cgroup and for
``IN_CREATE``/``IN_DELETE`` (and moves) on the folders above them, so apps are seen as they
come and go, and between events it sleeps until the next step of the ladder is due for
some app (a deadline on the monotonic clock). Which folders are apps is
`npumanager.apps.identity.app_of_cgroup`'s rule, applied to each folder's path below
``root``; folders inside an app are the app's and are not watched.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from npumanager.apps.identity import app_of_cgroup, v2_mount
from npumanager.core.plugins.importance import AppView, ImportanceCallback, Opinions
from npumanager.errors import IllegalArgumentError
from npumanager.plugins.importance import inotify
from npumanager.plugins.importance.options import DesktopOptions, Ladder
from npumanager.schemas import Importance
from npumanager.schemas.limits import LOG_BURST, LOG_WINDOW_S

log = logging.getLogger(__name__)

XATTR = "user.xdg.inactive-since"
"""The attribute Mutter writes on an app's cgroup."""
FOCUSED = -1
"""Its value while the app has the focus."""
_VALUE = re.compile(rb"-1|[0-9]{1,19}")
_MAX_VALUE_BYTES = 32
_TREE_EVENTS = inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO
_APP_EVENTS = inotify.IN_ATTRIB
_US = 1_000_000


def monotonic_us() -> int:
    """``CLOCK_MONOTONIC`` in microseconds, the clock Mutter's times are in."""
    return time.monotonic_ns() // 1000


def step_of(ladder: Ladder, age_us: int) -> Importance:
    """The importance of an app that lost the focus ``age_us`` ago: the last step begun."""
    found = ladder[0][1]
    for seconds, importance in ladder:
        if age_us >= _step_us(seconds):
            found = importance
    return found


def next_step_us(ladder: Ladder, since_us: int, now_us: int) -> int | None:
    """When the app that lost the focus at ``since_us`` reaches its next step, or None."""
    for seconds, _ in ladder:
        due = since_us + _step_us(seconds)
        if due > now_us:
            return due
    return None


def _step_us(seconds: float) -> int:
    return int(seconds * _US + 0.5)


def parse_value(raw: bytes, now_us: int) -> int | str:
    """``FOCUSED`` or the time the focus left, or why the value is garbage."""
    if len(raw) > _MAX_VALUE_BYTES:
        return f"{len(raw)} bytes long"
    text = raw.strip(b" \t\n")
    if _VALUE.fullmatch(text) is None:
        return f"not -1 or a time in microseconds: {raw!r}"
    value = int(text)
    if value > now_us:
        return f"{value} is later than now ({now_us} us of CLOCK_MONOTONIC)"
    return value


@dataclass
class _Cgroup:
    """One app's cgroup: its app id and what its attribute said (None: nothing usable)."""

    app_id: str
    since_us: int | None = None


class _Complaints:
    """One log line per cgroup while its value stays bad, and at most a burst per window."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._bad: set[bytes] = set()
        self._window = (float("-inf"), 0)
        self._clock = clock

    def bad(self, path: bytes, why: str) -> None:
        if path in self._bad:
            return
        self._bad.add(path)
        start, printed = self._window
        now = self._clock()
        if now - start >= LOG_WINDOW_S:
            start, printed = now, 0
        if printed < LOG_BURST:
            log.warning("desktop: %s on %s: %s; no opinion", XATTR, os.fsdecode(path), why)
            printed += 1
        self._window = (start, printed)

    def good(self, path: bytes) -> None:
        self._bad.discard(path)


class DesktopSource:
    """Watches every app's ``user.xdg.inactive-since`` below ``root`` (see the module)."""

    def __init__(
        self,
        options: DesktopOptions | None = None,
        *,
        clock_us: Callable[[], int] = monotonic_us,
    ) -> None:
        options = options or DesktopOptions()
        root = Path(options.root) if options.root is not None else v2_mount()
        if root is None:
            raise IllegalArgumentError(
                "importance source 'desktop': no cgroup v2 hierarchy is mounted here "
                "(see /proc/self/mountinfo); give root=DIR"
            )
        if not root.is_dir():
            raise IllegalArgumentError(
                f"importance source 'desktop': root {str(root)!r} is not a folder"
            )
        self.root = os.fsencode(root)
        self.ladder = options.ladder
        self._clock_us = clock_us
        self._opinions = Opinions()
        self._cgroups: dict[bytes, _Cgroup] = {}
        """App cgroups by path below root (``b"/user.slice/..."``)."""
        self._by_app: dict[str, set[bytes]] = {}
        self._watched: dict[int, bytes] = {}
        self._complaints = _Complaints()
        self._inotify: inotify.Inotify | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None

    def importance(self, app: AppView) -> Importance | None:
        """The app id's importance now, from its cgroups' attributes (None: no opinion)."""
        return self._opinions.get(app.app_id)

    def snapshot(self) -> dict[str, Importance]:
        """Every app id the source has an opinion of, and the opinion."""
        return self._opinions.snapshot()

    def start(self, changed: ImportanceCallback) -> None:
        """Read the tree, report what it says, and watch it on a thread of its own."""
        if self._thread is not None:
            raise RuntimeError("the desktop source is started already")
        self._inotify = inotify.Inotify()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._opinions.start(changed)
        for app_id in self._add_tree(b""):
            self._publish(app_id)
        self._thread = threading.Thread(target=self._run, name="importance-desktop", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and the watches; no call back after this returns."""
        self._opinions.stop()
        if self._thread is not None:
            os.write(self._wake_w, b"x")
            self._thread.join()
            self._thread = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    # The watching thread ----------------------------------------------------------------

    def _run(self) -> None:
        assert self._inotify is not None
        poller = select.poll()
        poller.register(self._inotify.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            due = self._next_due_us()
            timeout_ms = None if due is None else max(0, -(-(due - self._clock_us()) // 1000))
            ready = {fd for fd, _ in poller.poll(timeout_ms)}
            if self._wake_r in ready:
                return
            try:
                if self._inotify.fileno() in ready:
                    self._handle(self._inotify.read())
                self._refresh_due()
            except Exception:  # a bug here must not end the watching for good
                log.exception("desktop: the watching thread failed on an event; going on")

    def _handle(self, events: list[inotify.Event]) -> None:
        touched: set[str] = set()
        for event in events:
            if event.mask & inotify.IN_Q_OVERFLOW:
                log.info("desktop: inotify's queue overflowed; reading the whole tree again")
                touched |= self._rescan()
                continue
            if event.mask & inotify.IN_IGNORED:
                self._watched.pop(event.wd, None)
                continue
            base = self._watched.get(event.wd)
            if base is None:
                continue
            folder = event.mask & inotify.IN_ISDIR
            if folder and event.mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO):
                touched |= self._add_tree(base + b"/" + event.name)
            elif folder and event.mask & (inotify.IN_DELETE | inotify.IN_MOVED_FROM):
                touched |= self._drop_tree(base + b"/" + event.name)
            elif event.mask & inotify.IN_ATTRIB and base in self._cgroups:
                touched.add(self._read(base))
        for app_id in touched:
            self._publish(app_id)

    def _add_tree(self, top: bytes) -> set[str]:
        """Watch a folder and everything below it that is not inside an app; read the apps.
        The app ids read, to be published once all are."""
        assert self._inotify is not None
        touched = set()
        stack = [top]
        while stack:
            rel = stack.pop()
            identity = app_of_cgroup(os.fsdecode(rel or b"/"))
            is_app = identity is not None and os.fsencode(identity.cgroup) == rel
            if identity is not None and not is_app:
                continue  # inside an app: the app's own folder is what counts
            mask = _APP_EVENTS if is_app else _TREE_EVENTS | inotify.IN_ONLYDIR
            try:
                wd = self._inotify.add_watch(self.root + rel, mask)
            except OSError as error:
                if error.errno not in (errno.ENOENT, errno.ENOTDIR):
                    log.warning("desktop: cannot watch %s: %s", os.fsdecode(rel or b"/"), error)
                continue  # gone already: its parent's IN_DELETE says so
            self._watched[wd] = rel
            if identity is not None:
                if rel not in self._cgroups:
                    self._cgroups[rel] = _Cgroup(identity.app_id)
                    self._by_app.setdefault(identity.app_id, set()).add(rel)
                touched.add(self._read(rel))
                continue
            try:
                with os.scandir(self.root + rel) as entries:
                    stack.extend(rel + b"/" + e.name for e in entries if _is_dir(e))
            except OSError:
                continue
        return touched

    def _drop_tree(self, top: bytes) -> set[str]:
        """Forget a folder that went away, and every app below it; the app ids touched."""
        prefix = top + b"/"
        touched = set()
        for path in [p for p in self._cgroups if p == top or p.startswith(prefix)]:
            touched.add(self._forget(path))
        for wd, rel in list(self._watched.items()):
            if rel == top or rel.startswith(prefix):
                del self._watched[wd]
                if self._inotify is not None:  # moved out of the tree: its watch lives on
                    self._inotify.rm_watch(wd)
        return touched

    def _forget(self, path: bytes) -> str:
        app_id = self._cgroups.pop(path).app_id
        paths = self._by_app[app_id]
        paths.discard(path)
        if not paths:
            del self._by_app[app_id]
        self._complaints.good(path)
        return app_id

    def _rescan(self) -> set[str]:
        """After lost events: forget what is gone, read everything there again."""
        touched = {self._forget(p) for p in list(self._cgroups) if not os.path.isdir(self.root + p)}
        return touched | self._add_tree(b"")

    def _read(self, rel: bytes) -> str:
        """Read one app cgroup's attribute into its record; its app id."""
        cgroup = self._cgroups[rel]
        try:
            raw = os.getxattr(self.root + rel, XATTR)
        except OSError as error:
            cgroup.since_us = None
            if error.errno not in (errno.ENODATA, errno.ENOENT, errno.ENOTSUP):
                self._complaints.bad(rel, f"unreadable ({error.strerror})")
            else:
                self._complaints.good(rel)
            return cgroup.app_id
        value = parse_value(raw, self._clock_us())
        if isinstance(value, str):
            cgroup.since_us = None
            self._complaints.bad(rel, value)
        else:
            cgroup.since_us = value
            self._complaints.good(rel)
        return cgroup.app_id

    # Opinions and the ladder's deadlines -------------------------------------------------

    def _publish(self, app_id: str) -> None:
        """Tell the opinion of an app id now: the most important of its cgroups'."""
        now = self._clock_us()
        found = [self._opinion_of(self._cgroups[p], now) for p in self._by_app.get(app_id, ())]
        self._opinions.set(app_id, min((f for f in found if f is not None), default=None))

    def _opinion_of(self, cgroup: _Cgroup, now_us: int) -> Importance | None:
        if cgroup.since_us is None:
            return None
        if cgroup.since_us == FOCUSED:
            return Importance.FOREGROUND
        return step_of(self.ladder, now_us - cgroup.since_us)

    def _unfocused(self) -> list[_Cgroup]:
        return [c for c in self._cgroups.values() if c.since_us not in (None, FOCUSED)]

    def _next_due_us(self) -> int | None:
        now = self._clock_us()
        due = [next_step_us(self.ladder, c.since_us or 0, now) for c in self._unfocused()]
        return min((d for d in due if d is not None), default=None)

    def _refresh_due(self) -> None:
        """Move every app whose next step came due."""
        for app_id in {c.app_id for c in self._unfocused()}:
            self._publish(app_id)


def _is_dir(entry: os.DirEntry[bytes]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def desktop(options: DesktopOptions) -> DesktopSource:
    """The ``desktop`` source from its validated options."""
    return DesktopSource(options)
