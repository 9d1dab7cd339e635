"""The frame layer both ends of a daemon connection share: a body's length (4 bytes,
big-endian) before its JSON, the error for a frame that is not allowed, the base of every
message, and the reader that cuts a byte stream into bodies."""

from __future__ import annotations

import struct
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
    """Cuts a byte stream into frame bodies; `ProtocolError` on an oversized frame."""

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Every complete frame body the stream holds after `data`, in order."""
        buffer = self._buffer
        buffer += data
        start = 0
        end = len(buffer)
        try:
            while end - start >= FRAME_HEADER_BYTES:
                (size,) = HEADER.unpack_from(buffer, start)
                if size == 0 or size > self.max_frame:
                    raise ProtocolError(
                        f"frame length {size} is not allowed: a body is 1..{self.max_frame} bytes"
                    )
                if end - start - FRAME_HEADER_BYTES < size:
                    break
                body_start = start + FRAME_HEADER_BYTES
                start = body_start + size
                yield bytes(buffer[body_start:start])
        finally:
            del buffer[:start]

    def push(self, data: bytes) -> None:
        """Append received bytes; `pop` takes the frames out one at a time."""
        self._buffer += data

    def pop(self) -> bytes | None:
        """The next complete frame body, or None; `ProtocolError` on a bad length."""
        buffer = self._buffer
        if len(buffer) < FRAME_HEADER_BYTES:
            return None
        (size,) = HEADER.unpack_from(buffer, 0)
        if size == 0 or size > self.max_frame:
            raise ProtocolError(
                f"frame length {size} is not allowed: a body is 1..{self.max_frame} bytes"
            )
        end = FRAME_HEADER_BYTES + size
        if len(buffer) < end:
            return None
        body = bytes(buffer[FRAME_HEADER_BYTES:end])
        del buffer[:end]
        return body

    def release(self) -> None:
        """Drop whatever is buffered and give its memory back."""
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes received and not yet taken as frames."""
        return len(self._buffer)

    @property
    def ready(self) -> bool:
        """True when `pop` has something to say now: a whole frame, or a length it refuses."""
        buffer = self._buffer
        if len(buffer) < FRAME_HEADER_BYTES:
            return False
        size: int = HEADER.unpack_from(buffer, 0)[0]
        return size == 0 or size > self.max_frame or len(buffer) - FRAME_HEADER_BYTES >= size
