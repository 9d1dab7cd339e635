"""The daemon's wire protocol: length-prefixed JSON frames, each checked by a versioned model.

A frame is its body's length (4 bytes, big-endian, unsigned) followed by the body, one
UTF-8 JSON object of at most `MAX_FRAME_BYTES`. A connection opens with the client's
`hello`, whose version must be `PROTOCOL_VERSION`; the daemon answers `welcome` with the
identity the kernel gave it. Every later client frame carries a `seq` and gets exactly
one `reply` or `error` with that seq. For the client's requests the daemon also sends
`decision`, `unload` and `complete` frames, in the order the service decided them. An
`error` without a seq is fatal: the daemon closes the connection after it.

No frame carries a uid or a pid: identity is the kernel's (SO_PEERCRED), never a message's.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from npumanager.daemon.tensors import DtypeName
from npumanager.errors import NpuManagerError
from npumanager.schemas import EndReason, ModelLoadRequest, NpuUuid
from npumanager.schemas.limits import (
    DEFAULT_INFO_LIMIT,
    FRAME_HEADER_BYTES,
    INT32_MAX,
    INT64_MAX,
    MAX_FRAME_BYTES,
    MAX_INFO_LIMIT,
    MAX_TENSOR_DIMS,
    MAX_WIRE_TENSORS,
    PROTOCOL_VERSION,
    UID_MAX,
)
from npumanager.schemas.types import Int32, NonNegativeInt32, NonNegativeInt64, Priority, Uid

_HEADER = struct.Struct(">I")
assert _HEADER.size == FRAME_HEADER_BYTES


class ProtocolError(NpuManagerError, ValueError):
    """A frame that is too large, not JSON, or not a message this protocol version knows."""


class WireModel(BaseModel):
    """Frozen and strict, no extra keys: the form of every frame body."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


# Client to daemon ---------------------------------------------------------------------


class Hello(WireModel):
    """The first frame of a connection."""

    op: Literal["hello"] = "hello"
    version: NonNegativeInt32
    uses_feature: bool = False


class Call(WireModel):
    """A client frame that gets exactly one reply or error with its `seq`."""

    seq: NonNegativeInt64


class RequestCanLoad(Call):
    """`request_can_load_model`: the answers come as decision/unload/complete frames."""

    op: Literal["request"] = "request"
    request: ModelLoadRequest
    weight_bytes: NonNegativeInt64 | None = None
    uses_feature: bool = False


class CancelLoad(Call):
    """`cancel_model_load` of one of this connection's requests."""

    op: Literal["cancel"] = "cancel"
    request_id: NonNegativeInt64


class NotifyLoaded(Call):
    """`listener.notify_model_loaded`."""

    op: Literal["loaded"] = "loaded"
    request_id: NonNegativeInt64


class NotifyUnloaded(Call):
    """`listener.notify_model_unloaded`."""

    op: Literal["unloaded"] = "unloaded"
    request_id: NonNegativeInt64


class LoadModel(Call):
    """`load_model`: the reply's result is `{"model": handle, "device": number}`."""

    op: Literal["load_model"] = "load_model"
    request_id: NonNegativeInt64
    weight_bytes: NonNegativeInt64
    sram_bytes: NonNegativeInt64 = 0


class Submit(Call):
    """`LoadedModel.submit`: the reply's result is `{"work_id": id}`."""

    op: Literal["submit"] = "submit"
    model: Int32
    cost_cycles: NonNegativeInt64
    job_priority: Priority = 0
    original_uid: Uid | None = None
    group_id: NpuUuid | None = None
    feature_id: Annotated[str, Field(max_length=256)] | None = None


class CancelWork(Call):
    """`LoadedModel.cancel`."""

    op: Literal["cancel_work"] = "cancel_work"
    model: Int32
    work_id: NonNegativeInt64


class Span(WireModel):
    """A stretch of the connection's shared segment: `size` bytes from `offset`."""

    offset: NonNegativeInt64
    size: NonNegativeInt64


class Tensor(WireModel):
    """One array in the shared segment: C-contiguous, `nbytes` from `offset`."""

    name: Annotated[str, Field(max_length=256)]
    dtype: DtypeName
    shape: Annotated[
        list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(max_length=MAX_TENSOR_DIMS)
    ]
    offset: NonNegativeInt64
    nbytes: NonNegativeInt64


class Attach(Call):
    """Attach the connection's shared segment for tensors: a memfd of `size` bytes, sealed
    against shrinking, sent with this frame (SCM_RIGHTS). Once per connection."""

    op: Literal["attach"] = "attach"
    size: NonNegativeInt64


class LoadRealModel(Call):
    """`load_model(model=... or path=...)`: the model file comes with this frame as a
    descriptor (`descriptor`), or its bytes lie in the shared segment (`span`). The reply's
    result is `{"model", "device", "weight_bytes", "inputs"}`."""

    op: Literal["load_real"] = "load_real"
    request_id: NonNegativeInt64
    sram_bytes: NonNegativeInt64 = 0
    descriptor: bool = False
    span: Span | None = None


