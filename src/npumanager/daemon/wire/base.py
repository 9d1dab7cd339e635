"""The frame layer both ends of a daemon connection share: a body's length (4 bytes,
big-endian) before its JSON, the error for a frame that is not allowed, the base of every
message, and the reader that cuts a byte stream into bodies."""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict

from npumanager.errors import NpuManagerError
from npumanager.schemas.limits import FRAME_HEADER_BYTES, MAX_FRAME_BYTES
from npumanager.schemas.types import NonNegativeInt64

HEADER = struct.Struct(">I")
assert HEADER.size == FRAME_HEADER_BYTES


class ProtocolError(NpuManagerError, ValueError):
    """A frame that is too large, not JSON, or not a message this protocol version knows."""


class WireModel(BaseModel):
    """Frozen and strict, no extra keys: the form of every frame body."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class Call(WireModel):
    """A client frame that gets exactly one reply or error with its `seq`."""

    seq: NonNegativeInt64


def framed(body: bytes) -> bytes:
    """The frame of a body already encoded: its length, then the body."""
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Cuts a byte stream into frame bodies; `ProtocolError` on an oversized frame.

    What it received stays in the pieces it came in until a whole frame is there, so a
    large frame arriving a piece at a time is copied once, when it is whole, not once per
    piece as a growing buffer would copy it (a client holding a frame just short of its
    end costs the daemon one copy of what it sent, however many pieces).
    """

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.max_frame = max_frame
        self._pieces: deque[bytes] = deque()
        self._at = 0
        """Where the first piece's unread bytes begin."""
        self._pending = 0

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Every complete frame body the stream holds after `data`, in order."""
        self.push(data)
        while (body := self.pop()) is not None:
            yield body

    def push(self, data: bytes) -> None:
        """Append received bytes; `pop` takes the frames out one at a time."""
        if data:
            self._pieces.append(data if type(data) is bytes else bytes(data))
            self._pending += len(data)

    def pop(self) -> bytes | None:
        """The next complete frame body, or None; `ProtocolError` on a bad length."""
        if self._pending < FRAME_HEADER_BYTES:
            return None
        size = self._size()
        if size == 0 or size > self.max_frame:
            raise ProtocolError(
                f"frame length {size} is not allowed: a body is 1..{self.max_frame} bytes"
            )
        end = FRAME_HEADER_BYTES + size
        if self._pending < end:
            return None
        first, at = self._pieces[0], self._at
        if len(first) - at >= end:  # the usual case: the whole frame in the first piece
            body = first[at + FRAME_HEADER_BYTES : at + end]
            self._advance(first, at + end, end)
            return body
        self._take(FRAME_HEADER_BYTES)
        return self._take(size)

    def _size(self) -> int:
        """The length the next frame's header gives (at least its 4 bytes are here)."""
        pieces = self._pieces
        if len(pieces[0]) - self._at < FRAME_HEADER_BYTES:  # the header spans pieces
            joined = pieces.popleft()[self._at :]
            while len(joined) < FRAME_HEADER_BYTES:
                joined += pieces.popleft()
            pieces.appendleft(joined)
            self._at = 0
        size: int = HEADER.unpack_from(pieces[0], self._at)[0]
        return size

    def _advance(self, first: bytes, at: int, taken: int) -> None:
        if at == len(first):
            self._pieces.popleft()
            at = 0
        self._at = at
        self._pending -= taken

    def _take(self, count: int) -> bytes:
        """The next `count` bytes (no more than are here), out of the pieces."""
        pieces = self._pieces
        first, at = pieces[0], self._at
        if len(first) - at >= count:
            part = first[at : at + count]
            self._advance(first, at + count, count)
            return part
        parts = [first[at:]]
        got = len(parts[0])
        pieces.popleft()
        at = 0
        while got < count:
            piece = pieces[0]
            need = count - got
            if len(piece) <= need:
                parts.append(piece)
                got += len(piece)
                pieces.popleft()
            else:
                parts.append(piece[:need])
                got, at = count, need
        self._at = at
        self._pending -= count
        return b"".join(parts)

    def release(self) -> None:
        """Drop whatever is buffered and give its memory back."""
        self._pieces = deque()
        self._at = 0
        self._pending = 0

    @property
    def pending(self) -> int:
        """Bytes received and not yet taken as frames."""
        return self._pending

    @property
    def ready(self) -> bool:
        """True when `pop` has something to say now: a whole frame, or a length it refuses."""
        if self._pending < FRAME_HEADER_BYTES:
            return False
        size = self._size()
        return size == 0 or size > self.max_frame or self._pending - FRAME_HEADER_BYTES >= size
