"""Which app a process belongs to: its cgroup v2 path, read race-free through a pidfd, and the
app id that systemd's naming conventions put in that path.

The innermost component of the path that names an app wins (a process in a sub-cgroup of an
app's scope belongs to that app); components are matched as systemd unit names:

- ``app-<launcher>-<id>-<random>.scope``, ``app-<id>-<random>.scope`` (no launcher, as KDE
  names them), ``app-<launcher>-<id>@<random>.service``, ``app-<id>@<random>.service`` and
  ``app-<launcher>-<id>[-<random>].service``: ``<id>`` unescaped, kind ``desktop-app``, or
  ``flatpak`` where the launcher is ``flatpak`` (``app-flatpak-<id>-<n>.scope``);
- ``snap.<snap>.<app>-<uuid>.scope`` (older snapd: ``.<uuid>``), ``snap.<snap>.<app>.service``,
  ``snap.<snap>.hook.<hook>-<uuid>.scope``: the security tag ``snap.<snap>.<app>``, unescaped,
  kind ``snap``;
- ``dbus-:<bus>-<name>@<n>.service`` (a D-Bus activated service): ``<name>``, kind ``dbus``;
- any other ``<name>.service``: the unit name verbatim (as ``systemctl`` and a config's rules
  write it), kind ``service``.

An ``<id>`` may not hold a bare ``-`` (systemd writes it ``\\x2d``), so ``-`` splits the fields;
a ``.service`` of three fields is ``app-<launcher>-<id>``, one of four ends in a random part.
The user manager (``user@<uid>.service``), slices and other scopes (``session-2.scope``,
``init.scope``, ``run-u5.scope``, a terminal's ``vte-spawn-….scope``) name no app: the search
goes on outwards, and without a match the caller falls back to the uid. A name that is not a
valid unit name (too long, a character systemd never writes, a bad escape, an id that is not
printable UTF-8) names no app either. Within one uid these names are labels the user's own
processes could choose; only a sandboxed Flatpak or Snap app cannot.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from npumanager.errors import NpuManagerError

AppKind = Literal["desktop-app", "flatpak", "snap", "dbus", "service"]
"""How the app was recognised: the convention its unit name follows."""

SO_PEERPIDFD: Final[int] = getattr(socket, "SO_PEERPIDFD", 77)
"""The socket option (Linux 6.5) that gives a pidfd of a Unix socket's peer."""
UNIT_NAME_MAX: Final = 255
"""The longest unit name systemd accepts, suffix included."""

_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]+\.(?:service|scope|slice)")
_USER_MANAGER = re.compile(r"user@[0-9]+\.service")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_RANDOM = re.compile(r"[A-Za-z0-9]+")
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_SNAP = re.compile(rf"(snap\..+?)(?:[-.]{_UUID}\.scope|\.service)")
_SNAP_TAG = re.compile(r"snap\.[^./]+(?:\.hook)?\.[^./]+")
_DBUS = re.compile(r"dbus-:[0-9.]+-(.+)@[0-9]+\.service")
_MOUNT_ESCAPE = re.compile(rb"\\([0-7]{3})")


class UnitNameError(NpuManagerError, ValueError):
    """A unit name with an escape systemd would not accept, or that is not UTF-8 once unescaped."""


@dataclass(frozen=True, slots=True)
class AppIdentity:
    """An app as its cgroup names it: ``cgroup`` is the path of the app's own unit (the scope or
    service, whichever sub-cgroup the process is in), ``slice`` the outermost slice between it
    and its systemd manager (``app.slice``, ``background.slice``, ``system.slice``), or None
    where it runs inside another unit or in no slice."""

    app_id: str
    kind: AppKind
    slice: str | None
    cgroup: str


