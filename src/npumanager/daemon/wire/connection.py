"""One end of a daemon connection as a protocol object without I/O: bytes in, events out;
messages in, bytes out.

Both ends use it (`WireConnection(Role.CLIENT)` in the client, `Role.DAEMON` in the
server), the way h11's `Connection` serves both ends of HTTP. It holds what the protocol
itself says, and nothing of sockets or threads:

- the state of the connection: `HELLO` until the client's `hello` is answered with
  `welcome`, then `OPEN`; `ERROR` once either end broke the protocol (a fatal `error`
  frame, a frame that cannot be read); `CLOSED` once the peer's bytes ended. What each
  end may send (and so the other receive) in each state is one table, `_MOVES`;
- the framing (`FrameReader`) and the parsing of each frame into its message;
- the pairing of calls and answers on the client: every call it sends stays open until a
  `reply` or `error` with its seq comes (or, for an inference, its `ended`); an answer to a
  call that is not open is a protocol error.

Breaking the protocol raises `ProtocolError` and leaves the object in `ERROR`, where it
reads and sends nothing more (but the daemon's one fatal `error` frame).
"""

from __future__ import annotations

import enum
import functools
from typing import Any, NamedTuple

from npumanager.daemon.wire import protocol as p
from npumanager.schemas.limits import MAX_FRAME_BYTES, PROTOCOL_VERSION


class Role(enum.Enum):
    """Which end of the connection an object speaks for."""

    CLIENT = "client"
    DAEMON = "daemon"


class State(enum.Enum):
    """Where a connection is in its life."""

    HELLO = "hello"
    """The client's hello is not yet answered with a welcome."""
    OPEN = "open"
    ERROR = "error"
    """A protocol error: nothing more is read, and nothing sent but a fatal error."""
    CLOSED = "closed"
    """The peer's bytes ended."""


class NeedData(enum.Enum):
    """`next_event` has no complete frame yet: feed it more bytes."""

    NEED_DATA = "need data"


NEED_DATA = NeedData.NEED_DATA


class Closed(NamedTuple):
    """The peer's bytes ended (`receive_data(b"")`) with no partial frame left over."""

    unread: int
    """Bytes of a frame cut short by the end (0 for a clean close)."""


class BadCall(NamedTuple):
    """A malformed call the daemon answers with an error and survives (a real-inference
    call: its descriptors are the handler's to close), rather than closing the connection."""

    seq: int
    error: p.ProtocolError


Event = Any
"""A parsed message (a `Hello`, a `Call`, a `Welcome`, a `Reply`...), a `BadCall`, a
`Closed`, or `NEED_DATA`."""

_ANSWERS = (p.Reply, p.Error)


_FATAL = "fatal error"
"""An `error` frame without a seq: the daemon closes the connection after it."""
_DAEMON_SENDS = (p.Reply, p.Error, p.Decision, p.UnloadAsked, p.Completed, p.WorkEnded)
_MOVES: dict[tuple[Role, State], tuple[Any, ...]] = {
    (Role.CLIENT, State.HELLO): (p.Hello,),
    (Role.CLIENT, State.OPEN): (p.Call,),
    (Role.DAEMON, State.HELLO): (p.Welcome, _FATAL),
    (Role.DAEMON, State.OPEN): (*_DAEMON_SENDS, _FATAL),
    (Role.DAEMON, State.ERROR): (_FATAL,),
    (Role.DAEMON, State.CLOSED): (_FATAL,),
}
"""What each end may send in each state (the other end receives the same): the whole
protocol's table."""


@functools.cache
def _allows(sender: Role, state: State, kind: type) -> tuple[bool, bool, bool]:
    """For a message of class `kind`: whether it is an error, whether `sender` may send it
    in `state` as a fatal error (no seq), and whether otherwise (one answer per class, not
    a walk of the table per frame)."""
    allowed = _MOVES.get((sender, state), ())
    return (
        issubclass(kind, p.Error),
        _FATAL in allowed,
        any(isinstance(k, type) and issubclass(kind, k) for k in allowed),
    )


def _why_not(sender: Role, state: State, message: p.WireModel) -> str | None:
    """Why `sender` may not send `message` in `state`, or None when it may."""
    is_error, fatal, plain = _allows(sender, state, type(message))
    if fatal if is_error and message.seq is None else plain:  # type: ignore[attr-defined]
        return None
    if state in (State.ERROR, State.CLOSED):
        return f"the connection is {state.value}"
    if isinstance(message, p.Hello):
        return "a connection says hello only once"
    if sender is Role.CLIENT and state is State.HELLO:
        return "the first frame of a connection must be a hello"
    if isinstance(message, p.Welcome):
        return "a connection is welcomed only once"
    if state is State.HELLO:
        return "a hello is answered by a welcome"
    return f"a {sender.value} does not send {type(message).__name__}"


