"""The daemon's side of a model host: start it, ask it, and kill it.

A `ModelHost` is one process (`daemon.host.process`) for one connection. The driver
counts and opens a model through it (`count`, `open`: the `SessionHost` a real driver
takes) and gets a `HostedSession`, which its channels run as any session: the device
scheduler decides what runs; the host only executes. A host that dies (a crash, a kill)
fails what waits on it at once and calls `on_death` with why; `kill` ends it with SIGKILL.

Requests go on the host's control socket, answered through its reader thread; an
inference goes on a runner (`Runner`), a socket of its own that the calling thread
borrows, sends on and reads the answer from itself.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npumanager.core.driver.contract import Asked
from npumanager.daemon.host import messages, shared
from npumanager.daemon.host.grants import GrantPage, Grants
from npumanager.daemon.host.memory import (
    HELD_FACTOR,
    HOST_MEMORY_BASE_BYTES,
    HOST_MEMORY_CEILING_BYTES,
    HostCgroup,
    HostRlimit,
    MemoryCgroups,
    host_limit,
)
from npumanager.errors import (
    CapacityError,
    ExecutionError,
    IllegalArgumentError,
    ModelHostError,
    NpuManagerError,
)
from npumanager.schemas.limits import DEFAULT_LEASE_US, LEASE_IDLE_US
from npumanager.vendor_drivers.realexec.session import Call, Counted, InHost, InputSpec

log = logging.getLogger(__name__)

HOST_ANSWER_S = 120.0
"""How long a host may take to start, or to count or open a model, before it is killed."""
NOBODY = 65534
"""The uid and gid a host of root or of the daemon's own uid runs as."""


@dataclass
class RunCounts:
    """How the inputs of the hosts' runs went: by place in the client's segment, or copied."""

    in_place: int = 0
    copied: int = 0


@dataclass(frozen=True)
class HostSettings:
    """What every host of a daemon is built with: the daemon's driver and its options."""

    driver: str
    options: Mapping[str, Any] = field(default_factory=dict)
    devices: int = 1
    answer_s: float = HOST_ANSWER_S
    start_s: float = HOST_ANSWER_S
    cgroups: MemoryCgroups | None = None
    """Where each host's memory cgroup is made (`daemon.host.memory`); None: no limit."""
    counts: RunCounts = field(default_factory=RunCounts)
    """Every host of the daemon counts its runs here (shown in `info`)."""
    memory_ceiling: int = HOST_MEMORY_CEILING_BYTES
    """The most a host's data limit may ever be, where it has no memory cgroup
    (`daemon.host.memory.HostRlimit`)."""
    lease_us: int = DEFAULT_LEASE_US
    """How long a direct run's grant leases its channel (`daemon.server.direct`)."""
    lease_idle_us: int = LEASE_IDLE_US
    """How long a host holding a lease waits for its client's next request before it gives
    the lease back."""
    command: tuple[str, ...] = (sys.executable, "-m", "npumanager.daemon.host")
    """How a host is started (its settings follow as JSON): a test may start another."""


def can_host(driver: object) -> bool:
    """True for a driver whose models a host can open (one built on `RealDriver`)."""
    from npumanager.vendor_drivers.realexec.base import RealDriver

    return isinstance(driver, RealDriver)


def host_identity(uid: int, gid: int) -> tuple[int, int]:
    """The uid and gid a client's host runs as: the client's own, so it can do nothing the
    client could not; `NOBODY` for root's clients and the daemon's own uid's."""
    if uid == 0 or uid == os.geteuid():
        return NOBODY, NOBODY
    return uid, (NOBODY if gid == 0 else gid)


@dataclass
class HostCounted:
    """A model a host parsed and counted, waiting there to be opened."""

    id: int
    weight_bytes: int
    allowed: int = 0
    """What the load's grant allows: the host's memory limit holds room for it until the
    model is opened or discarded."""


