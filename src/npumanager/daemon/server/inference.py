"""The daemon's real-inference calls: attach a segment, load a real model, infer, fetch.

Models are read and opened on a loader thread (a runtime may take seconds to open one),
and the call is answered from the loop when that is done.

Inputs are arrays over the client's shared segment, checked before they are made; the
outputs are written into the region the client named by the worker thread that ran the
inference, which sends the `WorkEnded` frame itself when nothing waits before it in the
connection's outbox (else the loop queues it). Outputs too large for their region are
held (at most `MAX_HELD_RESULTS` a connection) for a `fetch`.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from npumanager.apps.registry import fallback_id
from npumanager.checks import group_bytes
from npumanager.core.client.dispatch import Task
from npumanager.core.client.manager import LoadedModel
from npumanager.core.driver.job import WorkMode
from npumanager.core.service.service import Service
from npumanager.daemon.host.client import InHost, ModelFile, ModelHost
from npumanager.daemon.server.calls import NO_REPLY, Calls, Handler, NoReply
from npumanager.daemon.server.connection import Connection
from npumanager.daemon.server.direct import Gate
from npumanager.daemon.server.frames import call_error, clip
from npumanager.daemon.server.hosting import Hosting
from npumanager.daemon.server.lane import Lane, lane_socket
from npumanager.daemon.server.leadership import Leadership
from npumanager.daemon.server.loader import Loader, close_all
from npumanager.daemon.server.segment import SharedSegment
from npumanager.daemon.server.stats import DaemonStats
from npumanager.daemon.wire import protocol as p
from npumanager.errors import (
    CapacityError,
    DaemonUnavailableError,
    IllegalArgumentError,
    ModelHostError,
    NpuManagerError,
    QuotaExceededError,
    UnknownWorkError,
)
from npumanager.modelfiles import model_file_size, read_model_file, sidecar_key
from npumanager.schemas import EndReason
from npumanager.schemas.limits import (
    DEFAULT_MAX_INFERENCES_PER_CONNECTION,
    DEFAULT_MAX_MODEL_FILE_BYTES,
    DEFAULT_MAX_SHARED_BYTES,
    MAX_HELD_RESULTS,
)

_IN_FRONT = WorkMode.INLINE | WorkMode.FOREGROUND_ONLY
"""A foreground inference the loop's thread runs itself when a standby leads meanwhile."""


