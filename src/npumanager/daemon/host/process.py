"""The model host: the process in which one client's models are parsed, opened and run.

`python -m npumanager.daemon.host` is started by the daemon with one end of a
SOCK_SEQPACKET socketpair as its standard input and its settings as JSON on the command
line. It confines itself first (`sandbox.confine`: an empty working directory, a mount
namespace of its own, no new privileges, the unprivileged uid it was given), building the
daemon's driver from the same plugin and options just before it drops its uid (the
runtime's files may be readable by the daemon's uid only), and serves the daemon's requests:
`count` (parse a model from the descriptors sent and count its weights), `open`,
`runner`, `cancel`, `band` and `drop`. It ends when the daemon's end closes.

Inferences do not cross the control socket: `runner` hands the host one end of a socket
of their own, served by a thread that runs each inference it reads and answers on the
same socket, so a run costs one message each way and no hand-off between threads. Its
inputs come in the message, in a memfd, or as places in the client's shared segment (its
memfd sent along with the runner's first run over it, mapped read-only); outputs go back
in the message or in a new memfd.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import resource
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from npumanager.core.driver.contract import Asked
from npumanager.daemon.heap import give_back_memory
from npumanager.daemon.host import messages
from npumanager.daemon.host.direct import BACKGROUND_NICE, DirectLane, Runs, checked_lane
from npumanager.daemon.host.memory import explained
from npumanager.daemon.host.sandbox import confine
from npumanager.errors import IllegalArgumentError, NpuManagerError, UnknownModelError
from npumanager.modelfiles import read_model_file
from npumanager.schemas.limits import DEFAULT_MAX_MODEL_FILE_BYTES
from npumanager.vendor_drivers.realexec.base import RealDriver
from npumanager.vendor_drivers.realexec.osprio import lower_thread_priority
from npumanager.vendor_drivers.realexec.session import Call, Counted, Session


class Host(Runs):
    """One client's models in this process, and the runs in flight."""

    def __init__(self, sock: socket.socket, driver: RealDriver) -> None:
        self._sock = sock
        self._driver = driver
        self._send_lock = threading.Lock()
        self._counted: dict[int, tuple[Counted, list[int]]] = {}
        self._sessions: dict[int, Session] = {}
        self._calls: dict[tuple[int, int], Call] = {}
        """The calls in flight by runner and run id (each lane counts its runs from 1)."""
        self._lock = threading.Lock()
        self._received: dict[int, int] = {}
        """The last run id each runner read: a cancel for a later one came before its run."""
        self._early: dict[int, int] = {}
        """A cancel per runner that came before its run (one at most: a runner carries one
        run at a time, and the daemon cancels only the run in flight on it)."""
        self._names: dict[tuple[int, int], int] = {}
        """The host's model id of each model handle, by client (an app's connections)."""
        self._handlers: dict[str, Callable[[dict[str, Any], list[int]], dict[str, Any]]] = {
            "count": self._count,
            "open": self._open,
            "name": self._name,
            "lane": self._start_lane,
            "band": self._band,
            "drop": self._drop,
            "cancel": self._cancel,
            "limit": self._limit,
        }

    def serve(self) -> None:
        """Answer the daemon's requests until it closes its end."""
        while True:
            try:
                message = messages.receive(self._sock)
            except OSError:
                return
            if message is None:
                return
            header, _, fds = message
            op = header.get("op")
            if op == "runner":
                self._start_runner(header, fds)
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

    def _start_runner(self, header: dict[str, Any], fds: list[int]) -> None:
        if len(fds) != 1:
            _close(fds)
            return
        index, background = int(header["runner"]), bool(header.get("background"))
        sock = socket.socket(fileno=fds[0])
        threading.Thread(
            target=self._serve_runner,
            args=(sock, index, background),
            name=f"npu-host-{'background' if background else 'run'}-{index}",
            daemon=True,
        ).start()

    def _serve_runner(self, sock: socket.socket, index: int, background: bool) -> None:
        """Run each inference the runner's socket brings, and answer on it."""
        if background:
            lower_thread_priority(BACKGROUND_NICE, False)
        segment: tuple[int, mmap.mmap] | None = None
        with sock:
            while True:
                try:
                    message = messages.receive(sock)
                except (OSError, IllegalArgumentError):
                    return
                if message is None:
                    return
                header, payload, fds = message
                run_id = header["run"]
                call = Call(background)
                self.begin(index, run_id, call)
                source: int | bytes | mmap.mmap = payload
                try:
                    if "segment" in header:
                        segment = _mapped(header["segment"], fds, segment)
                        source = segment[1]
                    elif fds:
                        source = fds.pop()
                    reply, out = self._run(header, source, call)
                except Exception as exc:
                    reply, out = _error(exc), None
                finally:
                    _close(fds)
                    self.end(index, run_id)
                answer = reply.pop("payload", b"")
                try:
                    messages.send(sock, reply, [] if out is None else [out], answer)
                except OSError:
                    return
                finally:
                    if out is not None:
                        os.close(out)

    def begin(self, runner: int, run_id: int, call: Call) -> None:
        with self._lock:
            self._received[runner] = run_id
            early = self._early.pop(runner, None)
            self._calls[runner, run_id] = call
        if early == run_id:
            call.cancel()

    def end(self, runner: int, run_id: int) -> None:
        with self._lock:
            self._calls.pop((runner, run_id), None)

    def named(self, client: int, handle: int) -> tuple[int, Session]:
        model_id = self._names.get((client, handle))
        session = None if model_id is None else self._sessions.get(model_id)
        if model_id is None or session is None:
            raise UnknownModelError(f"model {handle} is not loaded")
        return model_id, session

    def _start_lane(self, header: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """Serve a connection's lane here (`daemon.host.direct`), on a thread of its own."""
        lane, gate_sock, segment, pages = checked_lane(fds, int(header["size"]))
        client = int(header["client"])
        for handle, model_id in header.get("names", []):
            self._names[client, int(handle)] = int(model_id)
        index, idle_s = int(header["runner"]), int(header["idle_us"]) / 1e6
        DirectLane(lane, gate_sock, segment, pages, self, (client, index), idle_s).start()
        return {}

    def _handle(self, op: Any, header: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        handler = self._handlers.get(op) if type(op) is str else None
        if handler is None:
            raise NpuManagerError(f"unknown host op {op!r}")
        return handler(header, fds)

    def _count(self, header: dict[str, Any], fds: list[int]) -> dict[str, Any]:
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

    def _open(self, header: dict[str, Any], _: list[int]) -> dict[str, Any]:
        counted, kept = self._counted.pop(header["counted"])
        try:
            asked = Asked(header.get("threads"), header.get("options") or {})
            session = self._driver.open_counted(header["device"], counted, header["band"], asked)
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

    def _name(self, header: dict[str, Any], _: list[int]) -> dict[str, Any]:
        self._names[int(header["client"]), int(header["handle"])] = int(header["model"])
        return {}

    def _band(self, header: dict[str, Any], _: list[int]) -> dict[str, Any]:
        self._sessions[header["model"]].set_band(header["band"], header["bands"])
        return {}

    def _drop(self, header: dict[str, Any], _: list[int]) -> dict[str, Any]:
        model = header["model"]
        if model in self._counted:
            _close(self._counted.pop(model)[1])
        if model in self._sessions:
            self._sessions.pop(model).close()
            for key in [key for key, m in self._names.items() if m == model]:
                del self._names[key]
        give_back_memory()
        return {}

    def _limit(self, header: dict[str, Any], _: list[int]) -> dict[str, Any]:
        """The daemon moves this host's data limit with its grants (below the hard one)."""
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        soft = int(header["data"])
        resource.setrlimit(resource.RLIMIT_DATA, (soft if hard < 0 else min(soft, hard), hard))
        return {}

    def _cancel(self, header: dict[str, Any], _: list[int]) -> dict[str, Any]:
        run_id, runner = header["run"], header["runner"]
        with self._lock:
            call = self._calls.get((runner, run_id))
            if call is None and run_id > self._received.get(runner, 0):
                self._early[runner] = run_id
        if call is not None:
            call.cancel()
        return {}

    def _run(
        self, header: dict[str, Any], source: int | bytes | mmap.mmap, call: Call
    ) -> tuple[dict[str, Any], int | None]:
        """One inference: the reply and the memfd its outputs are in (None: in the reply's
        ``payload``)."""
        arrays = messages.read_tensors(source, header["inputs"])
        feeds = dict(zip(header["names"], arrays, strict=True))
        outputs = [np.asarray(o) for o in self._sessions[header["model"]].run(feeds, call)]
        del feeds, arrays
        packed = messages.pack_tensors(outputs)
        if packed is not None:
            return {"outputs": packed[1], "payload": packed[0]}, None
        out_fd, refs = messages.write_tensors(outputs, f"npu-out-{header['run']}")
        return {"outputs": refs}, out_fd

    def _reply(
        self, header: dict[str, Any], fds: list[int] | None = None, payload: bytes = b""
    ) -> None:
        # An OSError: the daemon went, and serve() ends on its next receive.
        with self._send_lock, contextlib.suppress(OSError):
            messages.send(self._sock, header, fds or (), payload)


def _mapped(
    segment_id: Any, fds: list[int], mapped: tuple[int, mmap.mmap] | None
) -> tuple[int, mmap.mmap]:
    """The client's segment a run names: the runner's mapping of it, or a new one of the
    memfd sent with the run (the first descriptor, taken)."""
    if mapped is not None and mapped[0] == segment_id:
        return mapped
    if not fds:
        raise IllegalArgumentError(f"a run names segment {segment_id!r}, never sent")
    fd = fds.pop(0)
    try:
        memory = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return segment_id, memory


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _error(exc: Exception) -> dict[str, Any]:
    kind = type(exc).__name__ if isinstance(exc, NpuManagerError) else "ExecutionError"
    return {"error": kind, "message": explained(str(exc) or type(exc).__name__)}


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
