"""The messages of real inference through the daemon (protocol 2): shared segments,
models by descriptor, tensors by offset, shape and dtype, and the end of each inference;
with the hand-built frames of the hot path."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from npumanager.daemon.wire.base import Call, ProtocolError, WireModel, framed
from npumanager.daemon.wire.tensors import DtypeName
from npumanager.schemas import EndReason, NpuUuid
from npumanager.schemas.limits import (
    INT32_MAX,
    INT64_MAX,
    MAX_FRAME_BYTES,
    MAX_INTRA_OP_THREADS,
    MAX_MODEL_SIDECARS,
    MAX_RUNTIME_OPTION_KEY,
    MAX_RUNTIME_OPTION_VALUE,
    MAX_RUNTIME_OPTIONS,
    MAX_SIDECAR_NAME,
    MAX_TENSOR_DIMS,
    MAX_WIRE_TENSORS,
    RUNTIME_OPTION_KEY_PATTERN,
)
from npumanager.schemas.types import Int32, NonNegativeInt64, Priority, Uid


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
    descriptor (`descriptor`), with its weights files after it (`sidecars`), or its bytes
    lie in the shared segment (`span`). The reply's
    result is `{"model", "device", "weight_bytes", "inputs"}`."""

    op: Literal["load_real"] = "load_real"
    request_id: NonNegativeInt64
    sram_bytes: NonNegativeInt64 = 0
    descriptor: bool = False
    span: Span | None = None
    sidecars: list[Annotated[str, Field(min_length=1, max_length=MAX_SIDECAR_NAME)]] = Field(
        default_factory=list, max_length=MAX_MODEL_SIDECARS
    )
    """The names the model gives the files it keeps weights in (ONNX external data, an
    IR's `.bin`); their descriptors follow the model's, in this order."""
    threads: Annotated[int, Field(ge=0, le=MAX_INTRA_OP_THREADS)] | None = None
    """How many threads each run may use, as the app asked (0: one per CPU; absent: the
    driver's setting)."""
    options: (
        Annotated[
            dict[
                Annotated[
                    str,
                    StringConstraints(
                        max_length=MAX_RUNTIME_OPTION_KEY, pattern=RUNTIME_OPTION_KEY_PATTERN
                    ),
                ],
                Annotated[str, StringConstraints(max_length=MAX_RUNTIME_OPTION_VALUE)],
            ],
            Field(max_length=MAX_RUNTIME_OPTIONS),
        ]
        | None
    ) = None
    """Runtime options by ``runtime.name``, as the app asked (`NpuManager.load_model`)."""


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


class OpenLane(Call):
    """Open the connection's inference lane: one end of a SOCK_SEQPACKET socketpair comes
    with this frame (SCM_RIGHTS); `LoadedModel.run` then goes over it (`daemon.lane`).
    Once per connection; a daemon without lanes refuses the op, and the client keeps to
    the connection."""

    op: Literal["open_lane"] = "open_lane"


class CancelInference(Call):
    """Cancel the inference of call `call_seq` (sent without `ack`, so its work id may not be
    known yet); it ends as `cancel_work` would end it."""

    op: Literal["cancel_infer"] = "cancel_infer"
    call_seq: NonNegativeInt64


class CancelLane(Call):
    """Cancel the inference the connection's lane is running (`run(timeout=...)` ran out);
    the lane's reply says how it ended. The result is `{"cancelled": bool}`: false when
    the lane was running nothing (its inference had ended)."""

    op: Literal["cancel_lane"] = "cancel_lane"


class FetchResult(Call):
    """Write the outputs the daemon held for inference `call_seq` (too large for its region)
    into `out`; the reply's result is `{"outputs": [Tensor, ...]}`."""

    op: Literal["fetch"] = "fetch"
    call_seq: NonNegativeInt64
    out: Span


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
    return framed(body)


def ended_frame(call_seq: int, work_id: int, tensors: list[str]) -> bytes:
    """`encode(WorkEnded(...))` of a completed inference, from its outputs as JSON."""
    body = (
        f'{{"op":"ended","call_seq":{call_seq},"work_id":{work_id},"reason":{_COMPLETED},'
        f'"outputs":[{",".join(tensors)}]}}'
    ).encode()
    return framed(body)


_ANSWERED_WHEN_MALFORMED = frozenset(
    {"attach", "load_real", "infer", "cancel_infer", "fetch", "open_lane"}
)
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
