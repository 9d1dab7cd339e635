"""Delivery to telemetry sinks: debounced per registration, queued, never in the arbiter's way.

Each registered sink gets a `SinkHandle`: its own `Debouncer` (the one in front of the HAL
callback) for work events, a bounded queue, and counters. Inline handles (virtual time)
hand batches over at the step boundaries the owner marks with `drain()`, and at once when
the queue is full, so a simulation loses nothing and stays deterministic. Threaded handles
(real time) have a worker thread each; a batch that does not fit the queue is dropped and
counted, so a slow sink only loses its own events.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from npumanager.checks import check_int
from npumanager.core.driver.debounce import Debouncer
from npumanager.core.driver.events import WorkEvent
from npumanager.errors import IllegalArgumentError
from npumanager.schemas.limits import MAX_DEBOUNCE_DURATION_MS, MAX_SINK_QUEUE_EVENTS
from npumanager.telemetry.base import LateBound, no_name, no_users
from npumanager.telemetry.events import TelemetryEvent

log = logging.getLogger(__name__)

Batch = Sequence[TelemetryEvent]


@runtime_checkable
class Sink(Protocol):
    """What a sink object offers: ``handle(batch)``; a ``close()`` is called too if it has one."""

    def handle(self, batch: Batch) -> None:
        """Take one batch of events, in order; the batch is shared, do not modify it."""


class SinkStats(NamedTuple):
    """What happened to one sink's events, counted in events."""

    delivered: int
    """Handed to ``handle()``, which returned."""
    dropped: int
    """Never handed over: the queue was full, or the sink was stuck at close."""
    failed: int
    """Handed to ``handle()``, which raised."""
    queued: int
    """Waiting in the queue now."""


class SinkHandle:
    """One registration of a sink: its debouncer, its queue, its counters."""

    def __init__(self, name: str, sink: Any, debounce_duration_ms: int, queue_size: int) -> None:
        self.name = name
        self.sink = sink
        self.debounce_duration_ms = debounce_duration_ms
        self.queue_size = queue_size
        self.debouncer = Debouncer(debounce_duration_ms) if debounce_duration_ms else None
        self.delivered = 0
        self.dropped = 0
        self.failed = 0
        self._handle = sink.handle
        self._reported = False

    def stats(self) -> SinkStats:
        """The counters now."""
        return SinkStats(self.delivered, self.dropped, self.failed, self.queued)

    @property
    def queued(self) -> int:
        """Events waiting to be handed over."""
        raise NotImplementedError

    def put(self, batch: Batch) -> None:
        """Queue a batch for the sink."""
        raise NotImplementedError

    def drain(self) -> None:
        """Hand everything queued over now, if this handle delivers inline."""

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued, then close the sink (if it has `close`)."""
        raise NotImplementedError

    def _deliver(self, batches: list[Batch]) -> None:
        batch = batches[0] if len(batches) == 1 else list(itertools.chain.from_iterable(batches))
        try:
            self._handle(batch)
        except Exception:
            self.failed += len(batch)
            if not self._reported:
                self._reported = True
                log.exception("sink %r raised; its events are counted as failed", self.name)
            else:
                log.debug("sink %r raised again", self.name, exc_info=True)
        else:
            self.delivered += len(batch)

    def _close_sink(self) -> None:
        close = getattr(self.sink, "close", None)
        if not callable(close):
            return
        try:
            close()
        except Exception:
            log.exception("sink %r raised while closing", self.name)


class _InlineHandle(SinkHandle):
    """Delivers on the caller's thread at `drain()` or when the queue fills: nothing lost."""

    def __init__(self, name: str, sink: Any, debounce_duration_ms: int, queue_size: int) -> None:
        super().__init__(name, sink, debounce_duration_ms, queue_size)
        self._lock = threading.Lock()
        self._delivering = threading.Lock()
        self._pending: list[Batch] = []
        self._count = 0

    @property
    def queued(self) -> int:
        return self._count

    def put(self, batch: Batch) -> None:
        with self._lock:
            self._pending.append(batch)
            self._count += len(batch)
            full = self._count >= self.queue_size
        if full:
            self.drain()

    def drain(self) -> None:
        if not self._pending:
            return
        with self._delivering:
            with self._lock:
                batches, self._pending, self._count = self._pending, [], 0
            if batches:
                self._deliver(batches)

    def close(self, timeout_s: float) -> None:
        self.drain()
        self._close_sink()


