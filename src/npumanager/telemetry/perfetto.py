"""The `perfetto` sink: a Chrome trace-event JSON file that ui.perfetto.dev opens.

Layout: a process per device with a thread per channel lane (see `slices`), where every
stretch of a work item's execution is a complete ("X") slice carrying uid, original uid,
job and effective priority and work id; a "thermal" thread with an instant at every
severity change; counters for used weight memory, temperature and busy channels. A
"model loads" process has a thread per uid with an instant for every step of its
requests (requested, CAN_LOAD_NOW, LOADED, UNLOAD_REQUESTED with its reason, ...).

Several sinks can share one file (`write_trace`): give each a `label` and its own
`pid_base`, e.g. the demo's direct and managed runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from npumanager.checks import check_int
from npumanager.core.driver.events import WorkEvent
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import EndReason, StartReason, ThermalSeverity, UnloadReason
from npumanager.schemas.limits import MAX_DEVICES
from npumanager.telemetry.base import EventSink, no_name
from npumanager.telemetry.events import (
    NO_VALUE,
    DeviceSample,
    ModelLoadRequested,
    ModelLoadState,
    ModelLoadStateChanged,
)
from npumanager.telemetry.paths import writable_file
from npumanager.telemetry.slices import Slice, SliceBuilder

log = logging.getLogger(__name__)

THERMAL_TID = 1 << 20
"""The thread id of a device's thermal track, above any lane."""
PIDS_PER_SINK = MAX_DEVICES + 1
"""Process ids one sink uses from its `pid_base`: the model-load process, then a device each."""
_RUNNING_AT_END = "RUNNING_AT_END"
_START_NAMES = {member.value: member.name for member in StartReason}
_END_NAMES = {member.value: member.name for member in EndReason}
_SEVERITY_NAMES = {member.value: member.name for member in ThermalSeverity}


