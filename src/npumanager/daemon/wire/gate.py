"""The frames of a gate: how a model host asks the daemon's device scheduler before it runs
an inference that came to it directly from its client (the data plane), and says when it
ended. Fixed-layout binary, one SOCK_SEQPACKET message each, little-endian.

Every frame is `FRAME` (op, status, the length of its text, model, seq, work id, lease
deadline, lease generation) followed by its text as UTF-8. The host sends `ASK` (the
connection's model handle, its own seq, the job priority in the work id's place) and
`DONE` (the seq, a `Done` status, how many runs the grant covered in the model's place, a
failure's message).
The daemon answers an `ASK` with `GO` (the host's own model id, the seq, the work id, and
the lease: until when, monotonic ns, and under which generation of the host's grant page
the host may start further runs of the same model and priority without asking; 0 for one
run; `status` is 1 when the work is in a background band) or with `END` (the seq, the
lane's `Status` it ended with, and "kind: message" as text).

The daemon trusts nothing a host says: decoding checks every field and raises
`IllegalArgumentError`, and a host that sends what does not decode is killed.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from npumanager.errors import IllegalArgumentError

FRAME = struct.Struct("<BBHiqqqq")
MAX_GATE_TEXT_BYTES = 4096
MAX_GATE_FRAME_BYTES = FRAME.size + MAX_GATE_TEXT_BYTES
PAGE = struct.Struct("<q")
"""A host's grant page: the generation its leases are valid under (the daemon bumps it to
take every lease back); only the daemon writes it, the host maps it read-only."""
PAGE_BYTES = 4096
TALLY = struct.Struct("<qqq")
"""A lane's tally page, written by its host: the runs asked for on it, how many of their
frames were the lane's last one again, and how many ran in a background band (the host's
word, for `info` only)."""


class Op(IntEnum):
    """What a gate frame says."""

    ASK = 1
    GO = 2
    DONE = 3
    END = 4


class Done(IntEnum):
    """How a granted run ended, as its host says."""

    COMPLETED = 0
    FAILED = 1
    """It raised (the message says how), or it was stopped by the daemon's cancel."""


class Frame(NamedTuple):
    """A decoded gate frame."""

    op: Op
    status: int
    model: int
    seq: int
    work_id: int
    lease_until_ns: int
    lease_generation: int
    text: str


_OPS = {int(op): op for op in Op}


def encode(
    op: Op,
    seq: int,
    *,
    status: int = 0,
    model: int = 0,
    work_id: int = 0,
    lease_until_ns: int = 0,
    lease_generation: int = 0,
    text: str = "",
) -> bytes:
    """One frame; the text is clipped to `MAX_GATE_TEXT_BYTES`."""
    data = text.encode()[:MAX_GATE_TEXT_BYTES]
    head = FRAME.pack(op, status, len(data), model, seq, work_id, lease_until_ns, lease_generation)
    return head + data


def decode(data: bytes | memoryview) -> Frame:
    """A frame as its fields, or `IllegalArgumentError` saying what is wrong."""
    view = memoryview(data)
    if len(view) < FRAME.size:
        raise IllegalArgumentError(
            f"a gate frame is at least {FRAME.size} bytes; this one is {len(view)}"
        )
    op, status, text_len, model, seq, work_id, until, generation = FRAME.unpack_from(view)
    if op not in _OPS:
        raise IllegalArgumentError(f"gate op {op} is not one of {sorted(_OPS)}")
    if FRAME.size + text_len != len(view):
        raise IllegalArgumentError(
            f"a gate frame says {text_len} bytes of text but carries {len(view) - FRAME.size}"
        )
    try:
        text = str(view[FRAME.size :], "utf-8")
    except UnicodeDecodeError:
        raise IllegalArgumentError("a gate frame's text is not UTF-8") from None
    return Frame(_OPS[op], status, model, seq, work_id, until, generation, text)
