"""Inference lanes: `LoadedModel.run` on a socket and a daemon thread of its connection's own.

On the connection's own path an inference wakes the loop, waits its turn among every
client's frames, and its end goes back through the client's reader thread to the caller.
On a lane the caller sends one binary frame (`daemon.wire.lane`) and blocks in `recv`; the
lane's thread, blocked in `recv` too, checks the frame against the connection's segment,
runs the inference (on itself when a channel is free and the app is not in the
background, else on the driver's workers, as any inference) and writes the outputs and
the reply itself. Nothing of the loop's runs on the way.

The client makes the lane, a SOCK_SEQPACKET socketpair, and sends one end with
`open_lane` (SCM_RIGHTS). A lane acts for its connection only (its models, its segment,
its uid's priority), one inference at a time, and closes with it. A frame that is not
well formed, or names memory outside the segment, gets a `REFUSED` reply and the lane
goes on, after a pause that grows with each refusal in a row (`REFUSAL_PAUSE_S`), which
bounds what a flood of them costs.

An app runs the same model on inputs of the same shapes again and again, so a lane keeps
what its last request frame gave (`Seen`: the decoded request, checked against the segment,
and the arrays over it) and the layout of its last outputs (`Wrote`: the arrays they are
copied into and the reply with its work id left to fill). A frame byte for byte the same,
on the same segment, is that request again; outputs of the same dtypes and shapes in the
same region go where the last ones went.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
import time
import weakref
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from npumanager.core.driver.job import WorkMode
from npumanager.core.service.service import Service
from npumanager.daemon.peer import peer_credentials
from npumanager.daemon.server.frames import call_error
from npumanager.daemon.server.ratelog import RateLimitedLog
from npumanager.daemon.server.stats import DaemonStats
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

_ON_THE_LANE = WorkMode.INLINE | WorkMode.FOREGROUND_ONLY | WorkMode.SYNC
"""A lane's thread runs a foreground inference itself, and only it waits for it."""

if TYPE_CHECKING:
    from npumanager.core.client.manager import LoadedModel
    from npumanager.daemon.server.calls import Calls
    from npumanager.daemon.server.connection import Connection
    from npumanager.daemon.server.segment import SharedSegment

log = logging.getLogger(__name__)
_INTERNAL = RateLimitedLog(log)

REFUSAL_PAUSE_S = (0.001, 0.1)
"""How long a lane rests after a refusal: 1 ms, doubled at each refusal in a row up to
100 ms, until a request is answered. A client sending malformed frames as fast as it can
costs the daemon ten checks a second per lane, not its time."""
_TRUNCATED = int(socket.MSG_TRUNC)
"""recvmsg's flag for a frame longer than the buffer (an int: flag enums are slow)."""
_WORK_ID = struct.Struct("<q")


class Seen(NamedTuple):
    """A lane's last inference request: its frame, the segment it was checked against,
    the request and the arrays over its inputs."""

    frame: bytes
    segment: SharedSegment
    request: Request
    feeds: dict[str, np.ndarray]


class Wrote(NamedTuple):
    """Where a lane's last outputs went: their dtypes and shapes, the region, the arrays
    over their places and the reply, its work id to be filled in."""

    layout: tuple[tuple[Any, tuple[int, ...]], ...]
    region: tuple[SharedSegment, int, int]
    places: list[np.ndarray]
    reply: bytearray


