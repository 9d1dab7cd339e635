"""The frames of an inference lane: fixed-layout binary, one SOCK_SEQPACKET message each.

A lane carries `LoadedModel.run` only, one inference at a time, so a frame needs no seq
and no framing of its own (the socket keeps message boundaries). All integers are
little-endian.

A request is `REQUEST` (kind, tensor count, model, job priority, the output region's
offset and size) followed by its input tensors; a `FETCH` request has no tensors and
names the region the held outputs go to. A reply is `REPLY` (status, the length of the
error's kind, tensor count, the length of its message, the work id, the bytes held outputs need)
followed by the output tensors, then the kind and message as UTF-8. Each tensor is
`TENSOR` (dtype code, dimensions, name length, offset, bytes), its dimensions as int64,
then its name as UTF-8.

Decoding checks every count, length and range and raises `IllegalArgumentError` saying
what is wrong, never anything else; the bounds against the segment are the caller's
(`SharedSegment.inputs`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import IntEnum
from typing import NamedTuple

from npumanager.daemon.wire.tensors import DTYPES, TensorFields
from npumanager.errors import IllegalArgumentError
from npumanager.schemas.limits import (
    INT32_MAX,
    MAX_PRIORITY,
    MAX_TENSOR_DIMS,
    MAX_WIRE_TENSORS,
    MIN_PRIORITY,
)

REQUEST = struct.Struct("<HHiiqq")
REPLY = struct.Struct("<BBHIqq")
REPLY_WORK_ID_AT = 8
"""Where a reply's work id (int64) lies in its header; the held bytes follow it."""
TENSOR = struct.Struct("<BBHqq")
MAX_LANE_FRAME_BYTES = 64 << 10
"""The largest lane frame either end sends or reads; a bigger request takes the
connection's own path."""
MAX_NAME_BYTES = 256
MAX_TEXT_BYTES = 4096

_SHAPES = [struct.Struct(f"<{ndim}q") for ndim in range(MAX_TENSOR_DIMS + 1)]
_DTYPE_NAMES = list(DTYPES)
_DTYPE_CODES = {name: code for code, name in enumerate(_DTYPE_NAMES)}


class Kind(IntEnum):
    """What a request asks for."""

    INFER = 1
    FETCH = 2


class Status(IntEnum):
    """How a request ended."""

    COMPLETED = 0
    FAILED = 1
    """The inference ran and failed: the kind and message say how."""
    REFUSED = 2
    """The request was refused before anything ran (a malformed frame, bad bounds)."""
    CANCELLED = 3
    HELD = 4
    """The outputs did not fit the region: they are held for one `FETCH` of `held_bytes`."""


_STATUSES = {int(status): status for status in Status}
_KINDS = {int(kind): kind for kind in Kind}


class TensorRef(NamedTuple):
    """One array in the shared segment: C-contiguous, `nbytes` from `offset`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class Request(NamedTuple):
    """A decoded request."""

    kind: Kind
    model: int
    job_priority: int
    out_offset: int
    out_size: int
    inputs: list[TensorRef]


class Reply(NamedTuple):
    """A decoded reply."""

    status: Status
    work_id: int
    held_bytes: int
    outputs: list[TensorRef]
    kind: str
    message: str


def _encode_tensors(refs: Sequence[TensorFields], parts: list[bytes]) -> None:
    for ref in refs:
        name = ref.name.encode()
        ndim = len(ref.shape)
        if ndim > MAX_TENSOR_DIMS or len(name) > MAX_NAME_BYTES:
            raise IllegalArgumentError(
                f"tensor {ref.name[:64]!r}: at most {MAX_TENSOR_DIMS} dimensions and a name of "
                f"{MAX_NAME_BYTES} bytes cross the daemon; it has {ndim} and {len(name)}"
            )
        parts.append(TENSOR.pack(_DTYPE_CODES[ref.dtype], ndim, len(name), ref.offset, ref.nbytes))
        parts.append(_SHAPES[ndim].pack(*ref.shape))
        parts.append(name)


def encode_request(
    kind: Kind,
    model: int,
    job_priority: int,
    out: tuple[int, int],
    inputs: Sequence[TensorFields] = (),
) -> bytes:
    """One request frame; the caller checks it is within `MAX_LANE_FRAME_BYTES`."""
    try:
        parts = [REQUEST.pack(kind, len(inputs), model, job_priority, out[0], out[1])]
        _encode_tensors(inputs, parts)
    except struct.error as exc:
        raise IllegalArgumentError(f"a lane request cannot hold these values: {exc}") from None
    return b"".join(parts)


def encode_reply(
    status: Status,
    work_id: int = 0,
    *,
    held_bytes: int = 0,
    outputs: Sequence[TensorFields] = (),
    kind: str = "",
    message: str = "",
) -> bytes:
    """One reply frame; an error's kind and message are clipped to fit."""
    kind_bytes = kind.encode()[:64]
    text = message.encode()[:MAX_TEXT_BYTES]
    parts = [REPLY.pack(status, len(kind_bytes), len(outputs), len(text), work_id, held_bytes)]
    _encode_tensors(outputs, parts)
    parts += [kind_bytes, text]
    return b"".join(parts)


