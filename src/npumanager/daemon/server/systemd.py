"""The daemon as a systemd service: sockets it inherits, and what it tells the manager.

Socket activation hands the daemon its listening socket as descriptor 3 onwards
(`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`); `Type=notify` wants `READY=1` once it
serves, `STOPPING=1` when it begins to stop, and `WATCHDOG=1` at least every
`WATCHDOG_USEC`, each a datagram to `NOTIFY_SOCKET` (a path, or an abstract name after
`@`). Outside systemd every call here is a no-op.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Mapping, MutableMapping

from npumanager.errors import NpuManagerError

log = logging.getLogger(__name__)

LISTEN_FDS_START = 3
"""The first inherited descriptor (`SD_LISTEN_FDS_START`)."""
_ACTIVATION_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def inherited_sockets(
    environ: MutableMapping[str, str] | None = None, *, pid: int | None = None
) -> list[tuple[str, socket.socket]]:
    """The listening sockets systemd passed to this process, with their names.

    The variables are removed once read, so no child inherits them. Descriptors meant for
    another process (`LISTEN_PID` not ours) are left alone. A descriptor that is not a
    listening stream socket is an `NpuManagerError` naming it.
    """
    env = os.environ if environ is None else environ
    if env.get("LISTEN_PID") is None or env.get("LISTEN_FDS") is None:
        return []
    try:
        for_pid, count = int(env["LISTEN_PID"]), int(env["LISTEN_FDS"])
    except ValueError:
        raise NpuManagerError(
            f"LISTEN_PID and LISTEN_FDS must be numbers; got {env['LISTEN_PID']!r} and "
            f"{env['LISTEN_FDS']!r}"
        ) from None
    names = env.get("LISTEN_FDNAMES", "").split(":")
    for name in _ACTIVATION_VARIABLES:
        env.pop(name, None)
    if for_pid != (os.getpid() if pid is None else pid):
        return []
    sockets = []
    for index in range(count):
        fd = LISTEN_FDS_START + index
        name = names[index] if index < len(names) and names[index] else f"fd{fd}"
        sockets.append((name, _listening_socket(fd, name)))
    return sockets


def _listening_socket(fd: int, name: str) -> socket.socket:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        raise NpuManagerError(f"inherited descriptor {fd} ({name}) is not open") from None
    if not stat.S_ISSOCK(mode):
        raise NpuManagerError(f"inherited descriptor {fd} ({name}) is not a socket")
    sock = socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise NpuManagerError(
            f"inherited descriptor {fd} ({name}) is not a Unix stream socket; "
            "the socket unit needs ListenStream=/path"
        )
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise NpuManagerError(
            f"inherited descriptor {fd} ({name}) is not listening (Accept=no is needed)"
        )
    return sock


def notify_address(environ: Mapping[str, str] | None = None) -> str | bytes | None:
    """Where `NOTIFY_SOCKET` points: a path, an abstract address as bytes, or None."""
    env = os.environ if environ is None else environ
    target = env.get("NOTIFY_SOCKET")
    if not target:
        return None
    if target.startswith("@"):
        return b"\0" + target[1:].encode()
    if target.startswith("/"):
        return target
    log.warning("ignoring NOTIFY_SOCKET=%r: neither a path nor an abstract name", target)
    return None


class Notifier:
    """Sends state changes to the service manager; does nothing outside systemd."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.address = notify_address(environ)
        self.sent: list[str] = []
        self._socket: socket.socket | None = None
        env = os.environ if environ is None else environ
        self.watchdog_s = _watchdog_interval(env)

    def notify(self, *states: str) -> bool:
        """Send `states` (e.g. "READY=1", "STATUS=...") in one datagram; True if sent."""
        if self.address is None:
            return False
        message = "\n".join(states)
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._socket.sendto(message.encode(), self.address)
        except OSError as exc:
            log.warning("cannot notify the service manager (%s): %s", self.address, exc)
            return False
        self.sent.append(message)
        return True

    def close(self) -> None:
        """Close the notification socket."""
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()
            self._socket = None


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """How often to send WATCHDOG=1: half of `WATCHDOG_USEC`, if it is meant for us."""
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not a number of microseconds", usec)
        return None
    return value / 2e6 if value > 0 else None