class WireConnection:
    """One end of a daemon connection, without I/O (see the module's docstring)."""

    def __init__(self, our_role: Role, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.our_role = our_role
        self.state = State.HELLO
        self.open_calls: set[int] = set()
        self._acked: set[int] = set()
        """Inference calls that get a reply when queued: their end may come first (the
        worker that ran it sends it), and the reply still closes the call."""
        """The client's calls sent and not yet answered, by seq (kept on the client side)."""
        self._reader = p.FrameReader(max_frame)
        self._ended = False
        self._broken = False
        """A frame received broke the protocol (not the peer's own fatal error)."""

    @property
    def pending(self) -> int:
        """Bytes received and not yet taken as frames."""
        return self._reader.pending

    @property
    def has_frame(self) -> bool:
        """True when `next_event` would give more than `NEED_DATA` now (a frame, or the
        error of one)."""
        return self._broken or self._reader.ready

    # Receiving --------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Bytes from the peer; `b""` says its bytes ended."""
        if data:
            if self._ended:
                raise p.ProtocolError("bytes came after the end of the stream")
            self._reader.push(data)
        else:
            self._ended = True

    def next_event(self) -> Event:
        """The next event the bytes received make: a message, a `BadCall`, `Closed` or
        `NEED_DATA`. A frame that breaks the protocol raises `ProtocolError` (state
        `ERROR`)."""
        if self._broken:
            raise p.ProtocolError("the connection broke the protocol already")
        try:
            body = self._reader.pop()
        except p.ProtocolError:
            self._break()
            raise
        if body is None:
            if not self._ended:
                return NEED_DATA
            self.state = State.CLOSED
            return Closed(self._reader.pending)
        if self.our_role is Role.DAEMON:
            return self._from_client(body)
        return self._from_daemon(body)

    def _from_client(self, body: bytes) -> Event:
        try:
            message = p.parse_client(body)
        except p.ProtocolError as exc:
            seq = p.answerable_seq(body) if self.state is State.OPEN else None
            if seq is None:
                self._break()
                raise
            return BadCall(seq, exc)
        self._check(message, sending=False)
        if isinstance(message, p.Hello) and message.version != PROTOCOL_VERSION:
            self._break()
            raise p.ProtocolError(
                f"protocol version {message.version} is not supported; this daemon speaks "
                f"version {PROTOCOL_VERSION}"
            )
        return message

    def _from_daemon(self, body: bytes) -> Event:
        try:
            message = p.parse_daemon(body)
        except p.ProtocolError:
            self._break()
            raise
        self._check(message, sending=False)
        if isinstance(message, p.Welcome):
            self.state = State.OPEN
        elif isinstance(message, _ANSWERS) and message.seq is not None:
            if message.seq not in self.open_calls:
                self._break()
                raise p.ProtocolError(
                    f"the daemon answered call {message.seq}, which is not a call in flight"
                )
            self.open_calls.discard(message.seq)
            self._acked.discard(message.seq)
        elif isinstance(message, p.Error):
            self.state = State.ERROR
        elif isinstance(message, p.WorkEnded) and message.call_seq not in self._acked:
            self.open_calls.discard(message.call_seq)  # an acked call's reply closes it
        return message

    # Sending ----------------------------------------------------------------------------

    def send(self, message: p.WireModel) -> bytes:
        """The frame of a message this end may send now; `ProtocolError` if it may not."""
        self._check(message, sending=True)
        frame = p.encode(message)
        self._sent(message)
        return frame

    def sent_call(self, seq: int) -> None:
        """A call frame encoded elsewhere (a hot path's own encoder) went out with `seq`."""
        if self.state is not State.OPEN:
            raise p.ProtocolError(f"no call is sent while the connection is {self.state.value}")
        self.open_calls.add(seq)

    def _sent(self, message: p.WireModel) -> None:
        if isinstance(message, p.Welcome):
            self.state = State.OPEN
        elif isinstance(message, p.Error) and message.seq is None:
            self.state = State.ERROR
        elif isinstance(message, p.Call) and self.our_role is Role.CLIENT:
            self.open_calls.add(message.seq)
            if isinstance(message, p.Infer) and message.ack:
                self._acked.add(message.seq)

    def _check(self, message: p.WireModel, *, sending: bool) -> None:
        theirs = Role.DAEMON if self.our_role is Role.CLIENT else Role.CLIENT
        why = _why_not(self.our_role if sending else theirs, self.state, message)
        if why is not None:
            if not sending:
                self._break()
            raise p.ProtocolError(why)

    def _break(self) -> None:
        self.state = State.ERROR
        self._broken = True

    def release(self) -> None:
        """Drop whatever is buffered and give its memory back."""
        self._reader.release()