def unescape_unit(name: str, *, path: bool = False) -> str:
    """Undo systemd's unit-name escaping: ``\\xNN`` is a byte of the UTF-8 text; with ``path``
    (``systemd-escape --path``) ``-`` is ``/``, the root is ``-`` and the result is absolute.

    Without ``path`` a bare ``-`` stays ``-``: in an app id it cannot occur (it separates the
    fields), and snapd wrote snap names unescaped. Raises `UnitNameError` for a backslash that
    does not begin ``\\xNN``, bytes that are not UTF-8, or a path that is not normalised."""
    if path and name == "-":
        return "/"
    pieces = _ESCAPE.split(name)
    raw = bytearray()
    for index, piece in enumerate(pieces):
        if index % 2:
            raw.append(int(piece, 16))
            continue
        if "\\" in piece:
            raise UnitNameError(
                f"{name!r}: a backslash must begin an escape \\xNN of two hex digits"
            )
        try:
            raw += (piece.replace("-", "/") if path else piece).encode()
        except UnicodeEncodeError as error:
            raise UnitNameError(f"{name!r}: not text ({error.reason})") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as error:
        raise UnitNameError(f"{name!r}: its escapes are not UTF-8 ({error.reason})") from None
    if path:
        if any(part in ("", ".", "..") for part in text.split("/")):
            raise UnitNameError(
                f"{name!r}: not a normalised path (no empty, '.' or '..' component allowed)"
            )
        return "/" + text
    return text


def app_of_cgroup(path: str) -> AppIdentity | None:
    """The app a cgroup v2 path (the ``0::`` line of ``/proc/PID/cgroup``) belongs to, by the
    conventions in this module's table, innermost first; None where no component names one."""
    names = path.split("/")
    for index in range(len(names) - 1, -1, -1):
        found = _app_of_unit(names[index])
        if found is not None:
            app_id, kind = found
            cgroup = "/".join(names[: index + 1])
            return AppIdentity(app_id, kind, _slice_above(names[:index]), cgroup)
    return None


def _app_of_unit(name: str) -> tuple[str, AppKind] | None:
    """The app id and kind one path component names, or None."""
    if len(name) > UNIT_NAME_MAX or not _UNIT.fullmatch(name) or _USER_MANAGER.fullmatch(name):
        return None
    return _snap(name) or _dbus(name) or _desktop(name) or _service(name)


def _snap(name: str) -> tuple[str, AppKind] | None:
    match = _SNAP.fullmatch(name)
    tag = _label(match[1]) if match else None
    return (tag, "snap") if tag is not None and _SNAP_TAG.fullmatch(tag) else None


def _dbus(name: str) -> tuple[str, AppKind] | None:
    match = _DBUS.fullmatch(name)
    label = _label(match[1]) if match else None
    return (label, "dbus") if label is not None else None


def _desktop(name: str) -> tuple[str, AppKind] | None:
    stem, _, suffix = name.rpartition(".")
    base, at, instance = stem.partition("@")
    fields = base.split("-")
    if fields[0] != "app" or suffix not in ("scope", "service"):
        return None
    if at and (suffix != "service" or not instance):
        return None
    if suffix == "scope" or (not at and len(fields) == 4):
        random = fields.pop()
        if not _RANDOM.fullmatch(random):
            return None
    if len(fields) not in (2, 3) or not all(fields):
        return None
    app_id = _label(fields[-1])
    if app_id is None:
        return None
    return app_id, "flatpak" if len(fields) == 3 and fields[1] == "flatpak" else "desktop-app"


def _service(name: str) -> tuple[str, AppKind] | None:
    return (name, "service") if name.endswith(".service") else None


def _label(escaped: str) -> str | None:
    """An escaped id as text, or None where it is empty, malformed or not printable."""
    try:
        text = unescape_unit(escaped)
    except UnitNameError:
        return None
    return text if text and text.isprintable() else None


def _slice_above(names: list[str]) -> str | None:
    """The outermost slice between an app's unit and its systemd manager (or the root)."""
    found = None
    for name in reversed(names):
        if name.endswith((".service", ".scope")):
            break
        if name.endswith(".slice") and _UNIT.fullmatch(name):
            found = name
    return found


