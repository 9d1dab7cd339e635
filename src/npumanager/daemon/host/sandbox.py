"""How a model host confines itself before it reads anything a client sent.

Started as root by a root daemon, a host takes a mount namespace of its own (mounts
private), lays empty tmpfs over the places that hold people's and services' files
(`HIDDEN`, except one that holds the Python the host runs from), works in an empty
directory (made, entered and removed: nothing relative resolves), drops every group,
takes the unprivileged uid and gid it was given, sets no-new-privileges and
not-dumpable, and installs a seccomp filter (`seccomp`). Started by a daemon that is
not root, it can only take the last steps (its uid is the daemon's: the only one such a
daemon can give).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import npumanager
from npumanager.daemon.host import seccomp

log = logging.getLogger(__name__)

_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4

HIDDEN = ("/home", "/root", "/tmp", "/var/tmp", "/run/user", "/srv", "/mnt", "/media")
"""Where people's and services' files live: empty in a host's mount namespace."""

NO_HOME = "/nonexistent"
"""A host's home when it has no private one (its daemon is not root)."""

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _needed() -> list[Path]:
    """The folders the host's own code is imported from: never hidden."""
    places = {sys.prefix, sys.base_prefix, os.path.dirname(npumanager.__file__), *sys.path}
    return [Path(p).resolve() for p in places if p]


def _hide(needed: list[Path]) -> list[str]:
    """Lay an empty tmpfs over each of `HIDDEN` that exists and holds none of `needed`."""
    hidden = []
    for place in HIDDEN:
        path = Path(place)
        if not path.is_dir() or path.is_symlink():
            continue
        if any(p == path or path in p.parents for p in needed):
            continue
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        _check(
            _libc.mount(b"tmpfs", place.encode(), b"tmpfs", flags, b"mode=0755,size=1m"),
            f"mount tmpfs on {place}",
        )
        hidden.append(place)
    return hidden


def _private_home(hidden: list[str], uid: int, gid: int) -> str:
    """A home of the host's own on one of the empty tmpfs it laid (1 MiB: a runtime may
    keep a small cache or an id there, nothing more); `NO_HOME` if it laid none."""
    for place in hidden:
        home = os.path.join(place, "home")
        os.mkdir(home, 0o700)
        os.chown(home, uid, gid)
        return home
    return NO_HOME


_CAP_SETGID, _CAP_SETUID, _CAP_SYS_ADMIN = 6, 7, 21


def can_change_identity(status: Path = Path("/proc/self/status")) -> bool:
    """True if this process may take a mount namespace and another uid: root with
    CAP_SETUID, CAP_SETGID and CAP_SYS_ADMIN in effect (a root daemon a sandbox stripped
    of capabilities may not, and its hosts take the unprivileged path)."""
    if os.geteuid() != 0:
        return False
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
            return all(effective >> cap & 1 for cap in (_CAP_SETGID, _CAP_SETUID, _CAP_SYS_ADMIN))
    return False


def confine(uid: int, gid: int, prepare: Callable[[], object] = lambda: None) -> dict[str, object]:
    """Confine this process as the module says; what it did, for the daemon's log.

    `prepare` runs between the two halves: with the filesystem confined but before the uid
    is dropped, so a runtime installed where only the daemon may read (a Python under
    `/root`, say) still loads; nothing of a client's has been read yet.
    """
    done: dict[str, object] = {}
    os.environ["HOME"] = NO_HOME
    empty = tempfile.mkdtemp(prefix="npu-host-")
    os.chdir(empty)
    os.rmdir(empty)
    if not can_change_identity():
        prepare()
    else:
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        done["hidden"] = hidden = _hide(_needed())
        os.environ["HOME"] = _private_home(hidden, uid, gid)
        prepare()
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    # After the uid changed (a change of credentials clears it): killed with the daemon.
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
    if os.getppid() == 1:  # the daemon died before the line above: no signal will come
        os._exit(0)
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    done["seccomp"] = seccomp.install()
    done["uid"], done["gid"] = os.getuid(), os.getgid()
    return done
