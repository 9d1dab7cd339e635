"""The lane's binary frames: what is encoded decodes the same, and no bytes decode to
anything but a frame or an `IllegalArgumentError` that says what is wrong."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npumanager.daemon.wire.lane import (
    MAX_NAME_BYTES,
    REQUEST,
    Kind,
    Status,
    TensorRef,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from npumanager.daemon.wire.tensors import DTYPES
from npumanager.errors import IllegalArgumentError
from npumanager.schemas.limits import INT32_MAX, MAX_PRIORITY, MAX_TENSOR_DIMS

offsets = st.integers(0, 2**63 - 1)
tensors = st.builds(
    TensorRef,
    name=st.text(max_size=40).filter(lambda n: len(n.encode()) <= MAX_NAME_BYTES),
    dtype=st.sampled_from(list(DTYPES)),
    shape=st.lists(st.integers(0, INT32_MAX), max_size=MAX_TENSOR_DIMS).map(tuple),
    offset=offsets,
    nbytes=offsets,
)


@given(
    kind=st.sampled_from(Kind),
    model=st.integers(-(2**31), 2**31 - 1),
    priority=st.integers(0, MAX_PRIORITY),
    out=st.tuples(offsets, offsets),
    inputs=st.lists(tensors, max_size=8),
)
def test_a_request_decodes_as_it_was_encoded(
    kind: Kind, model: int, priority: int, out: tuple[int, int], inputs: list[TensorRef]
) -> None:
    request = decode_request(encode_request(kind, model, priority, out, inputs))
    assert request == (kind, model, priority, *out, inputs)


@given(
    status=st.sampled_from(Status),
    work_id=offsets,
    held=offsets,
    outputs=st.lists(tensors, max_size=8),
    kind=st.text(max_size=20),
    message=st.text(max_size=200),
)
def test_a_reply_decodes_as_it_was_encoded(
    status: Status, work_id: int, held: int, outputs: list[TensorRef], kind: str, message: str
) -> None:
    frame = encode_reply(
        status, work_id, held_bytes=held, outputs=outputs, kind=kind, message=message
    )
    assert decode_reply(frame) == (status, work_id, held, outputs, kind, message)


@given(st.binary(max_size=512))
def test_any_bytes_decode_to_a_frame_or_a_clear_refusal(data: bytes) -> None:
    for decode in (decode_request, decode_reply):
        try:
            decode(data)
        except IllegalArgumentError as exc:
            assert str(exc)


@given(
    inputs=st.lists(tensors, min_size=1, max_size=4),
    cut=st.integers(1, 200),
    flip=st.tuples(st.integers(0, 400), st.integers(1, 255)),
)
def test_a_valid_request_cut_short_or_with_a_byte_changed_is_refused_or_still_a_frame(
    inputs: list[TensorRef], cut: int, flip: tuple[int, int]
) -> None:
    frame = encode_request(Kind.INFER, 1, 0, (0, 64), inputs)
    with pytest.raises(IllegalArgumentError, match="ends inside|at least 28 bytes"):
        decode_request(frame[: max(0, len(frame) - cut)])
    at, value = flip
    changed = bytearray(frame)
    changed[at % len(frame)] ^= value
    try:
        decode_request(bytes(changed))
    except IllegalArgumentError as exc:
        assert str(exc)


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (REQUEST.pack(1, 0, 1, MAX_PRIORITY + 1, 0, 0), "job priority 1001 is outside 0..1000"),
        (REQUEST.pack(1, 0, 1, 0, -1, 0), "the output region has a negative offset"),
        (REQUEST.pack(1, 2000, 1, 0, 0, 0), "2000 tensors in one frame; at most 1024"),
        (
            REQUEST.pack(1, 1, 1, 0, 0, 0) + struct.pack("<BBHqq", 99, 0, 0, 0, 0),
            "dtype code 99; codes are 0..11 (bool, int8",
        ),
        (
            REQUEST.pack(1, 1, 1, 0, 0, 0) + struct.pack("<BBHqq", 0, 33, 0, 0, 0),
            "33 dimensions; at most 32",
        ),
        (
            REQUEST.pack(1, 1, 1, 0, 0, 0) + struct.pack("<BBHqq", 0, 1, 0, 0, 0) + b"\xff" * 8,
            "has a dimension outside 0..2147483647",
        ),
        (
            REQUEST.pack(1, 1, 1, 0, 0, 0) + struct.pack("<BBHqq", 0, 0, 2, 0, 0) + b"\xff\xfe",
            "tensor 0's name is not UTF-8",
        ),
        (REQUEST.pack(1, 0, 1, 0, 0, 0) + b"!", "1 bytes follow the lane frame's end"),
    ],
    ids=["priority", "region", "count", "dtype", "dims", "dimension", "name", "trailing"],
)
def test_each_refusal_names_what_is_wrong_and_what_is_allowed(frame: bytes, error: str) -> None:
    with pytest.raises(IllegalArgumentError, match=error.replace("(", r"\(").replace(".", r"\.")):
        decode_request(frame)


def test_a_request_that_cannot_be_a_lane_frame_is_refused_before_it_is_sent() -> None:
    with pytest.raises(IllegalArgumentError, match="cannot hold these values"):
        encode_request(Kind.INFER, 2**40, 0, (0, 0))
    with pytest.raises(IllegalArgumentError, match="at most 32 dimensions"):
        encode_request(Kind.INFER, 1, 0, (0, 0), [TensorRef("x", "int8", (1,) * 40, 0, 1)])
