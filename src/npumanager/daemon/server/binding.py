"""Taking the daemon's socket path safely: the lock beside it, the socket, its group.

The daemon may run as root in a directory others can write to, so nothing here follows a
symbolic link or trusts a file it did not create, and a failure leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import resource
import socket
import stat
from pathlib import Path

from npumanager.daemon.peer import answers
from npumanager.errors import NpuManagerError
from npumanager.schemas.limits import SOCKET_MODE

log = logging.getLogger(__name__)

_LISTEN_BACKLOG = 512


def lock_path(path: Path) -> Path:
    """The lock file that marks `path` as served: `<socket>.lock`."""
    return path.with_name(path.name + ".lock")


class Binding:
    """The listening socket at a path, and the lock that keeps a second daemon off it.

    An inherited socket (systemd's socket activation) has no lock: its socket unit owns
    the path, and closing leaves the file for the next activation.
    """

    def __init__(self, path: Path, listener: socket.socket, lock_fd: int | None) -> None:
        self.path = path
        self.listener = listener
        self._lock_fd = lock_fd
        self.inherited = lock_fd is None

    @classmethod
    def adopt(cls, listener: socket.socket) -> Binding:
        """A binding for a listening socket handed over by the service manager."""
        listener.setblocking(False)
        name = listener.getsockname()
        return cls(Path(name if isinstance(name, str) else "<unnamed>"), listener, None)

    def close(self) -> None:
        """Stop listening; remove the socket and the lock file unless they were inherited."""
        self.listener.close()
        if self.inherited:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        if self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                lock_path(self.path).unlink()
            os.close(self._lock_fd)
            self._lock_fd = None


def bind(path: Path, *, socket_group: int | None, create_parent: bool) -> Binding:
    """Refuse a live daemon, replace a stale socket, listen with mode 0660 and `socket_group`.

    The directory must exist unless `create_parent` (the default runtime directory) is set.
    """
    parent = path.parent
    if not parent.is_dir():
        if not create_parent:
            raise NpuManagerError(
                f"the socket's directory {parent} does not exist; create it or choose --socket"
            )
        parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    lock_fd = take_lock(path)
    try:
        _clear(path)
        listener = _listen(path, socket_group)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            lock_path(path).unlink()
        os.close(lock_fd)
        raise
    return Binding(path, listener, lock_fd)


def _clear(path: Path) -> None:
    if not (path.exists() or path.is_symlink()):
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise NpuManagerError(f"{path} exists and is not a socket; remove it or choose --socket")
    if answers(path):
        raise NpuManagerError(f"a daemon is already serving {path}")
    log.info("replacing the stale socket %s", path)
    path.unlink()


def _listen(path: Path, socket_group: int | None) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o777 & ~SOCKET_MODE)
    try:
        listener.bind(str(path))
    except OSError:
        listener.close()
        raise
    finally:
        os.umask(old_umask)
    try:
        os.chmod(path, SOCKET_MODE)
        if socket_group is not None:
            os.chown(path, -1, socket_group)
    except OSError as exc:
        listener.close()
        path.unlink()
        what = "the group of" if socket_group is not None else "the mode of"
        raise NpuManagerError(f"cannot set {what} {path}: {exc.strerror}") from None
    listener.listen(_LISTEN_BACKLOG)
    listener.setblocking(False)
    return listener


def take_lock(path: Path) -> int:
    """Hold `<socket>.lock` for the daemon's life; refuse a link, a stranger's file, a holder."""
    lock = lock_path(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(lock, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NpuManagerError(
                f"{lock} is a symbolic link; remove it (the daemon never follows one there)"
            ) from None
        raise NpuManagerError(f"cannot open the lock file {lock}: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise NpuManagerError(
            f"{lock} is not a regular file owned by uid {os.geteuid()}; remove it"
        )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
            raise NpuManagerError(f"a daemon is already serving {path}") from None
        raise
    return fd


def raise_descriptor_limit() -> int:
    """Lift the soft limit on open descriptors to the hard one; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, hard, exc)
    return soft