class InferenceCalls:
    """The handlers of the real-inference calls, by message type."""

    def __init__(
        self,
        service: Service,
        calls: Calls,
        post: Callable[[Task], None],
        leadership: Leadership | None = None,
        *,
        max_shared_bytes: int = DEFAULT_MAX_SHARED_BYTES,
        max_model_file_bytes: int = DEFAULT_MAX_MODEL_FILE_BYTES,
        max_in_flight: int = DEFAULT_MAX_INFERENCES_PER_CONNECTION,
        stats: DaemonStats,
        hosting: Hosting | None = None,
    ) -> None:
        self.service = service
        self.backend = service.backend
        self.calls = calls
        self._post = post
        self._leadership = leadership
        self.max_shared_bytes = max_shared_bytes
        self.max_model_file_bytes = max_model_file_bytes
        self.max_in_flight = max_in_flight
        self.stats = stats
        self.hosting = hosting
        """Where clients' models run: in a host of each connection's own, or in here."""
        self._loader = Loader()
        self._stopping = False
        """Opens models off the loop, one at a time, at most a few per connection."""
        self.handlers: dict[type[p.Call], Handler] = {
            p.Attach: self.on_attach,
            p.LoadRealModel: self.on_load_real,
            p.Infer: self.on_infer,
            p.CancelInference: self.on_cancel_infer,
            p.FetchResult: self.on_fetch,
            p.OpenLane: self.on_open_lane,
            p.CancelLane: self.on_cancel_lane,
        }

    def on_attach(self, connection: Connection, message: p.Attach) -> None:
        fd = connection.take_descriptor("attach")
        try:
            if connection.segment is not None:
                raise IllegalArgumentError("this connection has a shared segment already")
            connection.segment = SharedSegment(fd, message.size, self.max_shared_bytes)
        finally:
            os.close(fd)

    def on_open_lane(self, connection: Connection, _: p.OpenLane) -> None:
        """Serve the client's lane in its model host when it has one (the data plane:
        `daemon.server.direct`), else on a thread of the daemon's (`daemon.server.lane`).
        A lane whose host went is replaced."""
        fd = connection.take_descriptor("open_lane")
        if connection.lane is not None and not connection.lane.finished():
            os.close(fd)
            raise IllegalArgumentError("this connection has a lane already")
        sock = lane_socket(fd, connection)
        host = connection.host
        lane: Lane | Gate
        if isinstance(host, ModelHost) and host.dead is None and connection.segment:
            with sock:  # the host has its own descriptor of it
                lane = Gate(sock, connection, host, self.service, self.calls, self.stats)
        else:
            lane = Lane(sock, connection, self.service, self.calls, self.stats)
        connection.lane = lane
        lane.start()
        self.stats.lanes_opened += 1

    def on_cancel_lane(self, connection: Connection, _: p.CancelLane) -> dict[str, Any]:
        if connection.lane is None:
            raise UnknownWorkError("this connection has no lane")
        return {"cancelled": connection.lane.cancel()}

    def on_load_real(self, connection: Connection, message: p.LoadRealModel) -> NoReply:
        """Check the call here (a request not granted and a driver without real models are
        refused before the model's file is looked at), then read and open the model on the
        loader thread (that can take seconds): the loop goes on serving everyone meanwhile."""
        # The descriptors are taken first, so that those sent with a refused frame are not
        # left for the next.
        fds: list[int] = []
        try:
            if message.descriptor:
                for _ in range(1 + len(message.sidecars)):
                    fds.append(connection.take_descriptor("load_real"))
            if message.descriptor == (message.span is not None):
                raise IllegalArgumentError(
                    "load_real takes the model as a descriptor sent with the frame or as a "
                    "span of the shared segment, exactly one"
                )
            names = [sidecar_key(name) for name in message.sidecars]
            if len(set(names)) != len(names) or (names and not message.descriptor):
                raise IllegalArgumentError(
                    "load_real's sidecars must be distinct names, sent with the model's descriptor"
                )
            request = self.calls.live(connection, message.request_id)
            manager = self.calls.manager_of(connection)
            self.backend.check_real_load(manager, request)
            connection.check_quota("models")
            segment = self._model_segment(connection, message, fds)
        except BaseException:
            close_all(fds)
            raise
        ref = weakref.ref(connection)
        uid = connection.peer.uid
        span = message.span
        client = manager.client

        def load() -> bool:
            outcome: LoadedModel | Exception
            try:
                live = ref()
                if live is None or live.closed:
                    return True  # the client went while its load waited: nothing refused
                host = None if self.hosting is None else self.hosting.host_for(live)
                del live
                data: Any = None
                if segment is not None and span is not None:
                    data = segment.bytes_at(span)
                if host is not None:  # the host reads the file itself
                    data = InHost(host, ModelFile(fds[0]) if data is None else data)
                elif data is None:
                    data = read_model_file(fds[0], self.max_model_file_bytes)
                outcome = self.backend.load_real_model(
                    manager,
                    request,
                    data,
                    None,
                    message.sram_bytes,
                    sidecars=dict(zip(names, fds[1:], strict=True)),
                    threads=message.threads,
                    options=message.options,
                )
                if host is not None and host.last_opened is not None:
                    with contextlib.suppress(ModelHostError):  # its death unloads the model
                        host.name(client, outcome.handle, host.last_opened)  # before it hears
            except Exception as exc:
                outcome = exc
            finally:
                close_all(fds)
            self._post(lambda: self._loaded(ref, message.seq, uid, outcome))
            return not isinstance(outcome, Exception)

        app_id = connection.app.app_id if connection.app is not None else fallback_id(uid)
        self._loader.submit(connection, load, lambda: close_all(fds), app_id)
        return NO_REPLY

    def _model_segment(
        self, connection: Connection, message: p.LoadRealModel, fds: list[int]
    ) -> SharedSegment | None:
        """Check the model's size before anything is read: its file's (`fstat`), or its
        span's in the segment (returned: the loader copies the span)."""
        limit = self.max_model_file_bytes
        if fds:
            model_file_size(fds[0], limit)
            return None
        assert message.span is not None
        segment = self._segment(connection)
        segment.check(message.span, "the model's bytes")
        if message.span.size > limit:
            raise CapacityError(
                f"the model holds {message.span.size} bytes; this daemon reads at most {limit} "
                "(serve --max-model-mib)"
            )
        return segment

    def _loaded(
        self, ref: weakref.ref[Connection], seq: int, uid: int, outcome: LoadedModel | Exception
    ) -> None:
        """On the loop: answer a `load_real` whose model the loader opened (or refused)."""
        connection = ref()
        if connection is None or connection.closed:
            return  # the client is gone: its requests ended and their models went with them
        if self._stopping:  # the service closed under the load: its request ended with it
            outcome = DaemonUnavailableError("the daemon is stopping; the model was not loaded")
        if isinstance(outcome, Exception):
            connection.send(call_error(seq, outcome, self.stats, "load_real", uid))
            return
        try:
            connection.check_quota("models", including=1)
        except QuotaExceededError as exc:
            self.backend.unload_real_model(outcome)
            connection.send(call_error(seq, exc, self.stats, "load_real", uid))
            return
        if self.hosting is not None:
            connection.hosted = [m for m in connection.hosted if self._holds(connection, m)]
            connection.hosted.append(outcome)
        result = {
            "model": outcome.handle,
            "device": outcome.device,
            "weight_bytes": outcome.weight_bytes,
        }
        connection.send(p.Reply(seq=seq, result=result))

    def _holds(self, connection: Connection, model: LoadedModel) -> bool:
        try:
            return self.calls.model(connection, model.handle) is model
        except NpuManagerError:
            return False

    def load_counts(self) -> dict[str, int]:
        """How many model loads wait and run (`Loader.counts`)."""
        return self._loader.counts()

    def loads_of(self, connection: Connection) -> int:
        """The connection's model loads queued or running."""
        return self._loader.in_flight(connection)

    def forget(self, connection: Connection) -> None:
        """The connection is gone: its queued loads are dropped with their descriptors."""
        self.stats.loads_dropped += self._loader.forget(connection)

    def close(self) -> tuple[int, bool]:
        """Stop the loader: none queued starts, and one in progress is not waited for.
        Returns how many queued loads were dropped and whether one was in progress."""
        self._stopping = True
        if self.hosting is not None:
            self.hosting.stop()
        return self._loader.close()

    def on_infer(self, connection: Connection, message: p.Infer) -> dict[str, Any] | NoReply:
        if len(connection.inferences) >= self.max_in_flight and not connection.management:
            raise QuotaExceededError(
                f"this connection has {len(connection.inferences)} inferences in flight, its "
                "limit (serve --max-inferences-per-connection); wait for some to end"
            )
        segment = self._segment(connection)
        segment.check(message.out, "the output region")
        feeds = segment.inputs(message.inputs)
        model = self.calls.model(connection, message.model)
        raw = group_bytes(message.group_id.value if message.group_id is not None else None)
        leadership = self._leadership
        inline = leadership is not None and leadership.can_defer()
        work = self.backend.submit_inference(
            model,
            feeds,
            message.job_priority,
            message.original_uid,
            raw,
            message.feature_id,
            _IN_FRONT if inline else WorkMode.QUEUED,
        )
        connection.inferences[work.work_id] = message.seq
        connection.inference_models[work.work_id] = message.model
        done = _Ended(weakref.ref(connection), segment, message, work.work_id, self._post)
        work.add_done_callback(done)
        if inline and leadership is not None and work.inline is not None:
            backend = self.backend
            leadership.defer(lambda: backend.run_admitted(work))
            self.stats.inferences_inline += 1
        else:
            self.stats.inferences_to_workers += 1
        return {"work_id": work.work_id} if message.ack else NO_REPLY

    def on_cancel_infer(self, connection: Connection, message: p.CancelInference) -> None:
        for work_id, seq in list(connection.inferences.items()):
            if seq == message.call_seq:
                model = connection.inference_models[work_id]
                cancel = p.CancelWork(seq=message.seq, model=model, work_id=work_id)
                self.calls.on_cancel_work(connection, cancel)
                return
        raise UnknownWorkError(f"call {message.call_seq} is not an inference in flight")

    def on_fetch(self, connection: Connection, message: p.FetchResult) -> dict[str, Any]:
        segment = self._segment(connection)
        segment.check(message.out, "the output region")
        outputs = connection.held.get(message.call_seq)
        if outputs is None:
            raise UnknownWorkError(f"no outputs are held for call {message.call_seq}")
        placed = segment.write(outputs, message.out)
        if isinstance(placed, int):
            raise CapacityError(
                f"the outputs of call {message.call_seq} need {placed} bytes; the region "
                f"holds {message.out.size}"
            )
        del connection.held[message.call_seq]
        return {"outputs": [out.tensor().model_dump() for out in placed]}

    @staticmethod
    def _segment(connection: Connection) -> SharedSegment:
        if connection.segment is None:
            raise IllegalArgumentError(
                "this connection has no shared segment: attach one first (op attach)"
            )
        return connection.segment