def _meta(name: str, pid: int, tid: int | None, value: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": {}}
    if tid is not None:
        event["tid"] = tid
    key = "sort_index" if name.endswith("sort_index") else "name"
    event["args"][key] = value
    return event


class PerfettoSink(EventSink):
    """Builds a trace from the events; writes it to `path` (if given) on close."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        label: str = "",
        pid_base: int = 0,
        names: Mapping[int, str] | None = None,
    ) -> None:
        if path is not None and not isinstance(path, str | Path):
            raise IllegalArgumentError(f"path must be a str or a Path; got {path!r}")
        if not isinstance(label, str):
            raise IllegalArgumentError(f"label must be a str; got {label!r}")
        self.path = (
            None if path is None else writable_file(Path(path), "sink 'perfetto'", create=False)
        )
        self.label = label
        self.pid_base = check_int("pid_base", pid_base, 0, 1 << 30)
        self.names = dict(names or {})
        """A name for each uid, for slices and tracks (default: the work's feature id)."""
        self.uid_names: Callable[[int], str | None] = no_name
        """The service's names for uids (a daemon's app ids), after `names`."""
        self._prefix = f"{label}: " if label else ""
        self._slices = SliceBuilder()
        self._events: list[dict[str, Any]] = []
        self._meta: dict[tuple[str, int, int | None], dict[str, Any]] = {}
        self._severity: dict[int, int] = {}
        self._last_us = 0
        self._closed = False

    # Receiving --------------------------------------------------------------------------

    def _name(self, uid: int) -> str | None:
        return self.names.get(uid) or self.uid_names(uid)

    def on_work(self, event: WorkEvent) -> None:
        """A slice closes at every ENDED of a started item."""
        self._last_us = max(self._last_us, event.time_us)
        closed = self._slices.feed(event)
        if closed is not None:
            self._slice(closed.device, closed.lane, closed.start, closed.end.time_us, closed)

    def _slice(
        self, device: int, lane: int, start: WorkEvent, end_us: int, closed: Slice | None
    ) -> None:
        pid = self._device_pid(device)
        tid = lane + 1
        self._thread(pid, tid, f"channel lane {lane}")
        end = _END_NAMES[closed.end.reason] if closed is not None else _RUNNING_AT_END
        self._events.append(
            {
                "ph": "X",
                "cat": "work",
                "name": self._work_name(start),
                "pid": pid,
                "tid": tid,
                "ts": start.time_us,
                "dur": end_us - start.time_us,
                "args": {
                    "work_id": start.id,
                    "uid": start.uid,
                    "original_uid": start.original_uid,
                    "job_priority": start.job_priority,
                    "effective_priority": start.effective_priority,
                    "start": _START_NAMES[start.reason],
                    "end": end,
                },
            }
        )

    def on_device_sample(self, sample: DeviceSample) -> None:
        """Counters, and an instant where the severity changed."""
        self._last_us = max(self._last_us, sample.time_us)
        pid = self._device_pid(sample.device)
        ts = sample.time_us
        self._events.append(
            self._counter(pid, ts, "weight memory used (bytes)", sample.weight_memory_used_bytes)
        )
        self._events.append(self._counter(pid, ts, "temperature (C)", sample.temperature_mc / 1000))
        self._events.append(self._counter(pid, ts, "busy channels", sample.busy_channels))
        before = self._severity.get(sample.device, ThermalSeverity.NONE)
        if sample.severity != before:
            self._severity[sample.device] = sample.severity
            self._thread(pid, THERMAL_TID, "thermal")
            self._events.append(
                {
                    "ph": "i",
                    "s": "t",
                    "cat": "thermal",
                    "name": f"thermal {_SEVERITY_NAMES[sample.severity]}",
                    "pid": pid,
                    "tid": THERMAL_TID,
                    "ts": ts,
                    "args": {
                        "from": _SEVERITY_NAMES[before],
                        "temperature_c": sample.temperature_mc / 1000,
                    },
                }
            )

    @staticmethod
    def _counter(pid: int, ts: int, name: str, value: float) -> dict[str, Any]:
        return {"ph": "C", "name": name, "pid": pid, "ts": ts, "args": {"value": value}}

    def on_model_load_requested(self, event: ModelLoadRequested) -> None:
        """An instant on the uid's track."""
        self._model(event)

    def on_model_load_state_changed(self, event: ModelLoadStateChanged) -> None:
        """An instant on the uid's track, named by the state (and the unload reason)."""
        self._model(event)

    def _model(self, event: ModelLoadRequested | ModelLoadStateChanged) -> None:
        self._last_us = max(self._last_us, event.time_us)
        pid = self._models_pid()
        tid = event.uid
        self._thread(pid, tid, self._name(event.uid) or f"uid {event.uid}")
        args: dict[str, Any] = {"request_id": event.request_id, "client": event.client}
        if isinstance(event, ModelLoadRequested):
            name = "requested"
            if event.weight_bytes != NO_VALUE:
                args["weight_bytes"] = event.weight_bytes
        else:
            name = ModelLoadState(event.state).name
            if event.unload_reason != NO_VALUE:
                reason = UnloadReason(event.unload_reason).name
                args["unload_reason"] = reason
                name = f"{name} ({reason})"
            if event.device != NO_VALUE:
                args["device"] = event.device
        self._events.append(
            {
                "ph": "i",
                "s": "t",
                "cat": "model",
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": event.time_us,
                "args": args,
            }
        )

    # Tracks -------------------------------------------------------------------------------

    def _models_pid(self) -> int:
        pid = self.pid_base + 1
        self._process(pid, "model loads")
        return pid

    def _device_pid(self, device: int) -> int:
        pid = self.pid_base + 2 + device
        self._process(pid, f"npu{device}")
        return pid

    def _process(self, pid: int, name: str) -> None:
        if ("process_name", pid, None) not in self._meta:
            self._meta["process_name", pid, None] = _meta(
                "process_name", pid, None, self._prefix + name
            )
            self._meta["process_sort_index", pid, None] = _meta(
                "process_sort_index", pid, None, pid
            )

    def _thread(self, pid: int, tid: int, name: str) -> None:
        if ("thread_name", pid, tid) not in self._meta:
            self._meta["thread_name", pid, tid] = _meta("thread_name", pid, tid, name)
            self._meta["thread_sort_index", pid, tid] = _meta("thread_sort_index", pid, tid, tid)

    def _work_name(self, start: WorkEvent) -> str:
        name = self._name(start.uid) or start.debug_feature_id
        return name or f"uid {start.uid}"

    # Output -------------------------------------------------------------------------------

    @property
    def trace_events(self) -> list[dict[str, Any]]:
        """Metadata first, then every event in time order."""
        timed = sorted(self._events, key=lambda event: event["ts"])
        return [*self._meta.values(), *timed]

    def document(self) -> dict[str, Any]:
        """The whole trace as the trace-event JSON object."""
        return trace_document([self])

    def close(self) -> None:
        """End the slices still open at the last time seen, and write the file if a path is set."""
        if self._closed:
            return
        self._closed = True
        for device, lane, start in self._slices.open_slices():
            self._slice(device, lane, start, max(self._last_us, start.time_us), None)
        if self.path is not None:
            try:
                write_trace(self.path, [self])
            except OSError as exc:
                log.warning("sink 'perfetto': cannot write %s: %s", self.path, exc.strerror or exc)


def trace_document(sinks: Iterable[PerfettoSink]) -> dict[str, Any]:
    """One trace-event JSON object holding the events of several sinks."""
    events = [event for sink in sinks for event in sink.trace_events]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, sinks: Iterable[PerfettoSink]) -> None:
    """Write one trace file from one or more sinks."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(trace_document(sinks), separators=(",", ":"))
    target.write_text(text, encoding="utf-8")