def _tensors(data: memoryview, at: int, count: int) -> tuple[list[TensorRef], int]:
    """`count` tensors from `at` on, and where they end (every field checked)."""
    if count > MAX_WIRE_TENSORS:
        raise IllegalArgumentError(f"{count} tensors in one frame; at most {MAX_WIRE_TENSORS}")
    size, refs = len(data), []
    for index in range(count):
        if at + TENSOR.size > size:
            raise IllegalArgumentError(f"the lane frame ends inside tensor {index}")
        code, ndim, name_len, offset, nbytes = TENSOR.unpack_from(data, at)
        if (
            code >= len(_DTYPE_NAMES)
            or ndim > MAX_TENSOR_DIMS
            or name_len > MAX_NAME_BYTES
            or offset < 0
            or nbytes < 0
        ):
            raise _bad_tensor(index, code, ndim, name_len)
        at += TENSOR.size
        end = at + 8 * ndim + name_len
        if end > size:
            raise IllegalArgumentError(f"the lane frame ends inside tensor {index}")
        shape = _SHAPES[ndim].unpack_from(data, at)
        for dim in shape:
            if not 0 <= dim <= INT32_MAX:
                raise IllegalArgumentError(
                    f"tensor {index}'s shape {list(shape)} has a dimension outside 0..{INT32_MAX}"
                )
        name = _text(data, at + 8 * ndim, end, f"tensor {index}'s name")
        refs.append(TensorRef(name, _DTYPE_NAMES[code], shape, offset, nbytes))
        at = end
    return refs, at


def _bad_tensor(index: int, code: int, ndim: int, name_len: int) -> IllegalArgumentError:
    if code >= len(_DTYPE_NAMES):
        return IllegalArgumentError(
            f"tensor {index} has dtype code {code}; codes are 0..{len(_DTYPE_NAMES) - 1} "
            f"({', '.join(_DTYPE_NAMES)})"
        )
    if ndim > MAX_TENSOR_DIMS:
        return IllegalArgumentError(
            f"tensor {index} has {ndim} dimensions; at most {MAX_TENSOR_DIMS}"
        )
    if name_len > MAX_NAME_BYTES:
        return IllegalArgumentError(
            f"tensor {index}'s name is {name_len} bytes; at most {MAX_NAME_BYTES}"
        )
    return IllegalArgumentError(f"tensor {index} has a negative offset or size")


def _text(data: memoryview, start: int, end: int, what: str) -> str:
    if end > len(data):
        raise IllegalArgumentError(f"the lane frame ends inside its {what}")
    try:
        return str(data[start:end], "utf-8")
    except UnicodeDecodeError:
        raise IllegalArgumentError(f"the {what} is not UTF-8") from None


def _finish(data: memoryview, at: int) -> None:
    if at != len(data):
        raise IllegalArgumentError(f"{len(data) - at} bytes follow the lane frame's end")


def _header(view: memoryview, layout: struct.Struct, what: str) -> tuple[int, ...]:
    if len(view) < layout.size:
        raise IllegalArgumentError(
            f"a lane {what} is at least {layout.size} bytes; this one is {len(view)}"
        )
    return layout.unpack_from(view)


def decode_request(data: bytes | memoryview) -> Request:
    """A request frame as its fields, or `IllegalArgumentError` saying what is wrong."""
    view = memoryview(data)
    kind, count, model, job_priority, out_offset, out_size = _header(view, REQUEST, "request")
    if kind not in _KINDS:
        raise IllegalArgumentError(f"lane request kind {kind}; kinds are 1 (infer) and 2 (fetch)")
    if not MIN_PRIORITY <= job_priority <= MAX_PRIORITY:
        raise IllegalArgumentError(
            f"job priority {job_priority} is outside {MIN_PRIORITY}..{MAX_PRIORITY}"
        )
    if out_offset < 0 or out_size < 0:
        raise IllegalArgumentError("the output region has a negative offset or size")
    inputs, at = _tensors(view, REQUEST.size, count)
    _finish(view, at)
    return Request(_KINDS[kind], model, job_priority, out_offset, out_size, inputs)


def decode_reply(data: bytes | memoryview) -> Reply:
    """A reply frame as its fields, or `IllegalArgumentError` saying what is wrong."""
    view = memoryview(data)
    status, kind_len, count, text_len, work_id, held_bytes = _header(view, REPLY, "reply")
    if status not in _STATUSES:
        raise IllegalArgumentError(f"lane reply status {status} is not one of {sorted(_STATUSES)}")
    if text_len > MAX_TEXT_BYTES:
        raise IllegalArgumentError(
            f"the error message is {text_len} bytes; at most {MAX_TEXT_BYTES}"
        )
    outputs, at = _tensors(view, REPLY.size, count)
    kind = _text(view, at, at + kind_len, "error kind")
    message = _text(view, at + kind_len, at + kind_len + text_len, "error message")
    _finish(view, at + kind_len + text_len)
    return Reply(_STATUSES[status], work_id, held_bytes, outputs, kind, message)
