"""The daemon: one `Service` shared by every process that connects to its Unix socket.

One thread at a time leads a selector loop over the listening socket, the clients'
connections and a wake-up descriptor (`leadership`: a leader that took a foreground
inference runs it once its turn is over, and a standby thread leads meanwhile). Frames
are handled by the leading thread; the service's deliveries for a connection are posted
to it too, so a reply and the decision it caused leave in one send; only an inference's
completion is sent by the thread that ran it, when nothing waits before it. A client is
known by the kernel's credentials of its socket. When its connection closes, however it
died, its requests end at once (its loaded work is cancelled, the policy re-evaluates).

No client can stop the loop or starve the others: whatever a connection's frames raise
ends at that connection; each connection gets a slice of each turn, and none while it
leaves its replies unread; per-uid caps bound what one uid holds; a daemon-wide budget
bounds the bytes buffered for all clients, dropping the connection that buffers the most
when it is exceeded.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from npumanager.apps.registry import AppRegistry
from npumanager.core.client.dispatch import Task
from npumanager.core.plugins.importance import ImportanceSource
from npumanager.core.service.service import Service
from npumanager.daemon.heap import TrimSchedule, give_back_memory
from npumanager.daemon.host.client import HostSettings
from npumanager.daemon.peer import peer_credentials
from npumanager.daemon.server.admission import Admission
from npumanager.daemon.server.binding import Binding, bind, raise_descriptor_limit
from npumanager.daemon.server.calls import Calls
from npumanager.daemon.server.connection import Connection
from npumanager.daemon.server.device_users import DeviceUsers
from npumanager.daemon.server.document import describe_daemon
from npumanager.daemon.server.frames import FrameHandler
from npumanager.daemon.server.hosting import Hosting
from npumanager.daemon.server.importance import AppImportance
from npumanager.daemon.server.inference import InferenceCalls
from npumanager.daemon.server.info import InfoCache
from npumanager.daemon.server.leadership import Leadership
from npumanager.daemon.server.quotas import DaemonLimits, UidUsage
from npumanager.daemon.server.ratelog import RateLimitedLog
from npumanager.daemon.server.stats import DaemonStats
from npumanager.daemon.server.systemd import Notifier
from npumanager.daemon.server.transport import Transport
from npumanager.schemas.limits import (
    HELLO_TIMEOUT_S,
    MANAGEMENT_RESERVE_FDS,
)

log = logging.getLogger(__name__)

_RECV_BYTES = 1 << 16
_ACCEPT_PAUSE_S = 0.1
"""How long the daemon stops accepting when it runs out of file descriptors."""
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_OWN_FDS = 16
"""Descriptors the daemon needs for itself (selector, wake pipe, lock, logs, driver)."""
_IDLE_SCAN_S = 1.0
ACCEPTS_PER_TURN = 8
"""Connections accepted in one turn of the loop, before every client's frames are served."""
_TRIM_AFTER_BYTES = 1 << 20
"""Freed client buffers past this many bytes are handed back to the system soon after."""
_TRIM_QUIET_S = 0.2
"""Memory is handed back this long after the last client buffer was freed."""
_TRIM_MOST_S = 2.0
"""While buffers keep being freed (a flood of connections), memory is handed back this
often: each time walks the heap on the loop (about a millisecond here under a flood)."""


