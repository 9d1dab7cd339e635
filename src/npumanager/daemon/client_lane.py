"""The client's end of its inference lane (`daemon.lane`): `LoadedModel.run` by the caller.

The calling thread writes the inputs into the lane's own region of the segment, sends one
frame and reads the reply itself: no reader thread between it and the daemon. One thread
uses the lane at a time; a second caller meanwhile, a run with a timeout and `submit`
take the connection's own path. A lane interrupted mid-exchange (a signal, a dropped
daemon) is closed for good, and the connection's path serves from then on.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from npumanager.daemon.lane_frames import MAX_LANE_FRAME_BYTES, Reply, decode_reply
from npumanager.daemon.shared_memory import ClientSegment
from npumanager.daemon.tensors import aligned
from npumanager.errors import DaemonUnavailableError, IllegalArgumentError

_TRUNCATED = int(socket.MSG_TRUNC)


class ClientLane:
    """One lane socket; `exchange` is one request and its reply."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._buffer = bytearray(MAX_LANE_FRAME_BYTES)
        self._region = (0, 0)
        """The lane's own region of the segment, as (offset, size), kept from run to run."""
        self.open = True

    def try_take(self) -> bool:
        """Take the lane for one run: False if it is closed or another thread has it."""
        return self.open and self._lock.acquire(blocking=False)

    def give_back(self) -> None:
        """The run is over."""
        self._lock.release()

    def region(self, segment: ClientSegment, nbytes: int, timeout: float) -> int:
        """The offset of the lane's region, grown to at least `nbytes` (the lane taken)."""
        offset, size = self._region
        if size < nbytes:
            if size:
                segment.release(offset, size)
                self._region = (0, 0)
            self._region = (segment.allocate(nbytes, timeout), aligned(nbytes))
        return self._region[0]

    def exchange(self, frame: bytes) -> Reply:
        """Send one request and read its reply (the lane taken)."""
        try:
            self._sock.sendall(frame)
            size, _, flags, _ = self._sock.recvmsg_into([self._buffer])
        except OSError:
            self.close()
            raise DaemonUnavailableError("the daemon closed the inference lane") from None
        except BaseException:
            self.close()  # its reply would come to the next request
            raise
        if size == 0 and not flags & _TRUNCATED:
            self.close()
            raise DaemonUnavailableError("the daemon closed the inference lane")
        try:
            if flags & _TRUNCATED:
                raise IllegalArgumentError("the daemon's lane reply is over the lane's limit")
            return decode_reply(memoryview(self._buffer)[:size])
        except IllegalArgumentError as exc:
            self.close()
            raise DaemonUnavailableError(
                f"the daemon sent an unreadable lane reply: {exc}"
            ) from None

    def close(self) -> None:
        """Close the lane; the connection's own path serves from now on."""
        self.open = False
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
