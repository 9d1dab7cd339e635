"""inotify through ctypes: a descriptor, watches on folders, and the events read from it.

The standard library has no inotify; the three calls are libc's (``inotify_init1``,
``inotify_add_watch``, ``inotify_rm_watch``) and the events are parsed from the bytes
``read`` returns (``struct inotify_event``: wd, mask, cookie, len, then the name).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from dataclasses import dataclass
from typing import Final

IN_ATTRIB: Final = 0x0000_0004
"""Metadata changed: an extended attribute was set or removed."""
IN_MOVED_FROM: Final = 0x0000_0040
IN_MOVED_TO: Final = 0x0000_0080
IN_CREATE: Final = 0x0000_0100
IN_DELETE: Final = 0x0000_0200
IN_DELETE_SELF: Final = 0x0000_0400
IN_Q_OVERFLOW: Final = 0x0000_4000
"""Events were lost: the queue overflowed; whoever watches must look again."""
IN_IGNORED: Final = 0x0000_8000
"""The watch is gone (its folder was removed, or it was removed)."""
IN_ONLYDIR: Final = 0x0100_0000
IN_ISDIR: Final = 0x4000_0000
IN_NONBLOCK: Final = os.O_NONBLOCK
IN_CLOEXEC: Final = os.O_CLOEXEC

_HEADER = struct.Struct("iIII")
_READ_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Event:
    """One event: the watch it came from, what happened, and the name in the folder."""

    wd: int
    mask: int
    name: bytes


class Inotify:
    """A non-blocking inotify descriptor (`fileno` for poll) with its watches."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise _error("inotify_init1")
        self._fd: int = fd

    def fileno(self) -> int:
        """The descriptor, readable when events wait."""
        return self._fd

    def add_watch(self, path: bytes, mask: int) -> int:
        """Watch a folder (``os.fsencode`` of its path) for ``mask``; the watch descriptor.

        The same folder watched again gives the same descriptor, its mask replaced."""
        wd: int = self._libc.inotify_add_watch(self._fd, path, ctypes.c_uint32(mask))
        if wd < 0:
            raise _error("inotify_add_watch", path)
        return wd

    def rm_watch(self, wd: int) -> None:
        """Stop a watch; one already gone (its folder removed) is fine."""
        if self._libc.inotify_rm_watch(self._fd, wd) < 0 and ctypes.get_errno() != errno.EINVAL:
            raise _error("inotify_rm_watch")

    def read(self) -> list[Event]:
        """The events waiting now ([] for none)."""
        try:
            data = os.read(self._fd, _READ_BYTES)
        except BlockingIOError:
            return []
        return parse(data)

    def close(self) -> None:
        """Close the descriptor (every watch ends with it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def parse(data: bytes) -> list[Event]:
    """The events in the bytes one ``read`` of an inotify descriptor gave."""
    events = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        name = data[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        events.append(Event(wd, mask, name))
    return events


def _error(call: str, path: bytes | None = None) -> OSError:
    code = ctypes.get_errno()
    if path is None:
        return OSError(code, f"{call}: {os.strerror(code)}")
    return OSError(code, f"{call}: {os.strerror(code)}", os.fsdecode(path))
