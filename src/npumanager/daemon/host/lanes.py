"""Serving an inference lane (`daemon.wire.lane`) where its inferences run: in the daemon,
for a driver that runs models in its own process (`daemon.server.lane`), or in the
connection's model host, the data plane (`daemon.host.direct`).

A thread of the lane's own, blocked in `recv`, reads one binary request frame, checks it
against the client's segment, has the inference run (`LaneServer.infer`, a subclass's),
writes the outputs into the region the request named and sends the reply itself. A frame
that is not well formed, or names memory outside the segment, gets a `REFUSED` reply and
the lane goes on, after a pause that grows with each refusal in a row
(`REFUSAL_PAUSE_S`), which bounds what a flood of them costs.

An app runs the same model on inputs of the same shapes again and again, so a lane keeps
what its last request frame gave (`Seen`: the decoded request, checked against the segment,
and the arrays over it) and the layout of its last outputs (`Wrote`: the arrays they are
copied into and the reply with its work id left to fill). A frame byte for byte the same,
on the same segment, is that request again; outputs of the same dtypes and shapes in the
same region go where the last ones went.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from typing import Any, NamedTuple

import numpy as np

from npumanager.daemon.host.segment import Segment
from npumanager.daemon.wire import tensors
from npumanager.daemon.wire.lane import (
    MAX_LANE_FRAME_BYTES,
    REPLY_WORK_ID_AT,
    Kind,
    Request,
    Status,
    decode_request,
    encode_reply,
)
from npumanager.daemon.wire.tensors import check_span
from npumanager.errors import IllegalArgumentError, UnknownWorkError

REFUSAL_PAUSE_S = (0.001, 0.1)
"""How long a lane rests after a refusal: 1 ms, doubled at each refusal in a row up to
100 ms, until a request is answered. A client sending malformed frames as fast as it can
costs ten checks a second per lane, not the lane's server's time."""
_TRUNCATED = int(socket.MSG_TRUNC)
"""recvmsg's flag for a frame longer than the buffer (an int: flag enums are slow)."""
_WORK_ID = struct.Struct("<q")


class Seen(NamedTuple):
    """A lane's last inference request: its frame, the segment it was checked against,
    the request and the arrays over its inputs."""

    frame: bytes
    segment: Segment
    request: Request
    feeds: dict[str, np.ndarray]


class Wrote(NamedTuple):
    """Where a lane's last outputs went: their dtypes and shapes, the region, the arrays
    over their places and the reply, its work id to be filled in."""

    layout: tuple[tuple[Any, tuple[int, ...]], ...]
    region: tuple[Segment, int, int]
    places: list[np.ndarray]
    reply: bytearray


class Ran(NamedTuple):
    """An inference that ran: its work id and outputs."""

    work_id: int
    outputs: list[Any]