def v2_path(text: bytes) -> str | None:
    """The path of the cgroup v2 line (``0::<path>``) of a ``/proc/PID/cgroup`` file's bytes,
    or None (a v1-only host); hybrid hosts list v1 hierarchies too. Names that are not UTF-8
    come back as ``os.fsdecode`` gives them, so ``os.fsencode`` restores the bytes."""
    for line in text.split(b"\n"):
        hierarchy, _, rest = line.partition(b":")
        controllers, colon, path = rest.partition(b":")
        if hierarchy == b"0" and colon and not controllers:
            return os.fsdecode(path)
    return None


def cgroup_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    """A process's cgroup v2 path, or None where it has no v2 line, is gone, or is hidden from
    us (``hidepid``). Racy by nature: the pid may be reused; prefer `cgroup_of_pidfd`."""
    try:
        fd = os.open(f"{proc}/{pid}/cgroup", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except ProcessLookupError:
        return None
    finally:
        os.close(fd)
    return v2_path(b"".join(chunks))


def pid_of_pidfd(pidfd: int, proc: Path = Path("/proc")) -> int | None:
    """The pid a pidfd refers to, from its fdinfo; None where the process has been reaped (the
    kernel shows -1) or lives in a pid namespace we cannot see (0)."""
    text = (proc / "self" / "fdinfo" / str(pidfd)).read_text()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Pid":
            pid = int(value)
            return pid if pid > 0 else None
    raise ValueError(f"descriptor {pidfd} is not a pidfd: its fdinfo has no Pid line")


def cgroup_of_pidfd(pidfd: int, pid: int, proc: Path = Path("/proc")) -> str | None:
    """The cgroup v2 path of the process a pidfd refers to, `pid` (the pid it was opened
    for, or the one ``SO_PEERCRED`` gives with ``SO_PEERPIDFD``), or None where it is gone
    or hidden.

    The cgroup is read by the pid, then the pidfd is sent signal 0: a process still there
    held its pid throughout the read, so the read was of it and not of a later process that
    reused the number (one system call, where reading the pidfd's fdinfo twice took most
    of a hello's time)."""
    if pid <= 0:  # in a pid namespace we cannot see
        return None
    path = cgroup_of_pid(pid, proc)
    if path is None:
        return None
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # there, but not ours to signal
        pass
    return path


def peer_pidfd(sock: socket.socket) -> int | None:
    """A pidfd (the caller's to close) of a connected Unix socket's peer, by ``SO_PEERPIDFD``;
    None where the kernel lacks it (before 6.5) or knows no peer process.

    The caller then opens one with ``os.pidfd_open`` on the ``SO_PEERCRED`` pid, which is racy:
    the peer may have exited and its pid been reused in between. Any other error (the peer
    already reaped: ``ESRCH``, or ``EINVAL`` before 6.9) is raised, never answered with None,
    so that a gone peer is not looked up by its pid."""
    try:
        return sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as error:
        if error.errno in (errno.ENOPROTOOPT, errno.ENODATA):
            return None
        raise


def v2_mount(mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified``
    on a hybrid host), from mountinfo; None without one. Only a mount of the hierarchy's root
    counts: a bind mount of a subtree would not match the paths ``/proc/PID/cgroup`` gives."""
    try:
        text = mountinfo.read_bytes()
    except FileNotFoundError:
        return None
    for line in text.split(b"\n"):
        fields = line.split(b" ")
        if b"-" not in fields[5:]:
            continue
        fstype = fields[fields.index(b"-", 5) + 1 :][:1]
        if fstype == [b"cgroup2"] and fields[3] == b"/":
            point = _MOUNT_ESCAPE.sub(lambda m: bytes([int(m[1], 8)]), fields[4])
            return Path(os.fsdecode(point))
    return None