class _Ended:
    """Runs where the work ended (a worker thread, or the loop on a cancel): writes the
    outputs into the client's region and posts the `WorkEnded` frame to the loop."""

    def __init__(
        self,
        connection: weakref.ref[Connection],
        segment: SharedSegment,
        message: p.Infer,
        work_id: int,
        post: Callable[[Task], None],
    ) -> None:
        self.connection = connection
        self.segment: SharedSegment | None = segment
        self.out = message.out
        self.seq = message.seq
        self.work_id = work_id
        self.post = post

    def __call__(self, future: Future[Any]) -> None:
        # The future keeps its callbacks: this one must not keep the segment mapped.
        segment, self.segment = self.segment, None
        if segment is not None:
            self._ended(future, segment)

    def _ended(self, future: Future[Any], segment: SharedSegment) -> None:
        held: list[np.ndarray] | None = None
        if future.cancelled():
            ended = self._frame(EndReason.CANCELLED_SYSTEM)
        elif (error := future.exception()) is not None:
            ended = self._frame(
                EndReason.FAILED, kind=type(error).__name__, message=clip(str(error))
            )
        else:
            outputs = future.result()
            try:
                placed = segment.write(outputs, self.out)
            except IllegalArgumentError as exc:
                ended = self._frame(EndReason.FAILED, kind=type(exc).__name__, message=str(exc))
            else:
                if isinstance(placed, int):
                    held = outputs
                    ended = self._frame(EndReason.COMPLETED, held_bytes=placed)
                else:
                    frame = p.ended_frame(self.seq, self.work_id, [out.json() for out in placed])
                    if self._send_now(frame):
                        return
                    ended = self._frame(EndReason.COMPLETED, outputs=[o.tensor() for o in placed])
        self.post(lambda: self._deliver(ended, held))

    def _send_now(self, frame: bytes) -> bool:
        """Send a completion from the worker thread itself when nothing waits before it
        (one hand-over to the loop less); False when the loop must queue it."""
        connection = self.connection()
        if connection is None:
            return True
        left = connection.send_now(frame)
        if left < 0:
            return False
        connection.inferences.pop(self.work_id, None)
        connection.inference_models.pop(self.work_id, None)
        if left:
            self.post(lambda: connection.queued_by_worker(left))
        return True

    def _frame(self, reason: EndReason, **fields: Any) -> p.WorkEnded:
        return p.WorkEnded(call_seq=self.seq, work_id=self.work_id, reason=int(reason), **fields)

    def _deliver(self, ended: p.WorkEnded, held: list[np.ndarray] | None) -> None:
        connection = self.connection()
        if connection is None or connection.closed:
            return
        connection.inferences.pop(self.work_id, None)
        connection.inference_models.pop(self.work_id, None)
        if ended.reason == EndReason.CANCELLED_SYSTEM and self.work_id in connection.cancelled:
            connection.cancelled.discard(self.work_id)
            ended = ended.model_copy(update={"reason": int(EndReason.CANCELLED_USER)})
        if held is not None:
            connection.held[self.seq] = held
            while len(connection.held) > MAX_HELD_RESULTS:
                del connection.held[next(iter(connection.held))]
        connection.send(ended)
