"""Real inference through the daemon, on the client's side: models by descriptor, tensors in
the shared segment, each inference a future of its outputs.

`LoadedModel.run` and `submit` call this through the `DaemonClient`, exactly as they call
the in-process backend: inputs are written into a region of the segment, a small frame
names them, and the daemon's `WorkEnded` frame says where the outputs are; they are copied
out (numpy arrays the caller owns) and the region is given back. `run` goes over the
connection's lane when it has one (`daemon.client.lane`): the same region, a binary
frame, and the reply read by the caller itself; a timeout is the caller's, who cancels
the lane's inference (`cancel_lane`) when it runs out.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from npumanager.checks import GroupId, group_bytes
from npumanager.core.client.manager import LoadedModel
from npumanager.daemon.client import tensors as client_tensors
from npumanager.daemon.client.lane import ClientLane, Sent
from npumanager.daemon.client.shared_memory import ClientSegment
from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire import tensors
from npumanager.daemon.wire.lane import (
    MAX_LANE_FRAME_BYTES,
    Kind,
    Reply,
    Status,
    TensorRef,
    encode_request,
)
from npumanager.errors import DaemonUnavailableError, NpuManagerError, UnknownWorkError
from npumanager.schemas import EndReason, NpuUuid
from npumanager.schemas.limits import LANE_AGAIN_S

log = logging.getLogger(__name__)

_DEFAULT_OUT_BYTES = 64 << 10
"""The output room an inference gets before its model's outputs have been seen."""


class _Wire(Protocol):
    timeout_s: float

    def next_seq(self) -> int: ...

    def call(
        self,
        kind: type[p.Call],
        *,
        seq: int | None = None,
        fds: list[int] | None = None,
        **fields: Any,
    ) -> dict[str, Any] | None: ...

    def error_class(self, kind: str | None) -> type[Exception]: ...

    def refusal_class(self, kind: str | None) -> type[Exception]: ...

    def send_only(self, kind: type[p.Call], seq: int, **fields: Any) -> None: ...

    def send_frame(self, frame: bytes, seq: int) -> None: ...


class RemoteWork(Future[list[np.ndarray]]):
    """One inference in the daemon: a future of its outputs; `cancel()` cancels the work
    there, queued or running, and `work_id` names it in the daemon's events."""

    def __init__(self, owner: RemoteInference, model: int) -> None:
        super().__init__()
        self.work_id = -1
        self.call_seq = -1
        self._owner = owner
        self._model = model
        self._ending = threading.Lock()
        """Held while the future takes its end: the reader thread and a cancel may both
        give it one."""

    def cancel(self) -> bool:
        """Cancel the work: True if it ended cancelled, False if it had ended otherwise."""
        if self.done():
            return self.cancelled()
        try:
            if self.work_id >= 0:
                self._owner.cancel(self._model, self.work_id)
            else:
                self._owner.cancel_call(self.call_seq)
        except UnknownWorkError:
            return self.cancelled()  # it had ended in the daemon: its WorkEnded says how
        # The daemon ended it cancelled, whether or not its WorkEnded has been read yet.
        self.ended_cancelled()
        return True

    def ended_cancelled(self) -> None:
        """The daemon ended the work cancelled (by this client, a revoke or an unload): the
        future is cancelled, once, by its WorkEnded or the reply to a cancel, whichever
        is read first."""
        with self._ending:
            if not self.done():
                Future.cancel(self)
                self.set_running_or_notify_cancel()

    def succeed(self, outputs: list[np.ndarray]) -> None:
        """The work completed with `outputs` (nothing if the future has ended already)."""
        with self._ending:
            if not self.done():
                self.set_result(outputs)

    def fail(self, error: BaseException) -> None:
        """The work failed, was refused or was lost with its connection (nothing if the
        future has ended already)."""
        with self._ending:
            if not self.done():
                self.set_exception(error)


@dataclass
class _Flight:
    future: RemoteWork
    model: int
    offset: int
    size: int
    inputs: list[tuple[str, str, np.ndarray]] | None = None


