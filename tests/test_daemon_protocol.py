"""The wire protocol on its own: framing, validation, and the fast encoders."""

from __future__ import annotations

import itertools
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

import npumanager as npu
from npumanager.daemon.wire import protocol as p
from npumanager.schemas.limits import MAX_FRAME_BYTES

ids = st.integers(0, 2**63 - 1)
small = st.integers(-(2**31), 2**31 - 1)


@given(
    bodies=st.lists(st.binary(min_size=1, max_size=300), max_size=20),
    cuts=st.lists(st.integers(0, 10_000), max_size=30),
)
def test_frames_come_out_whole_however_the_stream_is_cut(
    bodies: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = p.FrameReader()
    out = [
        body for start, end in itertools.pairwise(points) for body in reader.feed(stream[start:end])
    ]
    assert out == bodies
    assert reader.pending == 0


@given(
    bodies=st.lists(st.binary(min_size=1, max_size=300), max_size=20),
    cuts=st.lists(st.integers(0, 10_000), max_size=30),
)
def test_pop_takes_each_frame_once_it_is_whole_and_ready_says_so_first(
    bodies: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader, out, taken = p.FrameReader(), [], 0
    for start, end in itertools.pairwise(points):
        reader.push(stream[start:end])
        while True:
            ready = reader.ready
            body = reader.pop()
            assert ready is (body is not None)
            if body is None:
                break
            out.append(body)
            taken += 4 + len(body)
        assert reader.pending == end - taken
    assert out == bodies


def test_a_large_frame_coming_in_pieces_is_not_copied_until_it_is_whole() -> None:
    """A client that sends a 1 MiB frame 64 KiB at a time, and holds back its last byte,
    costs the reader no copy of what it sent (a growing buffer copied it again and again):
    the reader holds the very pieces it was given until the frame is whole."""
    size = 1 << 20
    frame = struct.pack(">I", size) + bytes(size)
    pieces = [frame[at : at + (64 << 10)] for at in range(0, len(frame) - 1, 64 << 10)]
    pieces[-1] = pieces[-1][:-1]
    reader = p.FrameReader()
    for piece in pieces:
        reader.push(piece)
        assert reader.pop() is None
    held = list(reader._pieces)
    assert len(held) == len(pieces) and all(a is b for a, b in zip(held, pieces, strict=True))
    assert reader.pending == len(frame) - 1
    reader.push(frame[-1:])
    assert reader.pop() == bytes(size)
    assert reader.pending == 0


@pytest.mark.parametrize("size", [0, MAX_FRAME_BYTES + 1, 2**32 - 1])
def test_a_frame_length_outside_the_limit_is_refused(size: int) -> None:
    with pytest.raises(p.ProtocolError, match=f"frame length {size} is not allowed"):
        list(p.FrameReader().feed(struct.pack(">I", size)))


def test_a_frame_at_the_limit_is_accepted() -> None:
    body = b"x" * MAX_FRAME_BYTES
    assert list(p.FrameReader().feed(struct.pack(">I", len(body)) + body)) == [body]


@given(seq=ids)
def test_reply_frame_is_the_models_encoding(seq: int) -> None:
    assert p.reply_frame(seq) == p.encode(p.Reply(seq=seq))


@given(request_id=ids, status=small)
def test_decision_and_complete_frames_are_the_models_encoding(request_id: int, status: int) -> None:
    assert p.decision_frame(request_id, status) == p.encode(
        p.Decision(request_id=request_id, status=status)
    )
    assert p.complete_frame(request_id, status) == p.encode(
        p.Completed(request_id=request_id, status=status)
    )


@given(request_id=ids, reason=st.none() | small)
def test_unload_frame_is_the_models_encoding(request_id: int, reason: int | None) -> None:
    assert p.unload_frame(request_id, reason) == p.encode(
        p.UnloadAsked(request_id=request_id, reason=reason)
    )


CLIENT_MESSAGES: list[p.WireModel] = [
    p.Hello(version=1, uses_feature=True),
    p.RequestCanLoad(
        seq=1,
        request=npu.ModelLoadRequest.Builder(5).set_size(2).set_priority(1000).build(),
        weight_bytes=3 << 30,
        uses_feature=True,
    ),
    p.CancelLoad(seq=2, request_id=5),
    p.NotifyLoaded(seq=3, request_id=5),
    p.NotifyUnloaded(seq=4, request_id=5),
    p.LoadModel(seq=5, request_id=5, weight_bytes=1, sram_bytes=2),
    p.Submit(
        seq=6,
        model=3,
        cost_cycles=10,
        job_priority=5,
        original_uid=10001,
        group_id=npu.NpuUuid(value=bytes(range(16))),
        feature_id="f",
    ),
    p.CancelWork(seq=7, model=3, work_id=9),
    p.SetPolicy(seq=8, policy="budget", params={"max_budget": 8}),
    p.SetPolicy(seq=9, policy=1),
    p.SetImportance(seq=10, uid=10001, importance=100),
    p.SetAccess(seq=11, uid=10001, has_direct_access=False),
    p.Info(seq=12),
    p.Attach(seq=13, size=1 << 20),
    p.LoadRealModel(seq=14, request_id=5, descriptor=True),
    p.LoadRealModel(seq=15, request_id=5, span=p.Span(offset=64, size=100)),
    p.Infer(
        seq=16,
        model=3,
        inputs=[p.Tensor(name="x", dtype="float32", shape=[2, 3], offset=0, nbytes=24)],
        out=p.Span(offset=64, size=64),
        job_priority=2,
    ),
    p.FetchResult(seq=17, call_seq=16, out=p.Span(offset=0, size=4096)),
    p.CancelInference(seq=18, call_seq=16),
]


@pytest.mark.parametrize(
    "message",
    [
        p.WorkEnded(
            call_seq=16,
            work_id=4,
            reason=0,
            outputs=[p.Tensor(name="0", dtype="int64", shape=[1], offset=64, nbytes=8)],
        ),
        p.WorkEnded(call_seq=16, work_id=4, reason=0, held_bytes=1 << 20),
        p.WorkEnded(call_seq=16, work_id=4, reason=3, kind="ExecutionError", message="boom"),
    ],
)
def test_work_ended_frames_round_trip(message: p.WireModel) -> None:
    (body,) = list(p.FrameReader().feed(p.encode(message)))
    assert p.parse_daemon(body) == message


@pytest.mark.parametrize(
    ("body", "seq"),
    [
        (b'{"op":"infer","seq":7,"model":"x"}', 7),
        (b'{"op":"attach","seq":0}', 0),
        (b'{"op":"infer","seq":-1}', None),
        (b'{"op":"infer","seq":true}', None),
        (b'{"op":"submit","seq":7,"model":"x"}', None),
        (b"not json", None),
        (b"[1]", None),
    ],
)
def test_only_malformed_real_inference_calls_are_answered(body: bytes, seq: int | None) -> None:
    assert p.answerable_seq(body) == seq


@pytest.mark.parametrize("message", CLIENT_MESSAGES, ids=lambda m: type(m).__name__)
def test_every_client_message_round_trips(message: p.WireModel) -> None:
    frame = p.encode(message)
    (body,) = list(p.FrameReader().feed(frame))
    assert p.parse_client(body) == message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"op": "hello", "version": 1, "uid": 0}, "uid: Extra inputs are not permitted"),
        ({"op": "hello", "version": 1, "pid": 1}, "pid: Extra inputs are not permitted"),
        ({"op": "cancel", "seq": 1, "request_id": "5"}, "request_id"),
        ({"op": "submit", "seq": 1, "model": 1, "cost_cycles": 1, "job_priority": 1001}, "0..1000"),
        ({"op": "set_importance", "seq": 1, "uid": -1, "importance": 1}, "uid"),
        ({"op": "nope", "seq": 1}, "does not match any of the expected tags"),
        ({"seq": 1}, "Unable to extract tag"),
    ],
)
def test_an_invalid_body_is_a_protocol_error_naming_the_field(
    body: dict[str, object], message: str
) -> None:
    with pytest.raises(p.ProtocolError, match="invalid frame") as raised:
        p.parse_client(json.dumps(body).encode())
    assert message in str(raised.value)