class Infer(Call):
    """`LoadedModel.submit(inputs)`: the reply's result is `{"work_id": id}`; a `WorkEnded`
    with this seq follows when the work ends, its outputs written inside `out`. Without
    `ack` there is no reply when the work starts (`LoadedModel.run` waits only for its end);
    an error still comes as an `error` with this seq."""

    op: Literal["infer"] = "infer"
    ack: bool = True
    model: Int32
    inputs: Annotated[list[Tensor], Field(max_length=MAX_WIRE_TENSORS)]
    out: Span
    job_priority: Priority = 0
    original_uid: Uid | None = None
    group_id: NpuUuid | None = None
    feature_id: Annotated[str, Field(max_length=256)] | None = None


class CancelInference(Call):
    """Cancel the inference of call `call_seq` (sent without `ack`, so its work id may not be
    known yet); it ends as `cancel_work` would end it."""

    op: Literal["cancel_infer"] = "cancel_infer"
    call_seq: NonNegativeInt64


class FetchResult(Call):
    """Write the outputs the daemon held for inference `call_seq` (too large for its region)
    into `out`; the reply's result is `{"outputs": [Tensor, ...]}`."""

    op: Literal["fetch"] = "fetch"
    call_seq: NonNegativeInt64
    out: Span


class SetPolicy(Call):
    """Swap the policy (management permission)."""

    op: Literal["set_policy"] = "set_policy"
    policy: Annotated[str, Field(max_length=64)] | NonNegativeInt32
    params: dict[str, Any] | None = None


class SetImportance(Call):
    """Set a uid's importance (management permission)."""

    op: Literal["set_importance"] = "set_importance"
    uid: Uid
    importance: Priority


class SetAccess(Call):
    """Override a uid's direct access or attribution (management permission)."""

    op: Literal["set_access"] = "set_access"
    uid: Uid
    has_direct_access: bool | None = None
    can_attribute_other_uid: bool | None = None


class Info(Call):
    """The daemon's state: policy, priorities, requests, devices, connections.

    Lists (requests of each state, clients, priorities) hold at most `limit` entries from
    `offset` on; the counts are always whole. A client without the management permission
    sees only its own uid's entries, and counts for the rest.
    """

    op: Literal["info"] = "info"
    offset: NonNegativeInt32 = 0
    limit: Annotated[int, Field(ge=0, le=MAX_INFO_LIMIT)] = DEFAULT_INFO_LIMIT


ClientMessage = Annotated[
    Hello
    | RequestCanLoad
    | CancelLoad
    | NotifyLoaded
    | NotifyUnloaded
    | LoadModel
    | Submit
    | CancelWork
    | SetPolicy
    | SetImportance
    | SetAccess
    | Info
    | Attach
    | LoadRealModel
    | Infer
    | CancelInference
    | FetchResult,
    Field(discriminator="op"),
]

# Daemon to client ---------------------------------------------------------------------


class Welcome(WireModel):
    """The answer to `hello`: who the kernel says the client is."""

    op: Literal["welcome"] = "welcome"
    version: NonNegativeInt32
    uid: Uid
    pid: NonNegativeInt32
    gid: Annotated[int, Field(ge=0, le=UID_MAX)]
    daemon_pid: NonNegativeInt32
    management: bool


class Reply(WireModel):
    """The call with this seq succeeded."""

    op: Literal["reply"] = "reply"
    seq: NonNegativeInt64
    result: dict[str, Any] | None = None


class Error(WireModel):
    """The call with this seq failed (or, with no seq, the connection is being closed)."""

    op: Literal["error"] = "error"
    seq: NonNegativeInt64 | None = None
    kind: Annotated[str, Field(max_length=64)]
    message: Annotated[str, Field(max_length=4096)]


class Decision(WireModel):
    """`on_can_load_model` for one of the client's requests."""

    op: Literal["decision"] = "decision"
    request_id: NonNegativeInt64
    status: Int32


class UnloadAsked(WireModel):
    """`on_request_unload_model`, with the reason when the policy gave one."""

    op: Literal["unload"] = "unload"
    request_id: NonNegativeInt64
    reason: Int32 | None = None


class Completed(WireModel):
    """`on_model_load_request_complete`: the request is over."""

    op: Literal["complete"] = "complete"
    request_id: NonNegativeInt64
    status: Int32


class WorkEnded(WireModel):
    """The inference of call `call_seq` ended (`reason`, an EndReason): its outputs in the
    client's region, or `held_bytes` to fetch them with, or the error that failed it."""

    op: Literal["ended"] = "ended"
    call_seq: NonNegativeInt64
    work_id: NonNegativeInt64
    reason: Int32
    outputs: Annotated[list[Tensor], Field(max_length=MAX_WIRE_TENSORS)] | None = None
    held_bytes: NonNegativeInt64 | None = None
    kind: Annotated[str, Field(max_length=64)] | None = None
    message: Annotated[str, Field(max_length=4096)] | None = None