class _ThreadedHandle(SinkHandle):
    """A worker thread per sink; a batch that does not fit the bounded queue is dropped."""

    def __init__(self, name: str, sink: Any, debounce_duration_ms: int, queue_size: int) -> None:
        super().__init__(name, sink, debounce_duration_ms, queue_size)
        self._cond = threading.Condition()
        self._queue: deque[Batch] = deque()
        self._count = 0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"npu-sink-{name}", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._count

    def put(self, batch: Batch) -> None:
        with self._cond:
            if self._closing or self._count + len(batch) > self.queue_size:
                self.dropped += len(batch)
                return
            self._queue.append(batch)
            self._count += len(batch)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                batches = list(self._queue)
                self._queue.clear()
                self._count = 0
            self._deliver(batches)

    def close(self, timeout_s: float) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self._cond:
                self.dropped += self._count
                self._queue.clear()
                self._count = 0
            log.warning("sink %r did not finish within %s s; it is left open", self.name, timeout_s)
            return
        self._close_sink()


class TelemetryHub:
    """Every sink of one service (or one simulation run), and the routes to them."""

    def __init__(self, *, threaded: bool, close_timeout_s: float) -> None:
        self.threaded = threaded
        self.close_timeout_s = close_timeout_s
        self._handles: list[SinkHandle] = []
        self._debouncing: list[SinkHandle] = []
        self._dirty = False
        self.uid_names = LateBound(no_name)
        """Given to each sink that has a ``uid_names`` attribute."""
        self.device_users = LateBound(no_users)
        """Given to each sink that has a ``device_users`` attribute."""

    def __bool__(self) -> bool:
        return bool(self._handles)

    @property
    def debouncing(self) -> bool:
        """True if some sink holds work events back: `step()` must then be called."""
        return bool(self._debouncing)

    @staticmethod
    def check_options(debounce_duration_ms: int, queue_size: int) -> tuple[int, int]:
        """The registration options, checked: a window in ms (0 = raw) and a queue size."""
        window = check_int(
            "debounce_duration_ms", debounce_duration_ms, 0, MAX_DEBOUNCE_DURATION_MS
        )
        return window, check_int("queue_size", queue_size, 1, MAX_SINK_QUEUE_EVENTS)

    def add(
        self, sink: Any, *, name: str, debounce_duration_ms: int, queue_size: int
    ) -> SinkHandle:
        """Register a sink object; the name is made unique with a `#N` suffix if taken."""
        if not callable(getattr(sink, "handle", None)):
            raise IllegalArgumentError(
                f"a sink must have a handle(batch) method; got {type(sink).__name__}"
            )
        window, size = self.check_options(debounce_duration_ms, queue_size)
        if hasattr(sink, "uid_names"):
            sink.uid_names = self.uid_names
        if hasattr(sink, "device_users"):
            sink.device_users = self.device_users
        taken = {handle.name for handle in self._handles}
        unique = name
        for n in itertools.count(2):
            if unique not in taken:
                break
            unique = f"{name}#{n}"
        kind = _ThreadedHandle if self.threaded else _InlineHandle
        handle = kind(unique, sink, window, size)
        self._handles = [*self._handles, handle]
        if handle.debouncer is not None:
            self._debouncing = [*self._debouncing, handle]
        return handle

    def remove(self, handle: SinkHandle) -> None:
        """Deliver what the sink still has coming, close it and forget it."""
        if handle not in self._handles:
            raise IllegalArgumentError(f"sink {handle.name!r} is not registered here")
        self._handles = [h for h in self._handles if h is not handle]
        self._debouncing = [h for h in self._debouncing if h is not handle]
        self._finish(handle)

    def publish_work(self, events: Sequence[WorkEvent]) -> None:
        """Raw work events in time order: each sink gets them through its own debouncer."""
        self._dirty = True
        for handle in self._handles:
            debouncer = handle.debouncer
            if debouncer is None:
                handle.put(events)
            else:
                out = debouncer.feed(events)
                if out:
                    handle.put(out)

    def publish(self, events: Batch) -> None:
        """Events that are not debounced (model loads, device samples), to every sink."""
        self._dirty = True
        for handle in self._handles:
            handle.put(events)

    def step(self, now_us: int) -> None:
        """Time has reached `now_us`: release held work events that are due."""
        for handle in self._debouncing:
            debouncer = handle.debouncer
            assert debouncer is not None
            due = debouncer.next_due_us()
            if due is not None and due <= now_us:
                self._dirty = True
                handle.put(debouncer.flush_due(now_us))

    def drain(self) -> None:
        """A step boundary: inline handles deliver what they hold."""
        if not self._dirty:
            return
        self._dirty = False
        for handle in self._handles:
            handle.drain()

    def stats(self) -> dict[str, SinkStats]:
        """Delivered, dropped, failed and queued events of every sink, by name."""
        return {handle.name: handle.stats() for handle in self._handles}

    def close(self) -> None:
        """Release every held event, deliver everything, close every sink."""
        handles, self._handles, self._debouncing = self._handles, [], []
        for handle in handles:
            self._finish(handle)

    def _finish(self, handle: SinkHandle) -> None:
        if handle.debouncer is not None:
            held = handle.debouncer.flush_all()
            if held:
                handle.put(held)
        handle.close(self.close_timeout_s)