def test_identity_fields_do_not_exist_in_any_client_message() -> None:
    for model in CLIENT_MESSAGES:
        assert not {"uid", "pid"} & set(type(model).model_fields) or isinstance(
            model, p.SetImportance | p.SetAccess
        )


def test_encode_refuses_a_frame_over_the_limit() -> None:
    with pytest.raises(p.ProtocolError, match="over the limit"):
        p.encode(p.Reply(seq=1, result={"x": "y" * MAX_FRAME_BYTES}))


names = st.text(max_size=20)
tensor_fields = st.tuples(
    names,
    st.sampled_from(["float32", "int64", "bool", "uint8"]),
    st.lists(st.integers(0, 1 << 20), max_size=4).map(tuple),
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 40),
)


@given(
    seq=st.integers(0, 1 << 62),
    model=st.integers(0, 1 << 30),
    inputs=st.lists(tensor_fields, max_size=3),
    out=st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 40)),
    ack=st.booleans(),
    job_priority=st.integers(0, 999),
)
def test_the_hand_built_infer_frame_means_what_the_model_says(
    seq: int,
    model: int,
    inputs: list[tuple[str, str, tuple[int, ...], int, int]],
    out: tuple[int, int],
    ack: bool,
    job_priority: int,
) -> None:
    frame = p.infer_frame(seq, model, [p.tensor_json(*t) for t in inputs], out, ack, job_priority)
    (body,) = list(p.FrameReader().feed(frame))
    assert p.parse_client(body) == p.Infer(
        seq=seq,
        model=model,
        inputs=[
            p.Tensor(name=n, dtype=d, shape=list(s), offset=o, nbytes=b)  # type: ignore[arg-type]
            for n, d, s, o, b in inputs
        ],
        out=p.Span(offset=out[0], size=out[1]),
        ack=ack,
        job_priority=job_priority,
    )


@given(
    seq=st.integers(0, 1 << 62),
    work_id=st.integers(0, 1 << 62),
    outputs=st.lists(tensor_fields, max_size=3),
)
def test_the_hand_built_ended_frame_means_what_the_model_says(
    seq: int, work_id: int, outputs: list[tuple[str, str, tuple[int, ...], int, int]]
) -> None:
    frame = p.ended_frame(seq, work_id, [p.tensor_json(*t) for t in outputs])
    (body,) = list(p.FrameReader().feed(frame))
    assert p.parse_daemon(body) == p.WorkEnded(
        call_seq=seq,
        work_id=work_id,
        reason=int(npu.EndReason.COMPLETED),
        outputs=[
            p.Tensor(name=n, dtype=d, shape=list(s), offset=o, nbytes=b)  # type: ignore[arg-type]
            for n, d, s, o, b in outputs
        ],
    )
