"""The model host: the process in which one client's models are parsed, opened and run.

`python -m npumanager.daemon.host` is started by the daemon with one end of a
SOCK_SEQPACKET socketpair as its standard input and its settings as JSON on the command
line. It confines itself first (`sandbox.confine`: an empty working directory, a mount
namespace of its own, no new privileges, the unprivileged uid it was given), building the
daemon's driver from the same plugin and options just before it drops its uid (the
runtime's files may be readable by the daemon's uid only), and serves the daemon's requests:
`count` (parse a model from the descriptors sent and count its weights), `open`, `run` (on
a thread of its own: inputs in a memfd, outputs written to a new memfd sent back),
`cancel`, `band` and `drop`. It ends when the daemon's end closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from npumanager.daemon.heap import give_back_memory
from npumanager.daemon.host import messages
from npumanager.daemon.host.sandbox import confine
from npumanager.errors import NpuManagerError
from npumanager.modelfiles import read_model_file
from npumanager.schemas.limits import DEFAULT_MAX_MODEL_FILE_BYTES
from npumanager.vendor_drivers.realexec.base import RealDriver
from npumanager.vendor_drivers.realexec.osprio import lower_thread_priority
from npumanager.vendor_drivers.realexec.session import Call, Counted, Session

RUNNERS = 4
"""Threads of each kind that run inferences; the daemon's channels bound what runs at once."""
BACKGROUND_NICE = 10
"""How much lower a background inference's thread runs (`nice` steps), as the driver's own
background workers do."""


class Host:
    """One client's models in this process, and the runs in flight."""

    def __init__(self, sock: socket.socket, driver: RealDriver) -> None:
        self._sock = sock
        self._driver = driver
        self._send_lock = threading.Lock()
        self._counted: dict[int, tuple[Counted, list[int]]] = {}
        self._sessions: dict[int, Session] = {}
        self._calls: dict[int, Call] = {}
        self._lock = threading.Lock()
        self._runners = (
            ThreadPoolExecutor(RUNNERS, thread_name_prefix="npu-host-run"),
            ThreadPoolExecutor(
                RUNNERS,
                thread_name_prefix="npu-host-background",
                initializer=lambda: lower_thread_priority(BACKGROUND_NICE, False),
            ),
        )
        """Threads that run inferences: the foreground's, and the background's (niced)."""

    def serve(self) -> None:
        """Answer the daemon's requests until it closes its end."""
        while True:
            try:
                message = messages.receive(self._sock)
            except OSError:
                return
            if message is None:
                return
            header, payload, fds = message
            op = header.get("op")
            if op == "run":
                # Known before any later message is read: a cancel that follows at once finds it.
                call = Call(bool(header.get("background")))
                with self._lock:
                    self._calls[header["run"]] = call
                runners = self._runners[call.background]
                runners.submit(self._run, header, payload, fds, call)
                continue
            try:
                reply = self._handle(op, header, fds)
            except Exception as exc:
                reply = _error(exc)
            finally:
                for fd in fds:
                    os.close(fd)
            if "id" in header:
                self._reply({"id": header["id"], **reply})

    def _handle(self, op: Any, header: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        if op == "count":
            names = header["sidecars"]
            data = read_model_file(fds[0], header.get("limit", DEFAULT_MAX_MODEL_FILE_BYTES))
            kept = [os.dup(fd) for fd in fds[1:]]  # read again when the model opens
            try:
                counted = self._driver.count_model(data, dict(zip(names, kept, strict=True)))
            except BaseException:
                _close(kept)
                raise
            self._counted[header["counted"]] = (counted, kept)
            return {"counted": header["counted"], "weight_bytes": counted.weight_bytes}
        if op == "open":
            counted, kept = self._counted.pop(header["counted"])
            try:
                session = self._driver.open_counted(header["device"], counted, header["band"])
            finally:
                _close(kept)
                give_back_memory()  # the file's bytes and the parsed model, before the limit falls
            self._sessions[header["model"]] = session
            return {
                "weight_bytes": session.weight_bytes,
                "target": session.target,
                "inputs": [
                    {"name": i.name, "shape": list(i.shape), "dtype": str(i.dtype)}
                    for i in session.inputs
                ],
            }
        if op == "band":
            self._sessions[header["model"]].set_band(header["band"], header["bands"])
            return {}
        if op == "drop":
            if header["model"] in self._counted:
                _close(self._counted.pop(header["model"])[1])
            if header["model"] in self._sessions:
                self._sessions.pop(header["model"]).close()
            give_back_memory()
            return {}
        if op == "cancel":
            with self._lock:
                call = self._calls.get(header["run"])
            if call is not None:
                call.cancel()
            return {}
        raise NpuManagerError(f"unknown host op {op!r}")

    def _run(self, header: dict[str, Any], payload: bytes, fds: list[int], call: Call) -> None:
        reply_id, run_id = header["id"], header["run"]
        out_fd = -1
        try:
            arrays = messages.read_tensors(fds.pop() if fds else payload, header["inputs"])
            feeds = dict(zip(header["names"], arrays, strict=True))
            outputs = [np.asarray(o) for o in self._sessions[header["model"]].run(feeds, call)]
            packed = messages.pack_tensors(outputs)
            if packed is None:
                out_fd, refs = messages.write_tensors(outputs, f"npu-out-{run_id}")
        except Exception as exc:
            _close(fds)
            self._reply({"id": reply_id, **_error(exc)})
            return
        finally:
            with self._lock:
                self._calls.pop(run_id, None)
        if packed is not None:
            self._reply({"id": reply_id, "outputs": packed[1]}, payload=packed[0])
            return
        try:
            self._reply({"id": reply_id, "outputs": refs}, [out_fd])
        finally:
            os.close(out_fd)

    def _reply(
        self, header: dict[str, Any], fds: list[int] | None = None, payload: bytes = b""
    ) -> None:
        # An OSError: the daemon went, and serve() ends on its next receive.
        with self._send_lock, contextlib.suppress(OSError):
            messages.send(self._sock, header, fds or (), payload)


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _error(exc: Exception) -> dict[str, Any]:
    kind = type(exc).__name__ if isinstance(exc, NpuManagerError) else "ExecutionError"
    return {"error": kind, "message": str(exc) or type(exc).__name__}


def main() -> None:
    """The host's entry point: confine, build the driver, serve on standard input."""
    settings = json.loads(sys.argv[1])
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    built: list[object] = []

    def build_driver() -> None:
        from npumanager.core.plugins.registry import load_plugins

        record = load_plugins().driver(settings["driver"])
        built.append(record.factory(settings["devices"], clock="real", **settings["options"]))

    confined = confine(settings["uid"], settings["gid"], build_driver)
    driver = built[0]
    if not isinstance(driver, RealDriver):
        raise SystemExit(f"driver {settings['driver']!r} cannot run models in a host")

    messages.send(sock, {"ready": os.getpid(), "confined": confined})
    Host(sock, driver).serve()
    # The daemon went (its end closed, as when it dies): end now. An inference in flight
    # would keep a runner thread, and so the process, alive; nothing here needs saving.
    os._exit(0)
