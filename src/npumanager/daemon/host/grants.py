"""What a model host was allowed to run, by the daemon's own clock: the time its grants
were open, summed over the grants open at once. The daemon holds the CPU time the kernel
counts for the host to it (`daemon.server.audit`); nothing here is the host's word.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
import time

from npumanager.daemon.wire.gate import PAGE, PAGE_BYTES

F_SEAL_FUTURE_WRITE = 0x0010
"""fcntl's seal (Linux 5.1) after which no new writable mapping or write is allowed, while
the mappings made before keep writing: the daemon's grant page, mapped read-only by hosts."""
_SEALS = F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class Grants:
    """The grant time of one host: runs sent it on a runner, and direct runs and leases
    its gates let go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._since = time.monotonic_ns()
        self._total = 0

    def opened(self) -> None:
        """A grant began now."""
        with self._lock:
            self._settle()
            self._open += 1

    def closed(self) -> None:
        """A grant ended now."""
        with self._lock:
            self._settle()
            self._open = max(0, self._open - 1)

    def total_ns(self) -> int:
        """The grant time so far, in ns (a grant open for 1 s counts 1 s, two at once 2 s)."""
        with self._lock:
            self._settle()
            return self._total

    @property
    def open(self) -> int:
        """How many grants are open now."""
        return self._open

    def _settle(self) -> None:
        now = time.monotonic_ns()
        self._total += self._open * (now - self._since)
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