DaemonMessage = Annotated[
    Welcome | Reply | Error | Decision | UnloadAsked | Completed | WorkEnded,
    Field(discriminator="op"),
]

_CLIENT: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)
_DAEMON: TypeAdapter[DaemonMessage] = TypeAdapter(DaemonMessage)


def encode(message: WireModel) -> bytes:
    """One frame: header and JSON body."""
    body = message.__pydantic_serializer__.to_json(message, by_alias=True)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(
            f"a {message.__class__.__name__} frame of {len(body)} bytes is over the limit "
            f"of {MAX_FRAME_BYTES}"
        )
    return _HEADER.pack(len(body)) + body


def _framed(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


def reply_frame(seq: int) -> bytes:
    """`encode(Reply(seq=seq))` without building the model: the most frequent frame."""
    return _framed(b'{"op":"reply","seq":%d,"result":null}' % seq)


def result_frame(seq: int, result_json: bytes) -> bytes:
    """`encode(Reply(seq=seq, result=...))` around a result already encoded as JSON."""
    body = b'{"op":"reply","seq":%d,"result":%s}' % (seq, result_json)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"a reply of {len(body)} bytes is over the limit of {MAX_FRAME_BYTES}")
    return _framed(body)


def decision_frame(request_id: int, status: int) -> bytes:
    """`encode(Decision(...))` without building the model."""
    return _framed(b'{"op":"decision","request_id":%d,"status":%d}' % (request_id, status))


def unload_frame(request_id: int, reason: int | None) -> bytes:
    """`encode(UnloadAsked(...))` without building the model."""
    code = b"null" if reason is None else b"%d" % reason
    return _framed(b'{"op":"unload","request_id":%d,"reason":%s}' % (request_id, code))


def complete_frame(request_id: int, status: int) -> bytes:
    """`encode(Completed(...))` without building the model."""
    return _framed(b'{"op":"complete","request_id":%d,"status":%d}' % (request_id, status))


_COMPLETED = int(EndReason.COMPLETED)


def tensor_json(name: str, dtype: str, shape: tuple[int, ...], offset: int, nbytes: int) -> str:
    """One `Tensor` as JSON, without building the model (the hot path of an inference)."""
    dims = ",".join(map(str, shape))
    return (
        f'{{"name":{json.dumps(name)},"dtype":"{dtype}","shape":[{dims}],'
        f'"offset":{offset},"nbytes":{nbytes}}}'
    )


def infer_frame(
    seq: int,
    model: int,
    tensors: list[str],
    out: tuple[int, int],
    ack: bool,
    job_priority: int = 0,
) -> bytes:
    """`encode(Infer(...))` with no attribution, group or feature, from tensors as JSON."""
    body = (
        f'{{"op":"infer","seq":{seq},"model":{model},"inputs":[{",".join(tensors)}],'
        f'"out":{{"offset":{out[0]},"size":{out[1]}}},"job_priority":{job_priority},'
        f'"ack":{"true" if ack else "false"}}}'
    ).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"an infer frame of {len(body)} bytes is over the limit")
    return _framed(body)


def ended_frame(call_seq: int, work_id: int, tensors: list[str]) -> bytes:
    """`encode(WorkEnded(...))` of a completed inference, from its outputs as JSON."""
    body = (
        f'{{"op":"ended","call_seq":{call_seq},"work_id":{work_id},"reason":{_COMPLETED},'
        f'"outputs":[{",".join(tensors)}]}}'
    ).encode()
    return _framed(body)


def parse_client(body: bytes) -> ClientMessage:
    """A client frame body as its message, or `ProtocolError` saying what is wrong."""
    try:
        return _CLIENT.validate_json(body)
    except ValidationError as exc:
        raise ProtocolError(_describe(exc)) from None


def parse_daemon(body: bytes) -> DaemonMessage:
    """A daemon frame body as its message, or `ProtocolError` saying what is wrong."""
    try:
        return _DAEMON.validate_json(body)
    except ValidationError as exc:
        raise ProtocolError(_describe(exc)) from None


_ANSWERED_WHEN_MALFORMED = frozenset({"attach", "load_real", "infer", "cancel_infer", "fetch"})
"""Calls whose malformed frames get an error reply instead of closing the connection: their
tensors and spans are where a client's own mistakes land."""


def answerable_seq(body: bytes) -> int | None:
    """The seq of a malformed frame that is one of the real-inference calls, else None."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("op") not in _ANSWERED_WHEN_MALFORMED:
        return None
    seq = document.get("seq")
    if type(seq) is not int or not 0 <= seq <= INT64_MAX:
        return None
    return seq


def _describe(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "frame"
    more = exc.error_count() - 1
    tail = f" (and {more} more problem{'s' * (more > 1)})" if more else ""
    return f"invalid frame: {where}: {first['msg']}{tail}"


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
                (size,) = _HEADER.unpack_from(buffer, start)
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
        (size,) = _HEADER.unpack_from(buffer, 0)
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


HELLO = Hello(version=PROTOCOL_VERSION)
"""A hello of this protocol version (no feature declared)."""
