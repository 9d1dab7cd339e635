"""Memory pressure from PSI: the system's `/proc/pressure/memory` and the process's cgroup v2
`memory.pressure`, read for `some avg10`, with triggers for a quick rise.

A file's level is 1 once `some avg10` reaches the moderate share, 2 at the critical one.
Where the kernel accepts triggers (`some <stall> <window>` written to the file, POLLPRI
when the stall is exceeded within the window), one per level makes the level rise within
a window and hold for two; where it refuses them, avg10 alone is read on the timer. Without
CAP_SYS_RESOURCE a window is rounded up to a multiple of 2 s, as the kernel demands.

Under systemd, `MEMORY_PRESSURE_WATCH` names what to watch instead of the cgroup's file
(a PSI file, a FIFO or a Unix socket; `/dev/null` turns the cgroup's watching off) and
`MEMORY_PRESSURE_WRITE` the trigger to write into it (base64); its events mean level 1.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import select
import socket
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from npumanager.plugins.health.files import Files, log
from npumanager.schemas import MemoryReading
from npumanager.schemas.limits import (
    CAP_SYS_RESOURCE,
    MEMORY_PRESSURE_CRITICAL,
    MEMORY_PRESSURE_MODERATE,
    MEMORY_PRESSURE_NONE,
    PSI_MAX_WINDOW_MS,
    PSI_UNPRIVILEGED_WINDOW_MS,
)

WATCH_ENV = "MEMORY_PRESSURE_WATCH"
WRITE_ENV = "MEMORY_PRESSURE_WRITE"
TRIGGER_HOLD_WINDOWS = 2
"""A trigger's level holds this many windows after its last event (the kernel repeats at
most one event a window while the stall goes on)."""
_BAD = select.POLLERR | select.POLLHUP | select.POLLNVAL


@dataclass
class Trigger:
    """A descriptor whose events mean `level` for `hold_s` seconds."""

    fd: int
    level: int
    hold_s: float
    mask: int = select.POLLPRI
    sock: socket.socket | None = None
    fired_at: float | None = None

    def close(self) -> None:
        """Release the descriptor (and the socket it belongs to)."""
        if self.sock is not None:
            self.sock.close()
        else:
            with contextlib.suppress(OSError):
                os.close(self.fd)


@dataclass
class Watched:
    """One place memory pressure is read from: a PSI file (or none), and its triggers."""

    name: str
    path: Path | None
    triggers: list[Trigger] = field(default_factory=list)


@dataclass(frozen=True)
class PsiLevels:
    """The `some` shares (percent) at which the level becomes 1 and 2, and the window."""

    moderate: float
    critical: float
    window_ms: int


def parse_psi(text: str) -> tuple[float, float | None] | None:
    """`some avg10` and `full avg10` (None without a full line) of a PSI file, or None."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        kind, *fields = line.split()
        values = dict(f.split("=", 1) for f in fields if "=" in f)
        try:
            found[kind] = float(values["avg10"])
        except (KeyError, ValueError):
            return None
    some = found.get("some")
    if some is None or not 0 <= some <= 100:
        return None
    full = found.get("full")
    return some, full if full is not None and 0 <= full <= 100 else None


def level_of(share: float, levels: PsiLevels) -> int:
    """The memory level of a `some` share."""
    if share >= levels.critical:
        return MEMORY_PRESSURE_CRITICAL
    if share >= levels.moderate:
        return MEMORY_PRESSURE_MODERATE
    return MEMORY_PRESSURE_NONE


def privileged(files: Files) -> bool:
    """True if this process holds CAP_SYS_RESOURCE (any trigger window allowed)."""
    text = files.text(files.path("/proc/self/status")) or ""
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
            except (IndexError, ValueError):
                return False
    return False


