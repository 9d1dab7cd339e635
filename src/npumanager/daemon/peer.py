"""Who is on the other end of a Unix socket, as the kernel says, and where the socket lives."""

from __future__ import annotations

import grp
import os
import socket
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from npumanager.errors import NpuManagerError
from npumanager.userdirs import user_dir

APP_NAME = "npu-manager"
SOCKET_NAME = "npu.sock"
SOCKET_ENV = "NPUMANAGER_SOCKET"
"""An environment variable naming the socket, for clients and the daemon alike."""
SYSTEM_SOCKET_PATH = "/run/npu-manager/npu.sock"
"""The system service's socket (its socket unit's `ListenStream=`)."""

_UCRED = struct.Struct("iII")
"""struct ucred: pid_t (signed), uid_t and gid_t (unsigned 32-bit: ids of 2**31 and more exist)."""
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
"""Linux's option for the peer's supplementary groups (not every Python names it)."""
_MAX_GROUPS = 256
"""Python reads at most 1024 bytes of a socket option: 256 group ids."""


@dataclass(frozen=True)
class PeerCredentials:
    """The uid, gid and pid of a connected peer, and its supplementary groups."""

    uid: int
    gid: int
    pid: int
    groups: frozenset[int]

    def in_group(self, gid: int) -> bool:
        """True if `gid` is the peer's primary or one of its supplementary groups."""
        return gid == self.gid or gid in self.groups


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """The kernel's record of who connected `sock` (SO_PEERCRED, SO_PEERGROUPS)."""
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return PeerCredentials(uid=uid, gid=gid, pid=pid, groups=_peer_groups(sock))


def _peer_groups(sock: socket.socket) -> frozenset[int]:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 4 * _MAX_GROUPS)
    except OSError:
        return frozenset()
    count = len(raw) // 4
    return frozenset(struct.unpack(f"{count}I", raw[: 4 * count]))


def answers(path: Path) -> bool:
    """True if something accepts connections on the Unix socket at `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def user_socket_path() -> Path:
    """`npu-manager/npu.sock` in the user's runtime directory: where `serve` listens."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        return (
            user_dir(platformdirs.user_runtime_dir, "NPUMANAGER_SOCKET or --socket") / SOCKET_NAME
        )


def socket_file(path: str | Path, named_by: str) -> Path:
    """`path` if it can name a socket file, else a one-line `NpuManagerError` saying what
    named it (`--socket`, the variable): empty, ".", "/" and the like name no file."""
    text = str(path)
    if not text or Path(text).name in ("", ".", ".."):
        got = repr(text) if text else "an empty path"
        raise NpuManagerError(f"{named_by} must name the daemon's socket file; got {got}")
    return Path(text)


def named_socket() -> Path | None:
    """The socket `$NPUMANAGER_SOCKET` names, or None when it is unset; set but empty (or
    naming no file) is a one-line `NpuManagerError`, never taken as unset."""
    named = os.environ.get(SOCKET_ENV)
    if named is None:
        return None
    if not named:
        raise NpuManagerError(
            f"{SOCKET_ENV} is set but empty; unset it to use the default socket, or set it "
            "to the socket file's path"
        )
    return socket_file(named, SOCKET_ENV)


def default_socket_path() -> Path:
    """Where a client looks: `$NPUMANAGER_SOCKET`; else the user's own daemon's socket if
    there is one; else the system service's (`SYSTEM_SOCKET_PATH`) if there is one; else
    the user's (so the error names it)."""
    named = named_socket()
    if named is not None:
        return named
    user = user_socket_path()
    if not user.exists() and Path(SYSTEM_SOCKET_PATH).exists():
        return Path(SYSTEM_SOCKET_PATH)
    return user


def group_id(name_or_id: str) -> int:
    """A group's id from its name or number; `NpuManagerError` if there is no such group."""
    if name_or_id.isdigit():
        return int(name_or_id)
    try:
        return grp.getgrnam(name_or_id).gr_gid
    except KeyError:
        raise NpuManagerError(f"no group named {name_or_id!r} on this machine") from None
