"""The daemon's wire protocol: length-prefixed JSON frames, each checked by a versioned model.

A frame is its body's length (4 bytes, big-endian, unsigned) followed by the body, one
UTF-8 JSON object of at most `MAX_FRAME_BYTES`. A connection opens with the client's
`hello`, whose version must be `PROTOCOL_VERSION`; the daemon answers `welcome` with the
identity the kernel gave it. Every later client frame carries a `seq` and gets exactly
one `reply` or `error` with that seq. For the client's requests the daemon also sends
`decision`, `unload` and `complete` frames, in the order the service decided them. An
`error` without a seq is fatal: the daemon closes the connection after it.

Real inference (version 2) adds descriptors and shared memory: `attach` comes with the
client's memfd (SCM_RIGHTS), `load_real` with a model file's descriptor (or names its
bytes in the segment), and `infer` names its tensors by offset, shape and dtype in the
segment; the daemon answers each inference's end with `ended` (outputs in the client's
region). A malformed real-inference call gets an `error` with its seq; any other
malformed frame closes the connection. `open_lane` (with a socket's descriptor) gives the
connection an inference lane for `LoadedModel.run`, binary frames on a socket of its own
(`daemon.wire.lane`); a client that finds it refused keeps to the connection.

No frame carries a uid or a pid: identity is the kernel's (SO_PEERCRED), never a message's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from npumanager.daemon.wire.base import (
    HEADER,
    Call,
    FrameReader,
    ProtocolError,
    WireModel,
    framed,
)
from npumanager.daemon.wire.inference import (
    Attach,
    CancelInference,
    CancelLane,
    FetchResult,
    Infer,
    LoadRealModel,
    OpenLane,
    Span,
    Tensor,
    WorkEnded,
    answerable_seq,
    ended_frame,
    infer_frame,
    tensor_json,
)
from npumanager.schemas import ModelLoadRequest, NpuUuid
from npumanager.schemas.limits import (
    DEFAULT_INFO_LIMIT,
    MAX_FRAME_BYTES,
    MAX_INFO_LIMIT,
    PROTOCOL_VERSION,
    UID_MAX,
)
from npumanager.schemas.types import Int32, NonNegativeInt32, NonNegativeInt64, Priority, Uid

__all__ = [
    "HEADER",
    "HELLO",
    "PROTOCOL_VERSION",
    "Attach",
    "Call",
    "CancelInference",
    "CancelLane",
    "CancelLoad",
    "CancelWork",
    "ClientMessage",
    "Completed",
    "DaemonMessage",
    "Decision",
    "Error",
    "FetchResult",
    "FrameReader",
    "Hello",
    "Infer",
    "Info",
    "LoadModel",
    "LoadRealModel",
    "NotifyLoaded",
    "NotifyUnloaded",
    "OpenLane",
    "ProtocolError",
    "Reply",
    "RequestCanLoad",
    "SetAccess",
    "SetImportance",
    "SetPolicy",
    "Span",
    "Submit",
    "Tensor",
    "UnloadAsked",
    "Welcome",
    "WireModel",
    "WorkEnded",
    "answerable_seq",
    "complete_frame",
    "decision_frame",
    "encode",
    "ended_frame",
    "framed",
    "infer_frame",
    "parse_client",
    "parse_daemon",
    "reply_frame",
    "result_frame",
    "tensor_json",
    "unload_frame",
]


# Client to daemon ---------------------------------------------------------------------


class Hello(WireModel):
    """The first frame of a connection."""

    op: Literal["hello"] = "hello"
    version: NonNegativeInt32
    uses_feature: bool = False


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


class SetPolicy(Call):
    """Swap the policy (management permission)."""

    op: Literal["set_policy"] = "set_policy"
    policy: Annotated[str, Field(max_length=64)] | NonNegativeInt32
    params: dict[str, Any] | None = None


class SetImportance(Call):
    """Pin the importance of every app of a real uid, or of an app id (management
    permission); `importance` None takes the pin away (protocol 4)."""

    op: Literal["set_importance"] = "set_importance"
    uid: Uid | None = None
    app_id: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    importance: Priority | None


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
    | FetchResult
    | OpenLane
    | CancelLane,
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
    app_id: Annotated[str, Field(min_length=1, max_length=512)]
    """The app the daemon found the client's process in (protocol 4)."""
    hal_uid: Uid
    """The uid the arbiter and the driver know the app by (protocol 4)."""


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
    return HEADER.pack(len(body)) + body


def reply_frame(seq: int) -> bytes:
    """`encode(Reply(seq=seq))` without building the model: the most frequent frame."""
    return framed(b'{"op":"reply","seq":%d,"result":null}' % seq)


def result_frame(seq: int, result_json: bytes) -> bytes:
    """`encode(Reply(seq=seq, result=...))` around a result already encoded as JSON."""
    body = b'{"op":"reply","seq":%d,"result":%s}' % (seq, result_json)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"a reply of {len(body)} bytes is over the limit of {MAX_FRAME_BYTES}")
    return framed(body)


def decision_frame(request_id: int, status: int) -> bytes:
    """`encode(Decision(...))` without building the model."""
    return framed(b'{"op":"decision","request_id":%d,"status":%d}' % (request_id, status))


def unload_frame(request_id: int, reason: int | None) -> bytes:
    """`encode(UnloadAsked(...))` without building the model."""
    code = b"null" if reason is None else b"%d" % reason
    return framed(b'{"op":"unload","request_id":%d,"reason":%s}' % (request_id, code))


def complete_frame(request_id: int, status: int) -> bytes:
    """`encode(Completed(...))` without building the model."""
    return framed(b'{"op":"complete","request_id":%d,"status":%d}' % (request_id, status))


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


def _describe(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "frame"
    more = exc.error_count() - 1
    tail = f" (and {more} more problem{'s' * (more > 1)})" if more else ""
    return f"invalid frame: {where}: {first['msg']}{tail}"


HELLO = Hello(version=PROTOCOL_VERSION)
"""A hello of this protocol version (no feature declared)."""