class ModelHost:
    """One host process and the requests waiting for its answers."""

    def __init__(
        self,
        settings: HostSettings,
        uid: int,
        gid: int,
        on_death: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.settings = settings
        self.uid, self.gid = host_identity(uid, gid)
        self._on_death = on_death
        self._ids = itertools.count(1)
        self._waiting: dict[int, Future[messages.Message | None]] = {}
        """Answers awaited, by request id; None answers a request whose host died."""
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self.dead: str | None = None
        self._killed = False
        self._held = 0
        self._loading = 0
        self.cgroup: HostCgroup | None = None
        self.rlimit: HostRlimit | None = None
        """Its data limit, where it has no memory cgroup."""
        self._oom_killed = False
        self._condemned: str | None = None
        """Why the daemon killed the host, when it did so for a fault of the host's own."""
        self._gone = threading.Event()
        """Set once the reader has said why the host ended (`dead`)."""
        self._idle_runners: dict[bool, list[Runner]] = {False: [], True: []}
        self._runners: list[Runner] = []
        self._lanes = 0
        self.grants = Grants()
        """How long the host was allowed to run (`daemon.server.audit` holds it to that)."""
        self.names: dict[tuple[int, int], int] = {}
        """The host's model id of each model handle, by client (for their lanes)."""
        self._users = 0
        """The connections that use the host (`join`, `leave`)."""
        self.last_opened: int | None = None
        """The model id of the last model opened (loads run one at a time)."""
        self._start()
        ready = self._first_message()
        self.page = GrantPage()
        """Its leases' generation (`daemon.host.direct`), written by the daemon only."""
        self.confined = ready.get("confined", {})
        self._reader = threading.Thread(target=self._read, name=f"npu-host-{self.pid}", daemon=True)
        self._reader.start()

    def _start(self) -> None:
        """Start the host process on a socketpair, in its memory cgroup when there is one."""
        settings = self.settings
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        spec = {
            "driver": settings.driver,
            "options": dict(settings.options),
            "devices": settings.devices,
            "uid": self.uid,
            "gid": self.gid,
        }
        with theirs:
            try:
                self._process = subprocess.Popen(
                    [*settings.command, json.dumps(spec)],
                    stdin=theirs.fileno(),
                    stdout=subprocess.DEVNULL,
                    close_fds=True,
                )
            except OSError as exc:
                ours.close()
                raise ModelHostError(f"the model host could not be started: {exc}") from None
        self.pid = self._process.pid
        if settings.cgroups is None:
            self.rlimit = HostRlimit(self.pid, settings.memory_ceiling)
            try:
                self.rlimit.start()
            except OSError as exc:
                self.rlimit = None
                log.warning("model host %d runs without a data limit: %s", self.pid, exc)
        else:
            name = f"npu-host-{self.pid}"
            try:
                self.cgroup = settings.cgroups.join(name, self.pid, host_limit(0, 0))
            except OSError as exc:
                self.kill()
                self._reap()
                raise ModelHostError(
                    f"the model host could not be given its memory limit: {exc}"
                ) from None

    def _first_message(self) -> dict[str, Any]:
        self._sock.settimeout(self.settings.start_s)
        try:
            message = messages.receive(self._sock)
        except (OSError, IllegalArgumentError) as exc:
            self.kill()
            self._reap()
            raise ModelHostError(f"the model host did not start: {exc}") from None
        if message is None or "ready" not in message.header:
            self.kill()
            raise ModelHostError(f"the model host did not start ({self._reap()})")
        self._sock.settimeout(None)
        return message.header

    # Asking ---------------------------------------------------------------------------

    def ask(
        self,
        op: str,
        fds: Sequence[int] = (),
        *,
        timeout: float | None = -1.0,
        payload: bytes = b"",
        **fields: Any,
    ) -> messages.Message:
        """Send a request and wait for its answer (`ModelHostError` if the host dies, or
        does not answer within `timeout`, by default `HostSettings.answer_s`, None for
        ever: it is killed)."""
        request_id = next(self._ids)
        waiting: Future[messages.Message | None] = Future()
        with self._lock:
            if self.dead is not None:
                raise ModelHostError(f"the model host {self.dead}")
            self._waiting[request_id] = waiting
        grant = self.grants.opened()  # parsing and opening a model is work it was asked for
        self.tell(op, fds, payload, id=request_id, **fields)
        try:
            limit = self.settings.answer_s if timeout is not None and timeout < 0 else timeout
            answer = waiting.result(limit)
        except TimeoutError:
            self.kill()
            raise ModelHostError(
                f"the model host did not answer {op} within {self.settings.answer_s} s; "
                "it was killed"
            ) from None
        finally:
            self.grants.closed(grant)
        if answer is None:
            # A fresh error: one stored in the future would keep, through its traceback,
            # every frame it passed (a lane's holds a client's segment) in a cycle.
            raise ModelHostError(f"the model host {self.dead}")
        if "error" in answer.header:
            for fd in answer.fds:
                os.close(fd)
            raise _error_class(answer.header["error"])(str(answer.header.get("message", "")))
        return answer

    def tell(self, op: str, fds: Sequence[int] = (), payload: bytes = b"", **fields: Any) -> None:
        """Send a request that has no answer (or whose answer `ask` waits for)."""
        try:
            with self._send_lock:
                messages.send(self._sock, {"op": op, **fields}, fds, payload)
        except OSError:
            pass  # the host died: the reader says so

    def run(
        self,
        call: Call,
        fds: Sequence[int],
        payload: bytes,
        segment: shared.SharedFile | None = None,
        **fields: Any,
    ) -> messages.Message:
        """One inference on a runner of the call's kind, its inputs in `payload`, in
        `fds` or at places in `segment`: the host's answer (its error raised). A run has no
        time limit; `call`'s cancel stops it."""
        runner = self._borrow(call.background)
        run_id = next(self._ids)
        grant = self.grants.opened()

        def stop() -> None:
            self.grants.stopped(grant)
            self.tell("cancel", run=run_id, runner=runner.index)

        sending = list(fds)
        if segment is not None:
            fields["segment"] = segment.id
            if runner.segment != segment.id:
                sending.insert(0, segment.fd)
        try:
            call.arm(stop)
            messages.send(runner.sock, {"run": run_id, **fields}, sending, payload)
            answer = messages.receive(runner.sock)
        except IllegalArgumentError as exc:
            self.kill()
            raise ModelHostError(f"the model host answered a run badly ({exc}); killed") from None
        except OSError:
            answer = None
        finally:
            self.grants.closed(grant)
        if answer is None:
            runner.sock.close()
            raise ModelHostError(f"the model host {self.ending()}")
        if segment is not None:
            runner.segment = segment.id
        with self._lock:
            self._idle_runners[call.background].append(runner)
            if segment is None:
                self.settings.counts.copied += 1
            else:
                self.settings.counts.in_place += 1
        if "error" in answer.header:
            for fd in answer.fds:
                os.close(fd)
            raise _error_class(answer.header["error"])(str(answer.header.get("message", "")))
        return answer

    def _borrow(self, background: bool) -> Runner:
        """An idle runner of the kind, or a new one (a socketpair whose other end the host
        serves on a thread of its own, niced for the background)."""
        with self._lock:
            if self.dead is not None:
                raise ModelHostError(f"the model host {self.dead}")
            idle = self._idle_runners[background]
            if idle:
                return idle.pop()
            runner = Runner(len(self._runners) + 1, background)
            self._runners.append(runner)
        theirs = runner.pair()
        try:
            self.tell("runner", [theirs.fileno()], runner=runner.index, background=background)
        finally:
            theirs.close()
        return runner

    def open_lane(
        self,
        client: int,
        lane: socket.socket,
        segment: tuple[int, int],
        tally_fd: int,
    ) -> tuple[socket.socket, int]:
        """Have the host serve client `client`'s lane (`daemon.host.direct`) over its
        segment (descriptor, size), counting its runs in the page `tally_fd`: the daemon's
        end of the lane's gate, and the lane's runner index."""
        segment_fd, segment_size = segment
        with self._lock:
            if self.dead is not None:
                raise ModelHostError(f"the model host {self.dead}")
            self._lanes += 1
            index = -self._lanes  # runners count up from 1
            names = sorted((h, m) for (c, h), m in self.names.items() if c == client)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            fds = [lane.fileno(), theirs.fileno(), segment_fd, self.page.read_only, tally_fd]
            idle = self.settings.lease_idle_us
            self.tell(
                "lane",
                fds,
                runner=index,
                client=client,
                size=segment_size,
                names=names,
                idle_us=idle,
            )
        return ours, index

    def name(self, client: int, handle: int, model_id: int) -> None:
        """Client `client` calls the host's model `model_id` ``handle`` (its lanes say it)."""
        with self._lock:
            self.names[client, handle] = model_id
        self.ask("name", client=client, handle=handle, model=model_id)

    def join(self) -> None:
        """One more connection uses the host (an app's connections share one)."""
        with self._lock:
            self._users += 1

    def leave(self) -> None:
        """A connection that used the host closed: the last one's going kills it."""
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self.kill()

    def forget(self, model_id: int) -> None:
        """The model `model_id` is closed: no handle names it any more."""
        with self._lock:
            for key in [key for key, m in self.names.items() if m == model_id]:
                del self.names[key]

    def ending(self) -> str:
        """Why the host ended, once its reader has said (a runner's socket may close first)."""
        self._gone.wait(self.settings.answer_s)
        return self.dead or "ended"

    def count(
        self, model: Any, sidecars: Mapping[str, int], allowed: int | None = None
    ) -> HostCounted:
        """Have the host parse the model (a `ModelFile` or bytes) and count its weights;
        its memory limit makes room for a model of `allowed` weight bytes meanwhile."""
        if isinstance(model, ModelFile):
            fd, owned = model.fd, False
        elif isinstance(model, bytes | bytearray | memoryview):
            fd, owned = _memfd_of(bytes(model)), True
        else:
            raise IllegalArgumentError("a model host takes a model file or its bytes")
        room = allowed or 0
        self._hold(loading=room)
        try:
            count_id = next(self._ids)
            header = self.ask(
                "count", [fd, *sidecars.values()], sidecars=list(sidecars), counted=count_id
            ).header
        except BaseException:
            self._hold(loading=-room)
            raise
        finally:
            if owned:
                os.close(fd)
        return HostCounted(count_id, _count_of(header.get("weight_bytes")), room)

    def open(
        self, device: int, counted: Counted, band: int, asked: Asked | None = None
    ) -> HostedSession:
        """Open a counted model in the host: its session as the daemon sees it."""
        assert isinstance(counted, HostCounted)
        model_id = next(self._ids)
        try:
            header = self.ask(
                "open",
                counted=counted.id,
                model=model_id,
                device=device,
                band=band,
                threads=None if asked is None else asked.threads,
                options={} if asked is None else dict(asked.options),
            ).header
            inputs = _input_specs(header.get("inputs"))
            weight = _count_of(header.get("weight_bytes"))
        except BaseException:
            self._hold(loading=-counted.allowed)
            raise
        if weight != counted.weight_bytes:
            self.tell("drop", model=model_id)
            self._hold(loading=-counted.allowed)
            raise ModelHostError(
                f"the model host opened {weight} weight bytes after counting {counted.weight_bytes}"
            )
        if not self._hold(held=weight, loading=-counted.allowed):
            held_by = self.cgroup or self.rlimit
            usage = held_by.usage() if held_by is not None else 0
            self.ask("drop", model=model_id)
            self._hold(held=-weight)
            raise CapacityError(
                f"the model's host uses {usage} bytes with the model open, more than its grants "
                f"allow ({host_limit(self._held + weight, 0)} bytes: {HOST_MEMORY_BASE_BYTES} "
                f"for the host and {HELD_FACTOR}x the weights); the model was closed"
            )
        self.last_opened = model_id
        return HostedSession(self, model_id, weight, inputs, str(header.get("target", "")))

    def discard(self, counted: Counted) -> None:
        """Forget a counted model that will not be opened."""
        if isinstance(counted, HostCounted):
            self.tell("drop", model=counted.id)
            self._hold(loading=-counted.allowed)

    def closed(self, weight_bytes: int) -> None:
        """A model of `weight_bytes` was closed in the host: its limit shrinks (when the
        host has given the memory back: a host keeps a limit it is still above)."""
        self._hold(held=-weight_bytes)

    def _hold(self, held: int = 0, loading: int = 0) -> bool:
        """Change what the host holds and is opening, and its limit to match; False when
        the host uses more than the new limit (the limit is then left as it was)."""
        with self._lock:
            self._held += held
            self._loading += loading
            limit = host_limit(self._held, self._loading)
        if self.dead is not None:
            return True
        if self.rlimit is not None:
            if self.rlimit.usage() > limit:
                return False
            self.tell("limit", data=min(limit, self.rlimit.ceiling))
            return True
        if self.cgroup is None:
            return True
        try:
            return self.cgroup.set_limit(limit)
        except OSError as exc:
            log.warning("could not set the memory limit of model host %d: %s", self.pid, exc)
            return False

    # Reading ----------------------------------------------------------------------------

    def _read(self) -> None:
        reason = "ended"
        while True:
            try:
                message = messages.receive(self._sock)
            except IllegalArgumentError as exc:
                reason = f"sent a malformed message ({exc})"
                self.kill()
                break
            except OSError:
                break
            if message is None:
                break
            reply_to = message.header.get("id")
            with self._lock:
                waiting = self._waiting.pop(reply_to, None) if type(reply_to) is int else None
            if waiting is None:
                for fd in message.fds:
                    os.close(fd)
                continue
            waiting.set_result(message)
        self._died(reason)

    def _died(self, reason: str) -> None:
        status = self._reap()
        if self._oom_killed:
            reason = (
                "used more memory than its grants allow "
                f"({host_limit(self._held, self._loading) >> 20} MiB) and was killed"
            )
        if self._condemned is not None:
            reason = self._condemned
        why = "was stopped" if self._killed else f"{reason} ({status})"
        with self._lock:
            self.dead = why
            waiting, self._waiting = self._waiting, {}
        if not self._killed:
            log.warning("the model host of uid %d (pid %d) %s", self.uid, self.pid, why)
            self._on_death(why)
        for future in waiting.values():
            future.set_result(None)
        self._gone.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        self.page.close()

    def _reap(self) -> str:
        """Wait for the host to end (after a kill, or its socket closed), remove its
        cgroup, and say how it ended."""
        try:
            code = self._process.wait(self.settings.answer_s)
        except subprocess.TimeoutExpired:
            return "still running"
        if self.cgroup is not None:
            self._oom_killed = self.cgroup.oom_kills() > 0
            try:
                self.cgroup.remove()
            except OSError as exc:
                log.warning("could not remove model host %d's cgroup: %s", self.pid, exc)
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    @property
    def usable(self) -> bool:
        """True while the host may take more work: alive, and not being killed."""
        return self.dead is None and not self._killed

    @property
    def condemned(self) -> bool:
        """True if the daemon killed the host for a fault of its own (`condemn`)."""
        return self._condemned is not None

    def condemn(self, why: str) -> None:
        """Kill the host for `why` (its death is told as any host's that died by itself)."""
        self._condemned = why
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signal.SIGCONT)  # a stopped host would not die
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()

    def pause(self) -> None:
        """Stop the host (SIGSTOP) until `resume`: it runs nothing meanwhile."""
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a stopped host go on (SIGCONT)."""
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """End the host now (SIGKILL): its loads and runs stop, its memory goes back."""
        self._killed = self._killed or self.dead is None
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            runners = list(self._runners)
        for runner in runners:
            with contextlib.suppress(OSError):
                runner.sock.shutdown(socket.SHUT_RDWR)


class Runner:
    """A socket on which one inference at a time goes to the host and its answer comes
    back; `segment` is the id of the shared segment the host has mapped for it."""

    def __init__(self, index: int, background: bool) -> None:
        self.index = index
        self.background = background
        self.segment: int | None = None
        self.sock, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def pair(self) -> socket.socket:
        """The host's end: the caller sends it once and closes it."""
        return self._theirs