class Daemon:
    """Serves one `Service` on a Unix socket until `stop()`."""

    def __init__(
        self,
        service: Service,
        socket_path: Path,
        *,
        socket_group: int | None = None,
        management_group: int | None = None,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        limits: DaemonLimits | None = None,
        create_socket_dir: bool = True,
        listener: socket.socket | None = None,
        notifier: Notifier | None = None,
        hosts: HostSettings | None = None,
        importance_sources: Sequence[tuple[str, ImportanceSource]] = (),
        device_nodes: Sequence[str] | None = None,
        count_device_users: bool = False,
        device_users_root: Path = Path("/"),
    ) -> None:
        self.service = service
        self.socket_path = Path(socket_path)
        self.socket_group = socket_group
        self.management_group = management_group
        self.hello_timeout_s = hello_timeout_s
        self.limits = limits or DaemonLimits()
        self.usage = UidUsage(self.limits, service.backend.holdings)
        self.create_socket_dir = create_socket_dir
        self._inherited = listener
        self.notifier = notifier or Notifier()
        self._watchdog_at: float | None = None
        self.stats = DaemonStats()
        self.max_connections = 0
        self._awaiting_hello: dict[Connection, float] = {}
        self._ready: deque[Task] = deque()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._binding: Binding | None = None
        self._stopping = False
        self.abandoned_load = False
        """True once stopped with a model load in progress (its thread is in the runtime:
        the process must end without running the runtime's exit handlers)."""
        self.leadership = Leadership()
        self._accept_resume_at: float | None = None
        self._next_idle_scan = 0.0
        self._trim = TrimSchedule(_TRIM_AFTER_BYTES, _TRIM_QUIET_S, _TRIM_MOST_S)
        self._log = RateLimitedLog(log)
        self.apps = AppRegistry()
        service.name_uids(self.apps.app_id_of)
        self.importance = AppImportance(
            self.apps, service.set_uid_importance, sources=importance_sources
        )
        """Each app's importance: pins, then the sources named here, in order."""
        self.calls = Calls(service, self.post, management_group, self.importance)
        self.device_users = DeviceUsers(device_nodes, self._host_pids, root=device_users_root)
        """Processes using the accelerator without the manager, for `info` and metrics."""
        service.show_device_users(lambda: self.device_users.current().users)
        self.count_device_users = count_device_users
        """Their resident memory counts against device 0's capacity."""
        self.inference = inference = InferenceCalls(
            service,
            self.calls,
            self.post,
            self.leadership,
            max_shared_bytes=self.limits.max_shared_bytes,
            max_model_file_bytes=self.limits.max_model_file_bytes,
            max_in_flight=self.limits.max_inferences_per_connection,
            stats=self.stats,
            hosting=None
            if hosts is None
            else Hosting(
                hosts,
                service,
                self.post,
                max_hosts_per_uid=self.limits.max_hosts_per_uid,
                max_hosts=self.limits.max_hosts,
            ),
        )
        self._info = InfoCache(self.describe)
        self.admission = Admission(self.usage, self.stats, self._log)
        forget = self._forget_deadline
        handlers = {**self.calls.handlers, **inference.handlers}
        frames = FrameHandler(
            service, handlers, self._info, self.stats, self._run_ready, forget, self.importance
        )
        self.transport = Transport(
            self._selector,
            frames,
            self._info,
            self.limits,
            self.usage,
            self.stats,
            self._log,
            self._dropped,
        )

    # Binding ----------------------------------------------------------------------------

    def bind(self) -> None:
        """Take the socket path (see `binding.bind`), or the socket systemd handed over, and
        raise the descriptor limit."""
        if self._inherited is not None:
            self._binding = Binding.adopt(self._inherited)
            self.socket_path = self._binding.path
        else:
            self._binding = bind(
                self.socket_path,
                socket_group=self.socket_group,
                create_parent=self.create_socket_dir,
            )
        descriptors = raise_descriptor_limit()
        self.max_connections = max(1, descriptors - MANAGEMENT_RESERVE_FDS - _OWN_FDS)
        self.admission.max_connections = self.max_connections
        self._selector.register(self._binding.listener, selectors.EVENT_READ, self._accept)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._woken)

    # The loop ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Run until `stop()`, then close the service and every connection."""
        if self._binding is None:
            self.bind()
        self.importance.start(self.post)
        if self.count_device_users:
            self.device_users.count_against(
                lambda held: self.post(lambda: self.service.count_outside_memory([held]))
            )
        self.notifier.notify(  # once everything runs: the first client is ranked by all
            "READY=1", f"STATUS=serving on {self.socket_path}", f"MAINPID={os.getpid()}"
        )
        self._pet_watchdog(time.monotonic())
        self.leadership.run(self._loop_turn, self._shutdown)

    def _loop_turn(self) -> bool:
        """One turn of the loop (on the thread leading it); False once it is to stop."""
        if self._stopping:
            return False
        self.transport.shares.new_turn()
        for key, mask in self._selector.select(0 if self.transport.backlog else self._timeout()):
            key.data(key.fileobj, mask)
        self.transport.serve_backlog()
        self._on_time(time.monotonic())
        self._turn()
        return True

    def wake_on_signals(self) -> None:
        """From the main thread: let any signal wake the loop. The kernel hands a signal to
        any thread; Python runs its handler on the main thread only, which may sleep in the
        loop's selector: the signal's byte on the wake pipe ends that sleep."""
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

    def stop(self) -> None:
        """Ask the loop to finish (safe from any thread and from a signal handler)."""
        self._stopping = True
        self._wake()

    def post(self, task: Task) -> None:
        """The executor of every remote request: run `task` on the thread leading the loop."""
        self._ready.append(task)
        if threading.get_ident() != self.leadership.loop_thread:
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\0")

    def _woken(self, _: Any, __: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _run_ready(self) -> None:
        ready = self._ready
        if ready:
            self._info.changed()
        while ready:
            task = ready.popleft()
            try:
                task()
            except Exception:
                self.stats.internal_errors += 1
                log.exception("a delivery to a client raised")

    def _turn(self) -> None:
        """Run posted deliveries, write what each connection has queued, hand memory back."""
        self._run_ready()
        self.transport.write_all()
        self._trim.freed(self.transport.freed, time.monotonic())

    def _timeout(self) -> float | None:
        """How long the loop may sleep: until accepting resumes or a hello is overdue."""
        times = [self._accept_resume_at] if self._accept_resume_at is not None else []
        if self._awaiting_hello:
            times.append(next(iter(self._awaiting_hello.values())))
        if self.limits.idle_timeout_s > 0 and self.transport.connections:
            times.append(self._next_idle_scan)
        if self._trim.due is not None:
            times.append(self._trim.due)
        if self._watchdog_at is not None:
            times.append(self._watchdog_at)
        released = self.transport.refusals.next_release()
        if released is not None:
            times.append(released)
        return max(0.0, min(times) - time.monotonic()) if times else None

    def _dropped(self, connection: Connection) -> None:
        """A connection went: no hello awaited from it, its queued loads dropped, and the
        memory of the models it held handed back to the system soon after."""
        self._forget_deadline(connection)
        self.inference.forget(connection)
        manager = connection.manager
        if connection.app is not None:
            self.apps.left(connection.app, connection.peer.pid)
            if manager is not None:
                self.usage.apps.leave(connection.app.hal_uid, manager)
        if manager is not None and self.service.backend.holdings(manager)[1]:
            self.transport.freed += _TRIM_AFTER_BYTES

    def _forget_deadline(self, connection: Connection) -> None:
        """The connection said hello or is gone: it has no hello deadline any more."""
        self._awaiting_hello.pop(connection, None)

    @property
    def connections(self) -> dict[int, Connection]:
        """Every open connection, by descriptor."""
        return self.transport.connections

    def _pet_watchdog(self, now: float) -> None:
        if self.notifier.watchdog_s is not None:
            self.notifier.notify("WATCHDOG=1")
            self._watchdog_at = now + self.notifier.watchdog_s

    def _on_time(self, now: float) -> None:
        if self.transport.held:
            self.transport.release_held()
        if self._watchdog_at is not None and now >= self._watchdog_at:
            self._pet_watchdog(now)
        if self._trim.take(now):
            self.transport.freed = 0
            give_back_memory()
        if self._accept_resume_at is not None and now >= self._accept_resume_at:
            self._resume_accepting()
        waiting = self._awaiting_hello
        while waiting:
            connection, deadline = next(iter(waiting.items()))
            if deadline > now:
                break
            del waiting[connection]
            self.transport.fatal(connection, f"no hello within {self.hello_timeout_s:g} s")
        if self.limits.idle_timeout_s > 0 and now >= self._next_idle_scan:
            self._next_idle_scan = now + _IDLE_SCAN_S
            idle_since = now - self.limits.idle_timeout_s
            for connection in list(self.transport.connections.values()):
                if self._holds_nothing(connection) and connection.last_active < idle_since:
                    self.stats.closed_idle += 1
                    self.transport.fatal(connection, f"idle for {self.limits.idle_timeout_s:g} s")

    def _holds_nothing(self, connection: Connection) -> bool:
        """True for a connection with no live request and no model in the service."""
        manager = connection.manager
        return manager is None or self.service.backend.holdings(manager) == (0, 0)

    # Accepting --------------------------------------------------------------------------

    def _accept(self, listener: Any, _: int) -> None:
        """Accept at most `ACCEPTS_PER_TURN` connections, then serve a turn: a storm of
        connections waits its turn like any client's frames."""
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, _address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    self._pause_accepting(exc)
                else:
                    self._log.warning("accept failed: %s", exc)
                return
            try:
                self._admit(sock)
            except Exception as exc:
                self.stats.internal_errors += 1
                self._log.warning("admitting a connection failed: %r", exc)
                sock.close()

    def _admit(self, sock: socket.socket) -> None:
        try:
            peer = peer_credentials(sock)
        except OSError as exc:
            self._log.warning("no credentials for a new connection (%s); closing it", exc)
            sock.close()
            return
        management = self.calls.may_manage(peer)
        if not self.admission.admit(sock, peer, management, len(self.transport.connections)):
            return
        sock.setblocking(False)
        now = time.monotonic()
        connection = Connection(
            self.transport, sock, peer, usage=self.usage, management=management, now=now
        )
        self.transport.add(connection)
        self._awaiting_hello[connection] = now + self.hello_timeout_s
        self.stats.accepted += 1
        self._info.changed()

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of descriptors: stop accepting for a moment instead of spinning on accept."""
        assert self._binding is not None
        self._selector.unregister(self._binding.listener)
        self._accept_resume_at = time.monotonic() + _ACCEPT_PAUSE_S
        self.stats.accept_pauses += 1
        self._log.warning(
            "cannot accept connections (%s); %d open, trying again in %g s",
            exc.strerror,
            len(self.transport.connections),
            _ACCEPT_PAUSE_S,
        )

    def _resume_accepting(self) -> None:
        self._accept_resume_at = None
        if self._binding is not None:
            self._selector.register(self._binding.listener, selectors.EVENT_READ, self._accept)

    # Info -------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The service's snapshot with the daemon's own: socket, counters, limits, clients."""
        return describe_daemon(self, self._log.suppressed, self._info.renewals)

    def _host_pids(self) -> list[int]:
        """The model hosts' pids; called from the device-user scan's threads too, so the
        connections are copied first (in one step) while the loop may change them."""
        connections = list(self.transport.connections.values())
        return [pid for c in connections if (pid := getattr(c.host, "pid", None)) is not None]

    # Shutdown ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Complete every live request, tell the clients within a bound, close everything."""
        self.notifier.notify("STOPPING=1", "STATUS=completing live requests")
        self.importance.close()
        self.device_users.close()
        dropped, running = self.inference.close()
        self.abandoned_load = running
        if dropped or running:
            log.info(
                "stopping with %d queued model load%s dropped%s",
                dropped,
                "" if dropped == 1 else "s",
                "; the load in progress is not waited for" if running else "",
            )
        try:
            self.service.close()
        except Exception:
            log.exception("closing the service failed")
        self._turn()
        self.transport.flush_all()
        for connection in list(self.transport.connections.values()):
            connection.manager = None  # the service is closed; nothing more to tell it
            self.transport.drop(connection)
        if self._binding is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self._binding.listener)
            self._binding.close()
            self._binding = None
        self._selector.close()
        if threading.current_thread() is threading.main_thread():
            previous = signal.set_wakeup_fd(-1)
            if previous not in (-1, self._wake_w):  # someone else's: put it back
                signal.set_wakeup_fd(previous)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.notifier.close()


__all__ = ["Daemon", "DaemonLimits", "DaemonStats"]
