"""A client's shared segment as the daemon maps it, and model files read from descriptors.

The daemon maps only a memfd the client sealed against shrinking (`F_SEAL_SHRINK`): a
segment the client could shrink under the mapping would fault the daemon on its next
touch. Every tensor the client names is bounds-checked against the segment before an
array is made over it. A model arrives as a descriptor the client opened, so the daemon
reads only what the client could read and never opens a path for it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat

from npumanager.daemon.host.segment import Segment
from npumanager.daemon.host.shared import share
from npumanager.daemon.wire import protocol as p
from npumanager.errors import CapacityError, IllegalArgumentError


class SharedSegment(Segment):
    """A client's memfd mapped read-write; arrays are made over it only after checks."""

    def __init__(self, fd: int, size: int, limit: int) -> None:
        if size <= 0 or size > limit:
            raise CapacityError(
                f"a shared segment of {size} bytes is not allowed: 1..{limit} bytes "
                "(serve --max-shared-mib)"
            )
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IllegalArgumentError("the shared segment must be a memfd (memfd_create)")
        if info.st_size != size:
            raise IllegalArgumentError(
                f"the shared segment holds {info.st_size} bytes but the frame says {size}"
            )
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        if not seals & fcntl.F_SEAL_SHRINK:
            raise IllegalArgumentError(
                "the shared segment must be a memfd sealed against shrinking "
                "(MFD_ALLOW_SEALING, then F_ADD_SEALS with F_SEAL_SHRINK)"
            )
        try:
            memory = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except OSError as exc:
            raise IllegalArgumentError(f"the shared segment cannot be mapped: {exc}") from None
        super().__init__(memory, size)
        self.shared = share(self.memory, fd)
        """The segment as model hosts map it too (`daemon.host.shared`)."""

    def bytes_at(self, span: p.Span) -> bytes:
        """A copy of the span's bytes (a small model sent in the segment)."""
        self.check(span, "the model's bytes")
        return self.memory[span.offset : span.offset + span.size]