@dataclass(frozen=True)
class ModelFile:
    """A model file by the descriptor the client sent: the host reads it itself."""

    fd: int


class HostedSession:
    """A model open in a host: `Session` for the driver's channels."""

    def __init__(
        self,
        host: ModelHost,
        model_id: int,
        weight_bytes: int,
        inputs: tuple[InputSpec, ...],
        target: str,
    ) -> None:
        self.host = host
        self.model_id = model_id
        self.weight_bytes = weight_bytes
        self.inputs = inputs
        self.target = target

    def run(self, feeds: dict[str, np.ndarray], call: Call) -> list[np.ndarray]:
        """Run one inference in the host: inputs by place in the client's segment when they
        lie there, else in the message or a memfd; outputs in the answer or its memfd."""
        host = self.host
        arrays = list(feeds.values())
        payload, fds, segment = b"", [], None
        placed = shared.locate(arrays)
        if placed is not None:
            segment, offsets = placed
            refs = messages.refs_at(arrays, offsets)
        elif (packed := messages.pack_tensors(arrays)) is not None:
            payload, refs = packed
        else:
            fd, refs = messages.write_tensors(arrays, "npu-in")
            fds.append(fd)
        del arrays, placed
        try:
            answer = host.run(
                call, fds, payload, segment, model=self.model_id, names=list(feeds), inputs=refs
            )
        finally:
            for fd in fds:
                os.close(fd)
        if len(answer.fds) > 1:
            for extra in answer.fds:
                os.close(extra)
            raise ModelHostError("the model host answered a run with more than its outputs")
        source = answer.fds[0] if answer.fds else answer.payload
        try:
            return messages.read_tensors(source, answer.header.get("outputs"))
        except IllegalArgumentError as exc:
            host.kill()
            raise ModelHostError(f"the model host answered a run badly ({exc}); killed") from None

    def set_band(self, band: int, bands: int) -> None:
        """Relay the band to the host's runtime."""
        self.host.tell("band", model=self.model_id, band=band, bands=bands)

    def close(self) -> None:
        """Close the model's session in the host."""
        self.host.forget(self.model_id)
        self.host.tell("drop", model=self.model_id)
        self.host.closed(self.weight_bytes)


