"""What a model host was allowed to run, by the daemon's own clock: the time its grants
were open, summed over the grants open at once. The daemon holds the CPU time the kernel
counts for the host to it (`daemon.server.audit`); nothing here is the host's word.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import mmap
import os
import threading
import time

from npumanager.daemon.wire.gate import PAGE, PAGE_BYTES
from npumanager.schemas.limits import STOPPED_GRANT_S

F_SEAL_FUTURE_WRITE = 0x0010
"""fcntl's seal (Linux 5.1) after which no new writable mapping or write is allowed, while
the mappings made before keep writing: the daemon's grant page, mapped read-only by hosts."""
_SEALS = F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class Grants:
    """The grant time of one host: runs sent it on a runner, and direct runs and leases
    its gates let go. A grant the daemon stopped (`stopped`: a cancel, an unload, room
    made) counts `STOPPED_GRANT_S` more at most, however long the host takes to heed it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._open: dict[int, int | None] = {}
        """Each open grant's id, and the time it stops counting if the daemon stopped it."""
        self._since = time.monotonic_ns()
        self._total = 0

    def opened(self) -> int:
        """A grant began now: its id."""
        grant = next(self._ids)
        with self._lock:
            self._settle()
            self._open[grant] = None
        return grant

    def stopped(self, grant: int) -> None:
        """The daemon stopped what `grant` let the host run: it counts at most
        `STOPPED_GRANT_S` more (nothing, if it has closed or was stopped before)."""
        with self._lock:
            if grant in self._open and self._open[grant] is None:
                self._settle()
                self._open[grant] = self._since + int(STOPPED_GRANT_S * 1e9)

    def closed(self, grant: int) -> None:
        """`grant` ended now (nothing, if it had)."""
        with self._lock:
            self._settle()
            self._open.pop(grant, None)

    def total_ns(self) -> int:
        """The grant time so far, in ns (a grant open for 1 s counts 1 s, two at once 2 s)."""
        with self._lock:
            self._settle()
            return self._total

    @property
    def open(self) -> int:
        """How many grants are open now (a stopped one until it closes)."""
        return len(self._open)

    @property
    def unheeded(self) -> int:
        """How many open grants were stopped `STOPPED_GRANT_S` ago or more: the host goes
        on with their runs on its own account."""
        now = time.monotonic_ns()
        with self._lock:
            return sum(until is not None and until <= now for until in self._open.values())

    def _settle(self) -> None:
        now, since = time.monotonic_ns(), self._since
        for until in self._open.values():
            self._total += max(0, (now if until is None else min(now, until)) - since)
        self._since = now


class GrantPage:
    """A host's grant page (`daemon.wire.gate.PAGE`): a sealed memfd only the daemon's
    mapping writes; the host maps a read-only descriptor of it (`read_only`)."""

    def __init__(self) -> None:
        fd = os.memfd_create("npu-grants", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, PAGE_BYTES)
            self._memory = mmap.mmap(fd, PAGE_BYTES, flags=mmap.MAP_SHARED)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            self.read_only = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(fd)
        self._lock = threading.Lock()
        self.generation = 0
        """The generation in force: a lease granted under another no longer holds."""

    def revoke(self) -> None:
        """Take back every lease granted so far: the generation moves on (nothing, once
        the page is closed)."""
        with self._lock:
            self.generation += 1
            if not self._memory.closed:
                PAGE.pack_into(self._memory, 0, self.generation)

    def close(self) -> None:
        """Close the read-only descriptor and the daemon's mapping (which holds a
        descriptor of its own): the host has its own, or is gone."""
        with self._lock:
            self._memory.close()
        with contextlib.suppress(OSError):
            os.close(self.read_only)
