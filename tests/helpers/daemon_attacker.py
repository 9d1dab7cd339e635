"""A hostile client in its own process, for the daemon hardening tests.

Started as root, it drops to the uid, gid and groups it is given, runs one attack with raw
frames, says `{"ready": {...}}` on stdout and holds its connections until stdin closes or
says "exit". Usage: daemon_attacker.py SOCKET UID GID GROUPS ATTACK COUNT [PER]
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time
from typing import Any

from npumanager.schemas.limits import PROTOCOL_VERSION

_HEADER = struct.Struct(">I")
MIB = 1 << 20
SOCKET_WAIT_S = 100.0
"""How long one read or send waits for the daemon: only a hang outlasts it, on however busy
a machine. Less than the test's wait for this script's report (`daemon_support.WAIT_S`):
a read that hangs ends this script, its traceback on stderr, before the test gives up."""


def frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return _HEADER.pack(len(body)) + body


HELLO = frame({"op": "hello", "version": PROTOCOL_VERSION})


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(SOCKET_WAIT_S)
    sock.connect(path)
    return sock


def read_frame(sock: socket.socket) -> dict[str, Any] | None:
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            return None
        header += chunk
    (size,) = _HEADER.unpack(header)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    decoded: dict[str, Any] = json.loads(body)
    return decoded


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


Held = list[socket.socket]
Report = dict[str, Any]


def hello(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Say hello and report the answer (a welcome, or the daemon's error)."""
    for _ in range(count):
        sock = connect(path)
        sock.sendall(HELLO)
        report.setdefault("answers", []).append(read_frame(sock))
        held.append(sock)


def connections(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Open as many hello'd connections as the daemon lets in; count the refusals."""
    refused = 0
    for _ in range(count):
        try:
            sock = connect(path)
            sock.sendall(HELLO)
            answer = read_frame(sock)
        except OSError:
            answer = None
        if answer is None or answer.get("op") != "welcome":
            refused += 1
            if answer is not None:  # None: the refusal closed the socket before it was read
                report.setdefault("refusal", answer)
            continue
        held.append(sock)
    report.update(held=len(held), refused=refused)


def partial(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Announce a 1 MiB frame and send all of it but the last byte."""
    for _ in range(count):
        try:
            sock = connect(path)
            held.append(sock)
            sock.sendall(HELLO + _HEADER.pack(MIB) + b"x" * (MIB - 1))
        except OSError:
            report["send_failed"] = report.get("send_failed", 0) + 1


def silent(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Connect and say nothing."""
    held.extend(connect(path) for _ in range(count))


def send_and_close(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Send half of a 1 MiB frame, then close."""
    for _ in range(count):
        with connect(path) as sock:
            sock.sendall(_HEADER.pack(MIB) + b"y" * (MIB // 2))


def garbage(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Send a frame that is not JSON and read the daemon's goodbye."""
    for _ in range(count):
        with connect(path) as sock:
            sock.sendall(b"\x00\x00\x00\x05nope!")
            read_frame(sock)


def no_read(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Pipeline `per` calls on each connection and never read a reply."""
    calls = b"".join(frame({"op": "info", "seq": i}) for i in range(per))
    for _ in range(count):
        sock = connect(path)
        sock.settimeout(0.5)
        try:
            sock.sendall(HELLO + calls)
        except OSError:
            report["send_failed"] = report.get("send_failed", 0) + 1
        held.append(sock)


def requests(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Ask for `count` models on one connection; count the errors by kind."""
    sock = connect(path)
    sock.sendall(HELLO)
    read_frame(sock)
    errors: dict[str, int] = {}
    for start in range(0, count, 500):
        ids = range(start, min(count, start + 500))
        request = {"size": 0, "priority": 0}
        sock.sendall(
            b"".join(
                frame({"op": "request", "seq": i, "request": {"id": i, **request}}) for i in ids
            )
        )
        replies = 0
        while replies < len(ids):
            message = read_frame(sock)
            assert message is not None, "the daemon closed the connection"
            if message["op"] in ("reply", "error"):
                replies += 1
            if message["op"] == "error":
                errors[message["kind"]] = errors.get(message["kind"], 0) + 1
    report.update(errors=errors)
    held.append(sock)


def flood_info(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Pipeline `count` info calls on one connection and read every answer."""
    sock = connect(path)
    sock.sendall(HELLO)
    read_frame(sock)
    sock.sendall(b"".join(frame({"op": "info", "seq": i}) for i in range(count)))
    got = 0
    while got < count:
        message = read_frame(sock)
        assert message is not None
        got += message["op"] in ("reply", "error")
    report.update(answered=got)
    held.append(sock)


def load_flood(path: str, count: int, per: int, held: Held, report: Report) -> None:
    """Send `count` load_real frames on one connection, each with a descriptor of the model
    file named by NPU_ATTACK_MODEL, without waiting; count the replies by kind."""
    sock = connect(path)
    sock.settimeout(120)
    sock.sendall(HELLO)
    read_frame(sock)
    sock.sendall(frame({"op": "request", "seq": 0, "request": {"id": 1, "size": 0}}))
    while (message := read_frame(sock)) is not None and message["op"] != "decision":
        pass
    model = os.open(os.environ["NPU_ATTACK_MODEL"], os.O_RDONLY)
    load = frame({"op": "load_real", "seq": 0, "request_id": 1, "descriptor": True})
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", model))]
    kinds: dict[str, int] = {}

    def read_replies() -> None:
        for _ in range(count):
            message = read_frame(sock)
            assert message is not None, "the daemon closed the connection"
            kind = message.get("kind", "loaded") if message["op"] == "error" else "loaded"
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind == "QuotaExceededError" and "model loads in flight" in message["message"]:
                kinds["in_flight_refusals"] = kinds.get("in_flight_refusals", 0) + 1

    reader = threading.Thread(target=read_replies)
    reader.start()
    for _ in range(count):
        sock.sendmsg([load], rights)
    reader.join()
    os.close(model)
    report.update(replies=kinds)
    held.append(sock)


ATTACKS = {
    attack.__name__: attack
    for attack in (
        hello,
        connections,
        partial,
        silent,
        send_and_close,
        garbage,
        no_read,
        requests,
        flood_info,
        load_flood,
    )
}


def main() -> None:
    path, uid, gid, groups, kind, count = sys.argv[1:7]
    per = int(sys.argv[7]) if len(sys.argv) > 7 else 1
    os.setgroups([int(g) for g in groups.split(",") if g])
    os.setgid(int(gid))
    os.setuid(int(uid))
    started = time.monotonic()
    held: Held = []
    report: Report = {}
    ATTACKS[kind](path, int(count), per, held, report)
    say(ready={**report, "seconds": round(time.monotonic() - started, 3), "pid": os.getpid()})
    for line in sys.stdin:
        if line.strip() == "exit":
            break
    for sock in held:
        sock.close()


if __name__ == "__main__":
    main()
