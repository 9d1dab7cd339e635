"""A daemon client's shared segment: a sealed memfd and the regions its inferences borrow.

The segment is made once per connection (`memfd_create`, sealed against shrinking and
growing so the daemon's mapping can never fault) and handed to the daemon with one
`attach`. Each inference borrows one region for its inputs and then its outputs, and
gives it back when its outputs are copied out. A request that does not fit now waits for
regions to come back; one larger than the whole segment is refused.
"""

from __future__ import annotations

import bisect
import fcntl
import math
import mmap
import os
import threading
import weakref

import numpy as np

from npumanager.daemon.wire.tensors import aligned, view
from npumanager.errors import CapacityError


def sealed_memfd(name: str, data: bytes | None = None, size: int | None = None) -> int:
    """A memfd holding `data` (or `size` zero bytes), sealed so it cannot shrink or grow."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        if data is not None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        else:
            os.ftruncate(fd, size or 0)
        fcntl.fcntl(
            fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


class ClientSegment:
    """The client's end of the segment: its mapping and a first-fit allocator of regions."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = sealed_memfd("npu-manager-tensors", size=size)
        self.memory = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        self._free: list[tuple[int, int]] = [(0, size)]
        """Free stretches as (offset, size), sorted by offset, never adjacent."""
        self._cond = threading.Condition()
        self._taken = 0
        self.base: int = np.frombuffer(self.memory, np.uint8, 0).__array_interface__["data"][0]
        """The mapping's address, to know an array that lies in it (`offset_of`)."""

    def offset_of(self, array: np.ndarray) -> int | None:
        """Where a C-contiguous array lies in the segment (a `shared_array` or a slice of
        one); None if it lies elsewhere."""
        start = array.__array_interface__["data"][0] - self.base
        if start >= 0 and start + array.nbytes <= self.size and array.flags.c_contiguous:
            return int(start)
        return None

    def shared_array(self, shape: tuple[int, ...], dtype: str, timeout: float) -> np.ndarray:
        """A new array of its own region; the region comes back when it is collected."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        offset = self.allocate(nbytes, timeout)
        array = view(self.memory, dtype, shape, offset)
        weakref.finalize(array, self.release, offset, nbytes)
        return array

    def close_descriptor(self) -> None:
        """The daemon has its own: the client keeps only the mapping."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def allocate(self, nbytes: int, timeout: float | None) -> int:
        """The offset of a region of `nbytes` (waiting up to `timeout` for room)."""
        need = aligned(max(1, nbytes))
        if need > self.size:
            raise CapacityError(
                f"an inference needs {need} bytes of shared memory; the segment holds "
                f"{self.size} (connect(shared_bytes=...) for a larger one)"
            )
        with self._cond:
            if not self._cond.wait_for(lambda: self._take(need) is not None, timeout):
                raise CapacityError(
                    f"no {need} bytes of the {self.size}-byte shared segment came free within "
                    f"{timeout:g} s: too many inferences in flight"
                )
            offset = self._taken
        return offset

    def _take(self, need: int) -> int | None:
        for index, (offset, size) in enumerate(self._free):
            if size >= need:
                if size == need:
                    del self._free[index]
                else:
                    self._free[index] = (offset + need, size - need)
                self._taken = offset
                return offset
        return None

    def release(self, offset: int, nbytes: int) -> None:
        """Give a region back (merged with its free neighbours)."""
        size = aligned(max(1, nbytes))
        with self._cond:
            free = self._free
            index = bisect.bisect_left(free, (offset, 0))
            if index < len(free) and free[index][0] == offset + size:
                size += free[index][1]
                del free[index]
            if index > 0 and free[index - 1][0] + free[index - 1][1] == offset:
                offset, size = free[index - 1][0], free[index - 1][1] + size
                del free[index - 1]
                index -= 1
            free.insert(index, (offset, size))
            self._cond.notify_all()

    @property
    def free_bytes(self) -> int:
        """Bytes not lent to any inference."""
        with self._cond:
            return sum(size for _, size in self._free)
