"""The floor under any request-to-decision round trip in Python, measured in the same run.

The least a decision server written in Python can do per request, with nothing of the
daemon around it: one process blocked in `recv` on a bare Unix socket cuts the bytes into
frames, parses each with the protocol's own parser, hands the request to the same arbiter
`npu-manager serve` runs (the in-process service: vnpu, status quo, real clock, callbacks
inline), and writes the decision and the reply with the protocol's own encoders in one
`sendall`. No loop, no slices of a turn, no quotas, no identity, no telemetry beyond the
service's own.

What a raw client's round trip through it costs above the bare echo is what a decision
costs in Python on this machine, in the same wake-ups, before a line of the daemon runs;
`benchmarks/ipc.py` judges the daemon's round trip against it as well as against the echo.

`DecisionFloor(folder)` starts the server in a process of its own and connects to it
(said hello); `.sock` speaks the daemon's raw protocol (`ipc.raw_round` times it).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from typing import Any

import npumanager as npu
from npumanager.core.client.dispatch import run_inline
from npumanager.daemon.wire import protocol as wire
from npumanager.schemas.limits import PROTOCOL_VERSION

_RECV_BYTES = 1 << 16


def serve(path: str, ready: Any) -> None:
    """Answer one connection on `path` until it closes (the server process's body)."""
    service = npu.Service("vnpu", "status_quo", clock="real")
    manager = service.manager(10_000, uses_feature=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    ready.set()
    conn, _ = listener.accept()
    reader = wire.FrameReader()
    out = bytearray()
    live: dict[int, npu.ModelLoadRequest] = {}

    class Frames(npu.ModelLoadRequestCallback):
        """Each decision the arbiter makes, as the frame the daemon would send."""

        def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
            out.extend(wire.decision_frame(request.id, int(status)))

        def on_model_load_request_complete(self, request: Any, status: Any) -> None:
            out.extend(wire.complete_frame(request.id, int(status)))

    frames = Frames()
    try:
        while data := conn.recv(_RECV_BYTES):
            for body in reader.feed(data):
                message = wire.parse_client(body)
                if isinstance(message, wire.Hello):
                    out.extend(wire.encode(_welcome()))
                    continue
                if isinstance(message, wire.RequestCanLoad):
                    live[message.request.id] = message.request
                    manager.request_can_load_model(message.request, frames, run_inline)
                elif isinstance(message, wire.CancelLoad):
                    manager.cancel_model_load(live.pop(message.request_id))
                else:
                    raise SystemExit(f"the decision floor answers no {message.op}")
                out.extend(wire.reply_frame(message.seq))
            conn.sendall(out)
            out.clear()
    finally:
        conn.close()
        service.close()


def _welcome() -> wire.Welcome:
    uid, gid, pid = os.getuid(), os.getgid(), os.getpid()
    return wire.Welcome(
        version=PROTOCOL_VERSION,
        uid=uid,
        pid=pid,
        gid=gid,
        daemon_pid=pid,
        management=True,
        app_id=f"uid:{uid}",
        hal_uid=uid,
    )


class DecisionFloor:
    """The floor server in a process of its own and a connection to it that said hello."""

    def __init__(self, folder: str) -> None:
        path = os.path.join(folder, "decision-floor.sock")
        ready = multiprocessing.Event()
        self.process = multiprocessing.Process(target=serve, args=(path, ready), daemon=True)
        self.process.start()
        if not ready.wait(30):
            raise SystemExit("the decision floor did not start listening within 30 s")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.sendall(wire.encode(wire.HELLO))
        welcome = wire.FrameReader()
        while not list(welcome.feed(self.sock.recv(_RECV_BYTES))):
            pass

    def close(self) -> None:
        self.sock.close()
        self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()
