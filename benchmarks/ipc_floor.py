"""The floor under any inference through another process, measured in the same run.

A bare round trip with no framework at all: the caller copies its input into a memfd both
processes map, sends a 24-byte header over a SOCK_SEQPACKET socketpair, and a second
process blocked in `recv` runs the same ONNX Runtime session on a view of the memfd,
writes the output beside it and answers with another header. What this costs above the
same session run in process is what a 1 MiB input costs to move between two processes
on this machine before a single line of the daemon runs.

`BareRoundTrip(model, relay=True)` puts a third process in the middle, as a model host
puts one: it passes each header on to the process that runs the session and passes the
answer back. What that costs above the plain floor is what a second hop costs with no code
of ours: the floor under a hosted inference.

Used by benchmarks/ipc_inference.py; `python benchmarks/ipc_floor.py --serve FD MEMFD` is
the process that runs the session and `--relay UP DOWN` the one in the middle (both
started by `BareRoundTrip`).
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import subprocess
import sys
from typing import Any

import numpy as np
import onnxruntime as ort

HEADER = struct.Struct("<qqq")
"""offset, rows (the answer: the output's float count), output offset."""
SEGMENT_BYTES = 4 << 20
OUT_AT = 3 << 20
WIDTH = 256


def session(model: bytes) -> ort.InferenceSession:
    """One-threaded, as the onnxruntime driver's channels are."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


class BareRoundTrip:
    """The caller's end: `run(x)` returns the output computed in the other process (with
    `relay`, through a third process in the middle)."""

    def __init__(self, model: bytes, relay: bool = False) -> None:
        fd = os.memfd_create("npu-floor")
        os.ftruncate(fd, SEGMENT_BYTES)
        self.memory = mmap.mmap(fd, SEGMENT_BYTES)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.relay: subprocess.Popen[bytes] | None = None
        if relay:  # the caller's peer is the relay; the server gets the relay's other end
            up = theirs
            down, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.relay = subprocess.Popen(
                [sys.executable, __file__, "--relay", str(up.fileno()), str(down.fileno())],
                pass_fds=(up.fileno(), down.fileno()),
            )
            up.close()
            down.close()
        self.server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(theirs.fileno()), str(fd)],
            stdin=subprocess.PIPE,
            pass_fds=(theirs.fileno(), fd),
        )
        assert self.server.stdin is not None
        self.server.stdin.write(model)
        self.server.stdin.close()
        theirs.close()
        os.close(fd)
        if self.sock.recv(8) != b"ready":
            raise SystemExit("the floor's second process did not start")

    def run(self, x: np.ndarray) -> np.ndarray:
        rows = x.shape[0]
        np.copyto(np.frombuffer(self.memory, np.float32, x.size, 0).reshape(x.shape), x)
        self.sock.send(HEADER.pack(0, rows, OUT_AT))
        _, count, at = HEADER.unpack(self.sock.recv(HEADER.size))
        return np.frombuffer(self.memory, np.float32, count, at).copy()

    def close(self) -> None:
        self.sock.close()
        for process in (self.relay, self.server):
            if process is not None:
                process.wait(30)


def _serve(sock_fd: int, memory_fd: int) -> None:
    run = session(sys.stdin.buffer.read()).run
    memory = mmap.mmap(memory_fd, SEGMENT_BYTES)
    sock = socket.socket(fileno=sock_fd)
    sock.send(b"ready")
    while header := sock.recv(HEADER.size):
        offset, rows, at = HEADER.unpack(header)
        x = np.frombuffer(memory, np.float32, rows * WIDTH, offset).reshape(rows, WIDTH)
        y: Any = run(None, {"x": x})[0]
        np.frombuffer(memory, np.float32, y.size, at)[:] = y.ravel()
        sock.send(HEADER.pack(0, y.size, at))


def _relay(up_fd: int, down_fd: int) -> None:
    """Pass each message from `up` on to `down` and its answer back, until `up` closes."""
    up, down = socket.socket(fileno=up_fd), socket.socket(fileno=down_fd)
    up.send(down.recv(8))  # "ready"
    while message := up.recv(HEADER.size):
        down.send(message)
        up.send(down.recv(HEADER.size))
    down.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1:2] == ["--relay"]:
        _relay(int(sys.argv[2]), int(sys.argv[3]))
    else:
        raise SystemExit(
            "usage: python benchmarks/ipc_floor.py --serve SOCKET_FD MEMFD | --relay UP DOWN"
        )
