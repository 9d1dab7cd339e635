"""Built-in telemetry sinks, registered through the same hook as any third party's.

`jsonl`, `perfetto` and `memory` are always there. `prometheus` needs the extra of that
name (prometheus-client); without it nothing is registered and the reason is logged at
info level, as an absent optional plugin is no problem. Factories import their module on
first use, so discovery stays cheap.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from npumanager.core.plugins.hookspecs import hookimpl
from npumanager.errors import NpuManagerError
from npumanager.schemas import SinkRecord

log = logging.getLogger(__name__)

PROMETHEUS_EXTRA_HINT = "pip install 'npu-manager[prometheus]'"


class MemorySink:
    """Keeps every event it is handed, in order; for tests and notebooks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[object] = []
        self.batches = 0
        self.closed = False

    def handle(self, batch: Sequence[object]) -> None:
        """Append one batch of events."""
        with self._lock:
            self._events.extend(batch)
            self.batches += 1

    def close(self) -> None:
        """Mark the sink closed; its events stay readable."""
        self.closed = True

    @property
    def events(self) -> list[object]:
        """A copy of every event received so far."""
        with self._lock:
            return list(self._events)


def prometheus_available() -> bool:
    """True if prometheus-client can be imported."""
    try:
        return importlib.util.find_spec("prometheus_client") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["prometheus_client"] is None
        return False


def _jsonl(**options: Any) -> Any:
    from npumanager.telemetry.jsonl import JsonlSink

    return JsonlSink(**options)


def _perfetto(**options: Any) -> Any:
    from npumanager.telemetry.perfetto import PerfettoSink

    return PerfettoSink(**options)


def _prometheus(**options: Any) -> Any:
    from npumanager.telemetry.prometheus import PrometheusSink

    return PrometheusSink(**options)


_OPTIONS: dict[object, tuple[str, ...]] = {
    MemorySink: (),
    _jsonl: ("path", "max_bytes", "backup_count"),
    _perfetto: ("path",),
    _prometheus: ("port", "addr"),
}
"""The options a user may give each built-in sink (`--sink NAME:KEY=VALUE`)."""


def sink_options(factory: Callable[..., Any]) -> tuple[str, ...] | None:
    """The keyword options a sink factory takes, or None if it takes any (`**options`)."""
    if factory in _OPTIONS:
        return _OPTIONS[factory]
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return tuple(p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def check_sink_options(
    name: str, factory: Callable[..., Any], options: Mapping[str, Any], also: Sequence[str] = ()
) -> None:
    """A one-line error naming an option the sink does not take, and the ones it does; `also`
    are options every sink takes (the hub's)."""
    own = sink_options(factory)
    if own is None:
        return
    allowed = (*own, *also)
    for key in options:
        if key not in allowed:
            choices = ", ".join(allowed) or "none"
            raise NpuManagerError(f"sink {name!r}: unknown option {key!r}; allowed: {choices}")


@hookimpl
def npumanager_register_sinks() -> Iterable[SinkRecord]:
    """The sinks that ship with npu-manager."""
    records = [
        SinkRecord(name="memory", factory=MemorySink, description="keeps events in memory"),
        SinkRecord(
            name="jsonl",
            factory=_jsonl,
            description="JSON lines in the user log directory, rotated by size",
        ),
        SinkRecord(
            name="perfetto",
            factory=_perfetto,
            description="a Chrome trace-event JSON file for ui.perfetto.dev",
        ),
    ]
    if prometheus_available():
        records.append(
            SinkRecord(
                name="prometheus",
                factory=_prometheus,
                description="Prometheus metrics, served on a port you choose",
            )
        )
    else:
        log.info(
            "sink 'prometheus' not registered: prometheus-client is not installed (%s)",
            PROMETHEUS_EXTRA_HINT,
        )
    return records


@hookimpl
def npumanager_unavailable() -> Iterable[tuple[str, str, str]]:
    """The `prometheus` sink, when its extra is not installed, and how to install it."""
    return [] if prometheus_available() else [("sink", "prometheus", PROMETHEUS_EXTRA_HINT)]