def window_ms(asked: int, is_privileged: bool) -> int:
    """The trigger window to ask for: a multiple of 2 s unless the process is privileged."""
    if is_privileged:
        return asked
    step = PSI_UNPRIVILEGED_WINDOW_MS
    return min(PSI_MAX_WINDOW_MS, -(-asked // step) * step)


def cgroup_pressure_path(files: Files) -> Path | None:
    """The process's own cgroup v2 `memory.pressure`, or None at the root cgroup or without v2."""
    text = files.text(files.path("/proc/self/cgroup")) or ""
    relative = next((ln[3:] for ln in text.splitlines() if ln.startswith("0::")), None)
    if relative is None or relative.strip("/") == "":
        return None
    mount = "/sys/fs/cgroup"
    mounts = files.text(files.path("/proc/self/mounts")) or ""
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            mount = parts[1]
            break
    return files.path(mount) / relative.strip("/") / "memory.pressure"


def psi_trigger(files: Files, path: Path, spec: bytes, level: int, hold_s: float) -> Trigger | None:
    """A trigger written into a PSI file, or None (logged once) where the kernel refuses it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        log.info("%s: cannot open for a trigger (%s)", files.shown(path), exc.strerror or exc)
        return None
    try:
        os.write(fd, spec.rstrip(b"\0") + b"\0")
    except OSError as exc:
        os.close(fd)
        log.info(
            "%s: trigger %r refused (%s); reading avg10 on the timer instead",
            files.shown(path),
            spec.decode(errors="replace"),
            exc.strerror or exc,
        )
        return None
    return Trigger(fd, level, hold_s)


def systemd_watch(
    files: Files, environ: Mapping[str, str], may_write: bool, hold_s: float
) -> tuple[bool, Watched | None]:
    """What `MEMORY_PRESSURE_WATCH` asks: (set at all, what to watch instead of the cgroup)."""
    target = environ.get(WATCH_ENV)
    if not target:
        return False, None
    if target == "/dev/null":
        log.info("%s=/dev/null: the cgroup's memory pressure is not watched", WATCH_ENV)
        return True, None
    data = b""
    encoded = environ.get(WRITE_ENV)
    if encoded:
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            log.warning("%s is not base64; nothing is written to %s", WRITE_ENV, target)
    hold = _window_of(data) or hold_s
    path = files.path(target)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        files.off(path, f"{WATCH_ENV} names it but it cannot be watched ({exc.strerror or exc})")
        return True, None
    if stat.S_ISFIFO(mode):
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        return True, Watched("systemd", None, [Trigger(fd, 1, hold, select.POLLIN)])
    if stat.S_ISSOCK(mode):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(str(path))
            if data:
                sock.sendall(data)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            files.off(path, f"cannot connect to the {WATCH_ENV} socket ({exc.strerror or exc})")
            return True, None
        return True, Watched(
            "systemd", None, [Trigger(sock.fileno(), 1, hold, select.POLLIN, sock)]
        )
    watched = Watched("cgroup", path)
    if data and may_write:
        trigger = psi_trigger(files, path, data, MEMORY_PRESSURE_MODERATE, hold)
        watched.triggers.extend([trigger] if trigger else [])
    return True, watched


def _window_of(data: bytes) -> float | None:
    parts = data.rstrip(b"\0\n").split()
    if len(parts) == 3 and parts[0] in (b"some", b"full") and parts[2].isdigit():
        return int(parts[2]) * TRIGGER_HOLD_WINDOWS / 1e6
    return None


class Memory:
    """Every memory-pressure place the source reads, with their triggers."""

    def __init__(
        self,
        files: Files,
        places: list[str],
        levels: PsiLevels,
        *,
        triggers: bool,
        environ: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = files
        self._levels = levels
        self._clock = clock
        self.watched: list[Watched] = []
        window = window_ms(levels.window_ms, privileged(files)) if triggers else levels.window_ms
        hold = window * TRIGGER_HOLD_WINDOWS / 1000
        if "system" in places:
            self.watched.append(Watched("system", files.path("/proc/pressure/memory")))
        if "cgroup" in places:
            told, instead = systemd_watch(files, environ, triggers, hold)
            if instead is not None:
                self.watched.append(instead)
            elif not told and (path := cgroup_pressure_path(files)) is not None:
                self.watched.append(Watched("cgroup", path))
        if triggers:
            for place in self.watched:
                if place.path is not None and not place.triggers:
                    place.triggers = self._psi_triggers(place.path, window, hold)

    def _psi_triggers(self, path: Path, window: int, hold_s: float) -> list[Trigger]:
        made = []
        for level, share in (
            (MEMORY_PRESSURE_MODERATE, self._levels.moderate),
            (MEMORY_PRESSURE_CRITICAL, self._levels.critical),
        ):
            stall_us = int(window * 1000 * share / 100)
            if not 0 < stall_us < window * 1000:
                continue
            trigger = psi_trigger(
                self._files, path, f"some {stall_us} {window * 1000}".encode(), level, hold_s
            )
            if trigger is None:
                break
            made.append(trigger)
        return made

    def descriptors(self) -> dict[int, int]:
        """Every trigger's descriptor and what to poll it for."""
        return {t.fd: t.mask for w in self.watched for t in w.triggers}

    def ready(self, fd: int) -> None:
        """A trigger's descriptor is ready: note the event, or drop a trigger that broke."""
        for place in self.watched:
            for trigger in list(place.triggers):
                if trigger.fd == fd:
                    self._fired(place, trigger)

    def _fired(self, place: Watched, trigger: Trigger) -> None:
        # The poll that woke us consumed a PSI event; polling again only finds a broken one.
        poller = select.poll()
        poller.register(trigger.fd, trigger.mask)
        events = sum(e for _, e in poller.poll(0))
        if trigger.mask & select.POLLIN and events & select.POLLIN:
            try:
                data = os.read(trigger.fd, 4096)
            except BlockingIOError:
                data = b"x"
            except OSError:
                data = b""
            if not data:
                events |= select.POLLHUP
        if events & _BAD:
            log.warning("%s: its pressure watch went away; reading on the timer", place.name)
            place.triggers.remove(trigger)
            trigger.close()
            return
        trigger.fired_at = self._clock()

    def read(self) -> list[MemoryReading]:
        """Each place's level now: its avg10's, or a recent trigger's if higher."""
        now = self._clock()
        readings = []
        for place in self.watched:
            fired = [
                t.level
                for t in place.triggers
                if t.fired_at is not None and now - t.fired_at < t.hold_s
            ]
            triggered = max(fired, default=MEMORY_PRESSURE_NONE)
            shares = None
            if place.path is not None:
                text = self._files.text(place.path)
                shares = parse_psi(text) if text is not None else None
                if text is not None and shares is None:
                    self._files.off(place.path, "not a PSI file")
                if shares is None and not place.triggers:
                    continue
            some, full = shares if shares is not None else (None, None)
            level = max(triggered, level_of(some, self._levels) if some is not None else 0)
            readings.append(
                MemoryReading(
                    name=place.name,
                    path=None if place.path is None else self._files.shown(place.path),
                    level=level,
                    some_avg10=some,
                    full_avg10=full,
                    trigger=bool(fired),
                    triggers=len(place.triggers),
                )
            )
        return readings

    @property
    def trigger_count(self) -> int:
        """Triggers in force (the kernel accepted them and they did not break)."""
        return sum(len(w.triggers) for w in self.watched)

    def close(self) -> None:
        """Release every trigger."""
        for place in self.watched:
            for trigger in place.triggers:
                trigger.close()
            place.triggers.clear()