def _error_class(kind: Any) -> type[Exception]:
    from npumanager import errors

    found = getattr(errors, str(kind), None)
    if isinstance(found, type) and issubclass(found, NpuManagerError):
        return found
    return ExecutionError


def _count_of(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ModelHostError(f"the model host gave a bad byte count {value!r}")
    return value


def _input_specs(value: Any) -> tuple[InputSpec, ...]:
    """The model's inputs as the host described them, checked."""
    if not isinstance(value, list):
        raise ModelHostError("the model host described no inputs")
    specs = []
    for item in value:
        try:
            shape = tuple(None if d is None else int(d) for d in item["shape"])
            specs.append(InputSpec(str(item["name"]), shape, np.dtype(str(item["dtype"]))))
        except (KeyError, TypeError, ValueError):
            raise ModelHostError(f"the model host described an input badly: {item!r}") from None
    return tuple(specs)


def _memfd_of(data: bytes) -> int:
    """A memfd holding `data` (a model sent as bytes), for the host to read."""
    fd = os.memfd_create("npu-model", os.MFD_CLOEXEC)
    try:
        view, at = memoryview(data), 0
        while at < len(view):
            at += os.write(fd, view[at:])
    except BaseException:
        os.close(fd)
        raise
    return fd


__all__ = ["HostSettings", "HostedSession", "InHost", "ModelFile", "ModelHost"]