class Served:
    """A socket and the daemon thread that serves it (`_serve`) until it closes."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _serve(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Serve the socket on its own thread until it or its far end closes."""
        self._thread.start()

    def finished(self) -> bool:
        """True once the thread has ended."""
        return self._thread.ident is not None and not self._thread.is_alive()

    def close(self) -> None:
        """Wake the thread for it to finish (it closes the socket itself)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)


class LaneServer(Served):
    """One lane socket and the thread that serves it; a subclass runs the inferences."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        super().__init__(sock, name)
        self._held: list[Any] | None = None
        """Outputs of the last inference that did not fit their region, for one fetch."""
        self._idle_wait_s: float | None = None
        self._seen: Seen | None = None
        self._wrote: Wrote | None = None

    # For subclasses -------------------------------------------------------------------

    def segment(self) -> Segment:
        """The segment requests are checked against now (`IllegalArgumentError` if none)."""
        raise NotImplementedError

    def infer(self, request: Request, feeds: dict[str, np.ndarray]) -> Ran | bytes:
        """Run the request's inference: what ran, or the reply that ends it otherwise (an
        error raised is a `REFUSED` reply, `refusal`'s)."""
        raise NotImplementedError

    def refusal(self, exc: Exception) -> bytes:
        """The `REFUSED` reply to a request that raised `exc` before anything ran."""
        return encode_reply(Status.REFUSED, kind=type(exc).__name__, message=str(exc))

    def internal_error(self, exc: Exception) -> None:
        """A request raised what no check expects (the reply says an internal error)."""

    def repeated(self) -> None:
        """A request frame was byte for byte the last one (a counter's hook)."""

    def idle_after(self, seconds: float | None) -> None:
        """Have the lane's next receive give up after `seconds` with no request and call
        `idle` (None: wait for ever). The wait is `select`'s, to the microsecond: a socket's
        receive timeout is counted in the kernel's ticks (4 ms at HZ=250)."""
        self._idle_wait_s = seconds

    def replied(self) -> None:
        """The reply to a request has been sent (the lane's next frame is read after)."""

    def idle(self) -> None:
        """No request came within the receive timeout a subclass set on the socket."""

    # Serving --------------------------------------------------------------------------

    def _serve(self) -> None:
        buffer = bytearray(MAX_LANE_FRAME_BYTES)
        view = memoryview(buffer)
        pause = 0.0
        try:
            while True:
                try:
                    idle_s = self._idle_wait_s
                    if idle_s is not None and not select.select([self._sock], [], [], idle_s)[0]:
                        self.idle()
                        continue
                    size, _, flags, _ = self._sock.recvmsg_into([buffer])
                except OSError:
                    return
                if size == 0 and not flags & _TRUNCATED:
                    return  # the client closed its end
                try:
                    reply = self._answer(view[:size], flags)
                except Exception as exc:
                    self.internal_error(exc)
                    reply = encode_reply(
                        Status.REFUSED, kind="DaemonError", message="an internal error (logged)"
                    )
                try:
                    self._sock.sendall(reply)
                except OSError:
                    return
                self.replied()
                if reply[0] == Status.REFUSED:
                    pause = min(REFUSAL_PAUSE_S[1], max(REFUSAL_PAUSE_S[0], pause * 2))
                    time.sleep(pause)
                else:
                    pause = 0.0
        finally:
            self._held = self._seen = self._wrote = None
            self._sock.close()

    def _answer(self, frame: memoryview, flags: int) -> bytes | bytearray:
        """The reply to one request frame."""
        try:
            if flags & _TRUNCATED:
                raise IllegalArgumentError(
                    f"a lane frame is at most {MAX_LANE_FRAME_BYTES} bytes; this one was longer"
                )
            segment = self.segment()
            seen = self._seen
            if seen is not None and seen.frame == frame and segment is seen.segment:
                request, feeds = seen.request, seen.feeds
                self.repeated()
            else:
                request, feeds = self._checked(frame, segment)
                if request.kind == Kind.FETCH:
                    return self._fetch(segment, request)
            ran = self.infer(request, feeds)
            del feeds
            self._held = None
        except Exception as exc:
            return self.refusal(exc)
        if not isinstance(ran, Ran):
            return ran
        return self._placed(segment, request, ran.outputs, ran.work_id)

    def _checked(
        self, frame: memoryview, segment: Segment
    ) -> tuple[Request, dict[str, np.ndarray]]:
        """A new frame decoded and checked against the segment, and the arrays over its
        inputs (kept as `Seen` when it asks for an inference)."""
        request = decode_request(frame)
        check_span(request.out_offset, request.out_size, segment.size, "the output region")
        if request.kind == Kind.FETCH:
            return request, {}
        self._seen = None
        feeds = segment.inputs(request.inputs)
        self._seen = Seen(bytes(frame), segment, request, feeds)
        return request, feeds

    def _placed(
        self, segment: Segment, request: Request, outputs: list[Any], work_id: int
    ) -> bytes | bytearray:
        """Write the outputs into the request's region: the reply, or HELD if they do not
        fit (kept for one `FETCH`)."""
        region = (segment, request.out_offset, request.out_size)
        wrote = self._wrote
        if wrote is not None and wrote.region == region:
            layout = tuple((out.dtype, out.shape) for out in outputs if type(out) is np.ndarray)
            if layout == wrote.layout and len(layout) == len(outputs):
                for place, out in zip(wrote.places, outputs, strict=True):
                    np.copyto(place, out)
                _WORK_ID.pack_into(wrote.reply, REPLY_WORK_ID_AT, work_id)
                return wrote.reply
        self._wrote = None
        try:
            placed = segment.write_at(outputs, request.out_offset, request.out_size)
        except IllegalArgumentError as exc:
            return encode_reply(Status.FAILED, work_id, kind=type(exc).__name__, message=str(exc))
        if isinstance(placed, int):
            self._held = outputs
            return encode_reply(Status.HELD, work_id, held_bytes=placed)
        reply = encode_reply(Status.COMPLETED, work_id, outputs=placed)
        if request.kind == Kind.INFER and all(type(out) is np.ndarray for out in outputs):
            places = [tensors.view(segment.memory, p.dtype, p.shape, p.offset) for p in placed]
            layout = tuple((out.dtype, out.shape) for out in outputs)
            self._wrote = Wrote(layout, region, places, bytearray(reply))
        return reply

    def _fetch(self, segment: Segment, request: Request) -> bytes | bytearray:
        held, self._held = self._held, None
        if held is None:
            raise UnknownWorkError("no outputs are held on this lane")
        return self._placed(segment, request, held, 0)
