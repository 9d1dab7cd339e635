"""The `prometheus` sink (extra `prometheus`): metrics in a registry of its own, served over HTTP.

Metrics: `npu_work_events_total{kind,reason}`; `npu_work_duration_seconds`, the time
from a work item's REQUESTED (else its first STARTED) to its final ENDED, by end reason;
`npu_model_load_requests_total{status}`, every request (`requested`) and every step it
took (`can_load_now`, `loaded`, `unload_requested`, ...); and, by device,
`npu_weight_memory_bytes`, `npu_weight_memory_capacity_bytes`, `npu_temperature_celsius`,
`npu_throttling_severity` and `npu_busy_channels`. A daemon adds the processes that use the
accelerator without the manager, by app, as a scrape finds them: `npu_device_users{app}` (their
DRM clients), `npu_device_user_resident_bytes{app}` and
`npu_device_user_engine_busy_seconds_total{app,engine}` (it falls when one of the app's
processes ends, which `rate()` takes for a reset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from npumanager.apps.device_users import distinct_clients
from npumanager.checks import check_int
from npumanager.core.driver.events import NO_REASON, EventKind, WorkEvent
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import EndReason, StartReason
from npumanager.schemas.limits import WORK_DURATION_BUCKETS_S
from npumanager.telemetry.base import EventSink, no_name, no_users
from npumanager.telemetry.events import (
    DeviceSample,
    ModelLoadRequested,
    ModelLoadState,
    ModelLoadStateChanged,
    TelemetryEvent,
)

if TYPE_CHECKING:
    from npumanager.apps.device_users import DeviceUser

_US_PER_S = 1_000_000
_NS_PER_S = 1e9


def _labels(enum: Any) -> dict[int, str]:
    return {member.value: member.name.lower() for member in enum}


class PrometheusSink(EventSink):
    """Counts and gauges from the events; `exposition()` gives the text a scrape would."""

    def __init__(self, port: int | None = None, *, addr: str = "127.0.0.1") -> None:
        if not isinstance(addr, str):
            raise IllegalArgumentError(f"addr must be a str; got {addr!r}")
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.work_events = Counter(
            "npu_work_events", "Work lifecycle events", ["kind", "reason", "app"], registry=r
        )
        self.uid_names: Callable[[int], str | None] = no_name
        """The service's names for uids: a daemon's app ids (else `uid:<uid>`)."""
        self.work_duration = Histogram(
            "npu_work_duration_seconds",
            "From a work item's request to its final end",
            ["reason"],
            buckets=WORK_DURATION_BUCKETS_S,
            registry=r,
        )
        self.model_loads = Counter(
            "npu_model_load_requests",
            "Model-load requests and their steps",
            ["status"],
            registry=r,
        )
        self.memory = Gauge("npu_weight_memory_bytes", "Weight memory used", ["device"], registry=r)
        self.capacity = Gauge(
            "npu_weight_memory_capacity_bytes", "Weight memory capacity", ["device"], registry=r
        )
        self.temperature = Gauge(
            "npu_temperature_celsius", "Device temperature", ["device"], registry=r
        )
        self.severity = Gauge(
            "npu_throttling_severity",
            "Thermal throttling severity, 0 (NONE) to 6 (SHUTDOWN)",
            ["device"],
            registry=r,
        )
        self.busy = Gauge("npu_busy_channels", "Channels running work", ["device"], registry=r)
        self.device_users: Callable[[], Sequence[DeviceUser]] = no_users
        """The accelerator's users outside the manager (a daemon's scan), read at each scrape."""
        r.register(_DeviceUsersCollector(self))
        self._kinds = _labels(EventKind)
        self._starts = _labels(StartReason)
        self._ends = _labels(EndReason)
        self._states = _labels(ModelLoadState)
        self._began: dict[int, int] = {}
        self._children: dict[tuple[Any, ...], Any] = {}
        self._counts: dict[Any, int] = {}
        self._samples: dict[int, DeviceSample] = {}
        """Labelled metrics by (metric, labels...): `labels()` is too dear per event."""
        self._server: Any = None
        self.port: int | None = None
        """The port the metrics are served on (the one bound when 0 was asked), or None."""
        if port is not None:
            port = check_int("port", port, 0, 65535)
            self._server, _ = start_http_server(port, addr=addr, registry=self.registry)
            self.port = int(self._server.server_port)

    def handle(self, batch: Sequence[TelemetryEvent]) -> None:
        """Count the batch, then update each metric once per label set it touched."""
        super().handle(batch)
        if self._counts:
            counts, self._counts = self._counts, {}
            for child, amount in counts.items():
                child.inc(amount)
        if self._samples:
            samples, self._samples = self._samples, {}
            for sample in samples.values():
                device = str(sample.device)
                self._child(self.memory, device).set(sample.weight_memory_used_bytes)
                self._child(self.capacity, device).set(sample.weight_memory_bytes)
                self._child(self.temperature, device).set(sample.temperature_mc / 1000)
                self._child(self.severity, device).set(sample.severity)
                self._child(self.busy, device).set(sample.busy_channels)

    def _count(self, metric: Any, *labels: str) -> None:
        child = self._child(metric, *labels)
        self._counts[child] = self._counts.get(child, 0) + 1

    def on_model_load_requested(self, event: ModelLoadRequested) -> None:
        """Counted as status `requested`."""
        self._count(self.model_loads, "requested")

    def on_model_load_state_changed(self, event: ModelLoadStateChanged) -> None:
        """Counted under the state's name."""
        self._count(self.model_loads, self._states[event.state])

    def on_work(self, event: WorkEvent) -> None:
        """Counted by kind and reason; a final ENDED also gives a duration."""
        kind = event.kind
        if kind == EventKind.REQUESTED:
            reason = "none"
            self._began[event.id] = event.time_us
        elif kind == EventKind.STARTED:
            reason = self._starts[event.reason]
            self._began.setdefault(event.id, event.time_us)
        else:
            reason = self._ends[event.reason] if event.reason != NO_REASON else "none"
            if event.reason != EndReason.PAUSED:
                began = self._began.pop(event.id, None)
                if began is not None:
                    seconds = (event.time_us - began) / _US_PER_S
                    self._child(self.work_duration, reason).observe(seconds)
        app = self.uid_names(event.uid) or f"uid:{event.uid}"
        self._count(self.work_events, self._kinds[kind], reason, app)

    def on_device_sample(self, sample: DeviceSample) -> None:
        """Only a batch's last sample of each device sets the gauges."""
        self._samples[sample.device] = sample

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def exposition(self) -> str:
        """The Prometheus text format of every metric now."""
        return generate_latest(self.registry).decode("utf-8")

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _DeviceUsersCollector:
    """The device's users outside the manager, summed by app when a scrape asks."""

    def __init__(self, sink: PrometheusSink) -> None:
        self._sink = sink  # its `device_users` is replaced when the sink is added

    def describe(self) -> list[Metric]:
        return []  # what a scrape finds varies; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        clients = GaugeMetricFamily(
            "npu_device_users",
            "DRM clients of the accelerator held by processes outside the manager",
            labels=["app"],
        )
        resident = GaugeMetricFamily(
            "npu_device_user_resident_bytes",
            "Device memory resident for processes outside the manager",
            labels=["app"],
        )
        busy = CounterMetricFamily(
            "npu_device_user_engine_busy_seconds",
            "Engine time spent on the work of processes outside the manager",
            labels=["app", "engine"],
        )
        counts: dict[str, int] = {}
        memory: dict[str, int] = {}
        engines: dict[tuple[str, str], int] = {}
        for user in distinct_clients(self._sink.device_users()):
            app = user.app_id
            counts[app] = counts.get(app, 0) + 1
            memory[app] = memory.get(app, 0) + user.resident_bytes()
            for engine, ns in user.engines.items():
                engines[app, engine] = engines.get((app, engine), 0) + ns
        for app, count in sorted(counts.items()):
            clients.add_metric([app], count)
            resident.add_metric([app], memory[app])
        for (app, engine), ns in sorted(engines.items()):
            busy.add_metric([app, engine], ns / _NS_PER_S)
        yield from (clients, resident, busy)
