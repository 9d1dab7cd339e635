"""The wire as a protocol object without I/O: both ends driven against each other in
memory, byte streams cut at every position, and every way a peer can break the protocol,
without a socket or a thread."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire.connection import (
    NEED_DATA,
    BadCall,
    Closed,
    Role,
    State,
    WireConnection,
)
from npumanager.schemas import ModelLoadRequest
from npumanager.schemas.limits import PROTOCOL_VERSION

WELCOME = p.Welcome(
    version=PROTOCOL_VERSION,
    uid=1000,
    pid=42,
    gid=1000,
    daemon_pid=7,
    management=False,
    app_id="uid:1000",
    hal_uid=1000,
)


def events(end: WireConnection, data: bytes, *, chunks: list[int] | None = None) -> list[Any]:
    """Feed `data` (in pieces of the given sizes, else whole) and take every event."""
    found: list[Any] = []
    pieces = [data] if chunks is None else _cut(data, chunks)
    for piece in pieces:
        end.receive_data(piece)
        while (event := end.next_event()) is not NEED_DATA:
            found.append(event)
    return found


def _cut(data: bytes, sizes: list[int]) -> list[bytes]:
    pieces, at = [], 0
    for size in sizes:
        if at >= len(data):
            break
        pieces.append(data[at : at + size])
        at += size
    if at < len(data):
        pieces.append(data[at:])
    return pieces


def opened() -> tuple[WireConnection, WireConnection]:
    """A client and a daemon end past the hello."""
    client, daemon = WireConnection(Role.CLIENT), WireConnection(Role.DAEMON)
    assert events(daemon, client.send(p.HELLO)) == [p.HELLO]
    assert events(client, daemon.send(WELCOME)) == [WELCOME]
    assert client.state is daemon.state is State.OPEN
    return client, daemon


def test_both_ends_talk_in_memory_and_pair_calls_with_answers() -> None:
    client, daemon = opened()
    request = ModelLoadRequest(id=3)
    calls = [p.RequestCanLoad(seq=1, request=request), p.Info(seq=2)]
    sent = b"".join(client.send(call) for call in calls)
    assert client.open_calls == {1, 2}
    assert events(daemon, sent) == calls
    answers = [
        p.Decision(request_id=3, status=0),
        p.Reply(seq=1),
        p.Error(seq=2, kind="PermissionError", message="no"),
    ]
    got = events(client, b"".join(daemon.send(a) for a in answers))
    assert got == answers
    assert client.open_calls == set()


def test_an_inference_without_ack_is_answered_by_its_end() -> None:
    client, daemon = opened()
    frame = p.infer_frame(5, 1, [], (0, 64), False, 0)
    client.sent_call(5)
    (infer,) = events(daemon, frame)
    assert isinstance(infer, p.Infer) and infer.seq == 5 and not infer.ack
    ended = p.WorkEnded(call_seq=5, work_id=9, reason=4, outputs=[])
    assert events(client, daemon.send(ended)) == [ended]
    assert client.open_calls == set()


def test_an_acked_inference_whose_end_comes_before_its_reply_is_still_answered() -> None:
    """The daemon's worker may send a fast inference's end before the loop sends the ack
    (`LoadedModel.submit` in a loop met it): the ack then still answers a call in flight."""
    client, daemon = opened()
    call = p.Infer(seq=6, model=1, inputs=[], out=p.Span(offset=0, size=64))
    assert call.ack
    assert events(daemon, client.send(call)) == [call]
    ended = p.WorkEnded(call_seq=6, work_id=9, reason=4, outputs=[])
    reply = p.Reply(seq=6, result={"work_id": 9})
    assert events(client, daemon.send(ended) + daemon.send(reply)) == [ended, reply]
    assert client.open_calls == set()
    assert client.state is State.OPEN


_CALLS = st.one_of(
    st.builds(p.Info, seq=st.integers(0, 2**40), offset=st.integers(0, 99)),
    st.builds(p.CancelLoad, seq=st.integers(0, 2**40), request_id=st.integers(0, 2**63 - 1)),
    st.builds(
        p.SetImportance, seq=st.integers(0, 2**40), uid=st.integers(0, 2**31 - 1),
        importance=st.integers(0, 1000),
    ),
)  # fmt: skip


@given(calls=st.lists(_CALLS, min_size=1, max_size=6), sizes=st.lists(st.integers(1, 40)))
@settings(max_examples=150, deadline=None)
def test_any_split_of_a_stream_gives_the_same_events_on_both_ends(
    calls: list[Any], sizes: list[int]
) -> None:
    client, daemon = opened()
    unique = list({call.seq: call for call in calls}.values())
    stream = b"".join(client.send(call) for call in unique)
    assert events(daemon, stream, chunks=sizes) == unique
    replies = [p.Reply(seq=call.seq, result={"n": n}) for n, call in enumerate(unique)]
    assert events(client, b"".join(daemon.send(r) for r in replies), chunks=sizes) == replies
    assert client.open_calls == set()


def test_every_cut_of_a_hello_and_a_call_is_read_the_same() -> None:
    stream = p.encode(p.HELLO) + p.encode(p.Info(seq=1))
    for at in range(1, len(stream)):
        daemon = WireConnection(Role.DAEMON)
        got = []
        for piece in (stream[:at], stream[at:]):
            daemon.receive_data(piece)
            while (event := daemon.next_event()) is not NEED_DATA:
                got.append(event)
                if isinstance(event, p.Hello):
                    daemon.send(WELCOME)
        assert got == [p.HELLO, p.Info(seq=1)], at


@pytest.mark.parametrize(
    ("first", "why"),
    [
        (p.encode(p.Info(seq=1)), "the first frame of a connection must be a hello"),
        (p.encode(p.Hello(version=PROTOCOL_VERSION + 1)), "protocol version"),
        (b"\x00\x00\x00\x02{]", "invalid frame"),
        (b"\xff\xff\xff\xff", "frame length 4294967295 is not allowed"),
        (b"\x00\x00\x00\x00", "frame length 0 is not allowed"),
    ],
    ids=["call_first", "version", "not_json", "oversized", "empty"],
)
def test_a_client_that_breaks_the_protocol_puts_the_daemons_end_in_error(
    first: bytes, why: str
) -> None:
    daemon = WireConnection(Role.DAEMON)
    daemon.receive_data(first)
    with pytest.raises(p.ProtocolError, match=why):
        daemon.next_event()
    assert daemon.state is State.ERROR
    with pytest.raises(p.ProtocolError, match="broke the protocol already"):
        daemon.next_event()
    with pytest.raises(p.ProtocolError, match="the connection is error"):
        daemon.send(p.Reply(seq=1))
    fatal = daemon.send(p.Error(kind="ProtocolError", message=why))
    assert fatal.startswith(b"\x00\x00")  # the one frame still allowed


def test_a_second_hello_is_an_error_and_a_malformed_inference_call_is_not() -> None:
    _, daemon = opened()
    bad = b'{"op":"infer","seq":8,"model":"x"}'
    (event,) = events(daemon, p.framed(bad))
    assert isinstance(event, BadCall) and event.seq == 8
    assert daemon.state is State.OPEN
    daemon.receive_data(p.encode(p.HELLO))
    with pytest.raises(p.ProtocolError, match="says hello only once"):
        daemon.next_event()


def test_the_client_refuses_an_answer_to_a_call_it_never_made() -> None:
    client, daemon = opened()
    client.receive_data(daemon.send(p.Reply(seq=77)))
    with pytest.raises(p.ProtocolError, match="answered call 77, which is not a call in flight"):
        client.next_event()
    assert client.state is State.ERROR


def test_a_fatal_error_ends_the_client_and_a_refused_hello_too() -> None:
    client, daemon = opened()
    fatal = p.Error(kind="ProtocolError", message="bye")
    assert events(client, daemon.send(fatal)) == [fatal]
    assert client.state is daemon.state is State.ERROR
    refused = WireConnection(Role.CLIENT)
    refused.send(p.HELLO)
    assert events(refused, p.encode(fatal)) == [fatal]
    assert refused.state is State.ERROR


def test_each_end_may_send_only_what_the_table_allows() -> None:
    client, daemon = WireConnection(Role.CLIENT), WireConnection(Role.DAEMON)
    with pytest.raises(p.ProtocolError, match="first frame of a connection must be a hello"):
        client.send(p.Info(seq=1))
    with pytest.raises(p.ProtocolError, match="a hello is answered by a welcome"):
        daemon.send(p.Decision(request_id=1, status=0))
    with pytest.raises(p.ProtocolError, match="no call is sent while the connection is hello"):
        client.sent_call(1)
    client, daemon = opened()
    with pytest.raises(p.ProtocolError, match="says hello only once"):
        client.send(p.HELLO)
    with pytest.raises(p.ProtocolError, match="welcomed only once"):
        daemon.send(WELCOME)
    with pytest.raises(p.ProtocolError, match="a daemon does not send Info"):
        daemon.send(p.Info(seq=1))


def test_the_end_of_the_stream_is_an_event_saying_what_was_cut_short() -> None:
    client, daemon = opened()
    frame = client.send(p.Info(seq=1))
    daemon.receive_data(frame[:-3])
    daemon.receive_data(b"")
    assert daemon.next_event() == Closed(unread=len(frame) - 3)
    assert daemon.state is State.CLOSED
    with pytest.raises(p.ProtocolError, match="after the end of the stream"):
        daemon.receive_data(b"x")


@given(calls=st.lists(_CALLS, min_size=1, max_size=4), sizes=st.lists(st.integers(1, 40)))
@settings(max_examples=150, deadline=None)
def test_has_frame_says_exactly_whether_next_event_has_one(
    calls: list[Any], sizes: list[int]
) -> None:
    """The daemon keeps a connection for another turn only while `has_frame`: it must be
    true whenever `next_event` would give a message, and false whenever it would not."""
    client, daemon = opened()
    stream = b"".join(client.send(call) for call in {c.seq: c for c in calls}.values())
    for piece in _cut(stream, sizes):
        daemon.receive_data(piece)
        while True:
            promised = daemon.has_frame
            event = daemon.next_event()
            assert promised is (event is not NEED_DATA)
            if event is NEED_DATA:
                break


@pytest.mark.parametrize("header", [b"\xff\xff\xff\xff", b"\x00\x00\x00\x00"])
def test_has_frame_is_true_for_a_length_the_reader_refuses(header: bytes) -> None:
    """A refused length is something to say now (the error), not bytes to wait for."""
    _, daemon = opened()
    daemon.receive_data(header[:3])
    assert not daemon.has_frame
    daemon.receive_data(header[3:])
    assert daemon.has_frame
    with pytest.raises(p.ProtocolError):
        daemon.next_event()
    assert daemon.has_frame  # broken: every next_event raises