class RemoteInference:
    """The client's real-inference state: its segment, and its inferences in flight."""

    def __init__(self, wire: _Wire, shared_bytes: int, lane_spin_us: int = 0) -> None:
        self._wire = wire
        self.shared_bytes = shared_bytes
        self.lane_spin_us = lane_spin_us
        self._segment: ClientSegment | None = None
        self._lock = threading.Lock()
        self._flights: dict[int, _Flight] = {}
        self._out_bytes: dict[int, int] = {}
        """The most output bytes each model has needed so far."""
        self._lane: ClientLane | None = None
        self._lane_again_at = 0.0
        """When to ask for a lane again after a refusal (`time.monotonic`)."""
        self._lane_refusals = 0

    def segment(self) -> ClientSegment:
        """The connection's segment, made and attached on first use."""
        with self._lock:
            if self._segment is None:
                segment = ClientSegment(self.shared_bytes)
                try:
                    self._wire.call(p.Attach, fds=[segment.fd], size=segment.size)
                finally:
                    segment.close_descriptor()
                self._segment = segment
            return self._segment

    def lane(self) -> ClientLane | None:
        """The connection's lane, taken for one run: opened on first use; None when the
        daemon refused one (asked for again `LANE_AGAIN_S` later: a refusal may be
        passing, as while the last lane winds down), or another thread has it."""
        self.segment()  # a lane's frames name places in it: the daemon (or a host) maps it first
        with self._lock:
            if self._lane is not None and not self._lane.open:
                self._lane = None  # its far end went (a model host's death): a new one
            if self._lane is None and time.monotonic() >= self._lane_again_at:
                self._lane = self._open_lane()
            lane = self._lane
        return lane if lane is not None and lane.try_take() else None

    def _open_lane(self) -> ClientLane | None:
        mine, theirs = socket.socketpair(
            socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC
        )
        try:
            self._wire.call(p.OpenLane, fds=[theirs.fileno()])
        except NpuManagerError as exc:
            if not self._lane_refusals:
                log.info("no inference lane (%s); runs take the connection meanwhile", exc)
            self._lane_refusals += 1
            self._lane_again_at = time.monotonic() + LANE_AGAIN_S
            mine.close()
            return None
        finally:
            theirs.close()
        return ClientLane(mine, self.lane_spin_us)

    def shared_array(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A new array over its own region of the segment, read in place by inferences."""
        name = tensors.dtype_name(np.empty(0, dtype))
        return self.segment().shared_array(shape, name, self._wire.timeout_s)

    def close(self) -> None:
        """Close the lane (the connection is closing)."""
        with self._lock:
            if self._lane is not None:
                self._lane.close()

    # Inference --------------------------------------------------------------------------

    def submit(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        original_uid: int | None,
        group_id: GroupId | None,
        feature_id: str | None,
        *,
        ack: bool = True,
    ) -> RemoteWork:
        """Write the inputs into a region of the segment and start the inference there;
        with `ack`, wait until the daemon has queued it (its work id known, a refusal
        raised here), else return at once (a refusal fails the future)."""
        arrays = client_tensors.arrays(inputs)
        segment = self.segment()
        places, in_size = client_tensors.placement(segment, arrays)
        room = max(in_size, self._out_bytes.get(model.handle, _DEFAULT_OUT_BYTES))
        base = segment.allocate(room, self._wire.timeout_s)
        refs = [
            p.tensor_json(*ref) for ref in client_tensors.written(segment, arrays, places, base)
        ]
        raw = group_bytes(group_id)
        future = RemoteWork(self, model.handle)
        seq = future.call_seq = self._wire.next_seq()
        # The arrays read in place stay alive (their regions lent) until the work ends.
        self._flights[seq] = _Flight(future, model.handle, base, room, arrays)
        try:
            if not ack and raw is None and original_uid is None and feature_id is None:
                out = (base, room)
                self._wire.send_frame(
                    p.infer_frame(seq, model.handle, refs, out, ack, job_priority), seq
                )
                return future
            fields: dict[str, Any] = {
                "model": model.handle,
                "inputs": [p.Tensor.model_validate_json(ref) for ref in refs],
                "out": p.Span(offset=base, size=room),
                "job_priority": job_priority,
                "original_uid": original_uid,
                "group_id": None if raw is None else NpuUuid(value=raw),
                "feature_id": feature_id,
                "ack": ack,
            }
            if not ack:
                self._wire.send_only(p.Infer, seq, **fields)
                return future
            result = self._wire.call(p.Infer, seq=seq, **fields)
        except BaseException:
            flight = self._flights.pop(seq, None)
            if flight is not None:
                segment.release(base, room)
            raise
        assert result is not None
        if future.work_id < 0:
            future.work_id = int(result["work_id"])
        return future

    def run(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        timeout: float | None,
    ) -> list[np.ndarray]:
        """One inference's outputs; after `timeout` seconds it is cancelled and
        `TimeoutError` raised. It goes over the lane while the lane is free (a concurrent
        caller's run takes the connection, as `submit` does)."""
        lane = self.lane()
        lane_closed: DaemonUnavailableError | None = None
        if lane is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                outputs = self._run_on_lane(lane, model, inputs, job_priority, deadline)
            except DaemonUnavailableError as exc:
                # The lane's far end closed: its model host died, or the daemon went. The
                # connection's own path runs it, or says why it cannot.
                outputs, lane_closed = None, exc
            finally:
                lane.give_back()
            if outputs is not None:
                return outputs
        try:
            future = self.submit(model, inputs, job_priority, None, None, None, ack=False)
            try:
                return future.result(timeout)
            except TimeoutError:
                future.cancel()
                raise TimeoutError(
                    f"work {future.work_id} did not end within {timeout} s"
                ) from None
        except DaemonUnavailableError:
            if lane_closed is not None:  # the daemon went: the lane said so first
                raise lane_closed from None
            raise

    def _run_on_lane(
        self,
        lane: ClientLane,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        deadline: float | None,
    ) -> list[np.ndarray] | None:
        """The run over the lane; None if its frame would be over the lane's limit."""
        arrays = client_tensors.arrays(inputs)
        segment = self.segment()
        spots = [segment.offset_of(array) for _, _, array in arrays]
        key = (model.handle, job_priority, *[(n, d, a.shape) for n, d, a in arrays], *spots)
        sent = lane.sent
        if (
            sent is not None
            and sent.key == key
            and self._out_bytes.get(model.handle, _DEFAULT_OUT_BYTES) <= sent.room
            and lane.region(segment, sent.room, self._wire.timeout_s) == sent.base
        ):
            for place, index in sent.copies:
                np.copyto(place, arrays[index][2])
            reply = lane.exchange(sent.frame, deadline, self._cancel_lane)
            return self._lane_reply(lane, reply, model.handle, segment)
        lane.sent = None
        places, in_size = client_tensors.placement(segment, arrays, spots)
        room = max(in_size, self._out_bytes.get(model.handle, _DEFAULT_OUT_BYTES))
        base = lane.region(segment, room, self._wire.timeout_s)
        refs = [TensorRef(*ref) for ref in client_tensors.written(segment, arrays, places, base)]
        request = encode_request(Kind.INFER, model.handle, job_priority, (base, room), refs)
        if len(request) > MAX_LANE_FRAME_BYTES:
            return None
        copies = [
            (tensors.view(segment.memory, ref.dtype, ref.shape, ref.offset), index)
            for index, (ref, (in_place, _)) in enumerate(zip(refs, places, strict=True))
            if not in_place
        ]
        lane.sent = Sent(key, base, room, request, copies)
        reply = lane.exchange(request, deadline, self._cancel_lane)
        return self._lane_reply(lane, reply, model.handle, segment)

    def _lane_reply(
        self,
        lane: ClientLane,
        reply: Reply,
        model: int,
        segment: ClientSegment,
    ) -> list[np.ndarray]:
        """The outputs of a lane reply, fetched first when the daemon held them;
        `TimeoutError` when the reply came past the deadline (the run was cancelled)."""
        if lane.late:
            raise TimeoutError(f"work {reply.work_id} did not end within its timeout; cancelled")
        if reply.status == Status.HELD:
            need = reply.held_bytes
            self._out_bytes[model] = max(self._out_bytes.get(model, 0), need)
            base = lane.region(segment, need, self._wire.timeout_s)
            reply = lane.exchange(encode_request(Kind.FETCH, 0, 0, (base, need)))
        answered = lane.answered
        if answered is None or reply.outputs is not answered.reply.outputs:
            return self._lane_outputs(reply, model, segment)
        if not answered.views:  # its first run: checked and copied out, then kept
            outputs = self._lane_outputs(reply, model, segment)
            answered.views.extend(client_tensors.views(segment, reply.outputs))
            return outputs
        return [view.copy() for view in answered.views]

    def _lane_outputs(self, reply: Reply, model: int, segment: ClientSegment) -> list[np.ndarray]:
        """A lane reply's outputs copied out, or its error raised with its class."""
        if reply.status == Status.COMPLETED:
            outputs = client_tensors.copy_out(segment, reply.outputs)
            self._learn(model, reply.outputs)
            return outputs
        if reply.status == Status.CANCELLED:
            raise CancelledError(f"work {reply.work_id} was cancelled")
        if reply.status == Status.REFUSED:
            raise self._wire.refusal_class(reply.kind)(reply.message)
        raise self._wire.error_class(reply.kind)(reply.message or "the inference failed")

    def _cancel_lane(self) -> bool:
        """Cancel the inference the lane is running (its run is past its deadline): False
        if the daemon's lane was running none yet."""
        result = self._wire.call(p.CancelLane)
        return bool(result and result.get("cancelled"))

    def cancel(self, model: int, work_id: int) -> None:
        """Cancel one of this client's inferences in the daemon."""
        self._wire.call(p.CancelWork, model=model, work_id=work_id)

    def cancel_call(self, call_seq: int) -> None:
        """Cancel the inference of call `call_seq`, whose work id is not known yet."""
        self._wire.call(p.CancelInference, call_seq=call_seq)

    # Frames from the daemon (the reader thread) -----------------------------------------

    def ended(self, message: p.WorkEnded) -> None:
        """An inference ended: its outputs copied out, its region given back."""
        flight = self._flights.pop(message.call_seq, None)
        if flight is None:
            log.warning("the daemon ended call %d, which is not in flight", message.call_seq)
            return
        future, segment = flight.future, self._segment
        assert segment is not None
        future.work_id = message.work_id
        try:
            if message.reason == EndReason.COMPLETED and message.outputs is not None:
                outputs = client_tensors.copy_out(segment, message.outputs)
                self._learn(flight.model, message.outputs)
            elif message.reason == EndReason.COMPLETED:
                segment.release(flight.offset, flight.size)
                flight.size = 0
                outputs = self._fetch(flight, message)
            elif message.reason in (EndReason.CANCELLED_USER, EndReason.CANCELLED_SYSTEM):
                future.ended_cancelled()
                return
            else:
                error = self._wire.error_class(message.kind)
                future.fail(error(message.message or "the inference failed"))
                return
        except Exception as exc:
            future.fail(exc)
            return
        finally:
            if flight.size:
                segment.release(flight.offset, flight.size)
        future.succeed(outputs)

    def _fetch(self, flight: _Flight, message: p.WorkEnded) -> list[np.ndarray]:
        """Outputs the daemon held (too large for the region): fetched into a new one."""
        need = message.held_bytes or 0
        self._out_bytes[flight.model] = max(self._out_bytes.get(flight.model, 0), need)
        segment = self._segment
        assert segment is not None
        offset = segment.allocate(need, 0)
        try:
            result = self._wire.call(
                p.FetchResult, call_seq=message.call_seq, out=p.Span(offset=offset, size=need)
            )
            assert result is not None
            refs = [p.Tensor.model_validate(ref) for ref in result["outputs"]]
            return client_tensors.copy_out(segment, refs)
        finally:
            segment.release(offset, need)

    def _learn(self, model: int, refs: Sequence[p.Tensor | TensorRef]) -> None:
        if refs:
            end = max(ref.offset + ref.nbytes for ref in refs) - min(ref.offset for ref in refs)
            if end > self._out_bytes.get(model, 0):
                self._out_bytes[model] = tensors.aligned(end)

    def refused(self, seq: int, error: Exception) -> bool:
        """An inference sent without `ack` was refused: its future fails. False if `seq`
        is not one of them."""
        flight = self._flights.pop(seq, None)
        if flight is None:
            return False
        if self._segment is not None:
            self._segment.release(flight.offset, flight.size)
        flight.future.fail(error)
        return True

    def lost(self, error: Exception) -> None:
        """The connection is gone: every inference in flight fails with `error`."""
        for seq in list(self._flights):
            flight = self._flights.pop(seq, None)
            if flight is not None:
                flight.future.fail(error)


__all__ = ["RemoteInference", "RemoteWork"]