def lane_socket(fd: int, connection: Connection) -> socket.socket:
    """The lane end a client sent: a connected AF_UNIX SOCK_SEQPACKET socket made by the
    same uid (`IllegalArgumentError` otherwise; the descriptor is then closed)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        raise IllegalArgumentError(
            "open_lane needs a socket: one end of socketpair(AF_UNIX, SOCK_SEQPACKET)"
        ) from None
    try:
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            raise IllegalArgumentError(
                f"open_lane needs an AF_UNIX SOCK_SEQPACKET socket; this one is "
                f"{sock.family.name} {sock.type.name}"
            )
        try:
            maker = peer_credentials(sock)
        except OSError:
            raise IllegalArgumentError(
                "open_lane needs a connected socket (a socketpair)"
            ) from None
        if maker.uid != connection.peer.uid:
            raise IllegalArgumentError(
                f"the lane's other end belongs to uid {maker.uid}, not to this client's "
                f"uid {connection.peer.uid}"
            )
        sock.setblocking(True)
    except BaseException:
        sock.close()
        raise
    return sock


class Lane:
    """One connection's lane: its socket and the thread that serves it."""

    def __init__(
        self,
        sock: socket.socket,
        connection: Connection,
        service: Service,
        calls: Calls,
        stats: DaemonStats,
    ) -> None:
        self._sock = sock
        self._connection = weakref.ref(connection)
        self._uid = connection.peer.uid
        self._backend = service.backend
        self._calls = calls
        self._stats = stats
        self._held: list[np.ndarray] | None = None
        """Outputs of the last inference that did not fit their region, for one fetch."""
        self._seen: Seen | None = None
        """The model of the last request, by handle and the request it is loaded under."""
        self._wrote: Wrote | None = None
        self._running: tuple[LoadedModel, int] | None = None
        """The model and work the lane waits for, while it waits (for `cancel`)."""
        self._running_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._serve, name=f"npu-lane-{connection.peer.uid}", daemon=True
        )

    def start(self) -> None:
        """Serve the lane on its own thread until it or its connection closes."""
        self._thread.start()

    def cancel(self) -> bool:
        """Cancel the inference the lane is running: False if it runs none (it ended)."""
        with self._running_lock:
            running = self._running
            if running is None:
                return False
            try:
                self._backend.cancel_work(*running)
            except UnknownWorkError:
                return False
            return True

    def close(self) -> None:
        """Wake the lane's thread for it to finish (it closes the socket itself)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def _serve(self) -> None:
        buffer = bytearray(MAX_LANE_FRAME_BYTES)
        view = memoryview(buffer)
        pause = 0.0
        try:
            while True:
                try:
                    size, _, flags, _ = self._sock.recvmsg_into([buffer])
                except OSError:
                    return
                if size == 0 and not flags & _TRUNCATED:
                    return  # the client closed its end
                try:
                    reply = self._answer(view[:size], flags)
                except Exception as exc:
                    self._stats.internal_errors += 1
                    _INTERNAL.internal_error("a lane request of uid %d raised", self._uid, exc=exc)
                    reply = encode_reply(
                        Status.REFUSED, kind="DaemonError", message="an internal error (logged)"
                    )
                try:
                    self._sock.sendall(reply)
                except OSError:
                    return
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
            connection = self._connection()
            seen = self._seen
            if (
                seen is not None
                and seen.frame == frame
                and connection is not None
                and not connection.closed
                and connection.segment is seen.segment
            ):
                segment, request, feeds = seen.segment, seen.request, seen.feeds
                self._stats.lane_frames_repeated += 1
            else:
                segment, request, feeds = self._checked(frame, connection)
                if request.kind == Kind.FETCH:
                    return self._fetch(segment, request)
            assert connection is not None
            model = self._model(connection, request.model)
            work = self._backend.submit_inference(
                model,
                feeds,
                request.job_priority,
                None,
                None,
                None,
                _ON_THE_LANE,
            )
        except Exception as exc:
            error = call_error(0, exc, self._stats, "a lane request", self._uid)
            return encode_reply(Status.REFUSED, kind=error.kind, message=error.message)
        stats = self._stats
        stats.inferences_on_lane += 1
        if work.inline is not None:
            stats.inferences_inline += 1
        else:
            stats.inferences_to_workers += 1
        del feeds, connection
        self._held = None
        with self._running_lock:
            self._running = (model, work.work_id)
        try:
            outputs = self._backend.outputs(work)
        except CancelledError:
            return encode_reply(Status.CANCELLED, work.work_id)
        except Exception as exc:
            exc.__traceback__ = None  # the work keeps it: no cycle through this frame
            return encode_reply(
                Status.FAILED, work.work_id, kind=type(exc).__name__, message=str(exc)
            )
        finally:
            with self._running_lock:
                self._running = None
        return self._placed(segment, request, outputs, work.work_id)

    def _model(self, connection: Connection, handle: int) -> LoadedModel:
        """The connection's model ``handle`` (the service's own record of it)."""
        return self._calls.model(connection, handle)

    def _checked(
        self, frame: memoryview, connection: Connection | None
    ) -> tuple[SharedSegment, Request, dict[str, np.ndarray]]:
        """A new frame decoded and checked against the connection's segment, and the
        arrays over its inputs (kept as `Seen` when it asks for an inference)."""
        request = decode_request(frame)
        if connection is None or connection.closed or connection.segment is None:
            raise IllegalArgumentError("the lane's connection has no shared segment")
        segment = connection.segment
        check_span(request.out_offset, request.out_size, segment.size, "the output region")
        if request.kind == Kind.FETCH:
            return segment, request, {}
        self._seen = None
        feeds = segment.inputs(request.inputs)
        self._seen = Seen(bytes(frame), segment, request, feeds)
        return segment, request, feeds

    def _placed(
        self, segment: SharedSegment, request: Request, outputs: list[Any], work_id: int
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

    def _fetch(self, segment: SharedSegment, request: Request) -> bytes | bytearray:
        held, self._held = self._held, None
        if held is None:
            raise UnknownWorkError("no outputs are held on this lane")
        return self._placed(segment, request, held, 0)
