"""The vnpu engine: the simulated NPU of `reference.engine`, in C (`csrc/vnpu.c`) behind cffi.

Group and feature ids are interned here and cross the boundary as int32 indices (-1 for
None); events come back in batches of int64 records that `struct.iter_unpack` turns into
`WorkEvent` tuples. On the real clock the C side runs one worker thread per device.
"""

from __future__ import annotations

import functools
import gc
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from npumanager.core.driver.events import WorkEvent
from npumanager.core.driver.job import Arrivals, Job
from npumanager.errors import (
    CapacityError,
    DriverClosedError,
    IllegalArgumentError,
    UnknownDeviceError,
    UnknownModelError,
    UnknownWorkError,
)
from npumanager.schemas import EndReason, SchedulingConfig, ThermalSeverity
from npumanager.schemas.device import DeviceSpec, DeviceStatus, Scheduler
from npumanager.schemas.limits import (
    DEFAULT_EVENT_RING,
    INT64_MAX,
    MAX_PRIORITY,
    MIN_PRIORITY,
    UNKNOWN_UID_PRIORITY,
)
from npumanager.vendor_drivers.simulated import Engine
from npumanager.vendor_drivers.vnpu._vnpu import ffi, lib

EVENT_FORMAT = "=14q"
"""One `vnpu_event` record: 14 native int64 fields in `WorkEvent` order."""
EVENT_SIZE = struct.calcsize(EVENT_FORMAT)
DRAIN_BATCH = 4096
"""Events moved per `vnpu_drain` call."""
COMPACT_INTERNED = 4096
"""Interned group/feature ids beyond which the tables are cleared whenever it is safe."""
NEVER = lib.VNPU_NEVER
"""The engine's time horizon: no event point happens at or after it."""
COUNTERS = tuple(name for name, _ in ffi.typeof("vnpu_counters").fields)

_new = tuple.__new__


def spec_problem(spec: DeviceSpec) -> str | None:
    """Why the C engine cannot simulate `spec` exactly (a value its int64 math cannot
    carry), or None."""
    thermal = spec.thermal
    bounds: list[tuple[str, int, int, int]] = [
        ("sram_bytes", spec.sram_bytes, 1, lib.VNPU_MAX_SRAM_BYTES),
        ("weight_memory_bytes", spec.weight_memory_bytes, 1, INT64_MAX),
        ("slice_us", spec.slice_us, 1, lib.VNPU_MAX_SPAN_US),
        ("thermal.tick_us", thermal.tick_us, 1, lib.VNPU_MAX_SPAN_US),
        ("thermal.ambient_mc", thermal.ambient_mc, -lib.VNPU_MAX_SPEC_MC, lib.VNPU_MAX_SPEC_MC),
        (
            "thermal.heat_per_busy_channel_mc",
            thermal.heat_per_busy_channel_mc,
            0,
            lib.VNPU_MAX_SPEC_MC,
        ),
    ]
    bounds += [
        (f"thermal.thresholds_mc[{i}]", t, -lib.VNPU_MAX_SPEC_MC, lib.VNPU_MAX_SPEC_MC)
        for i, t in enumerate(thermal.thresholds_mc)
    ]
    for name, value, low, high in bounds:
        if not low <= value <= high:
            return f"{name} must be within {low}..{high} for the vnpu engine; got {value}"
    return None


def _c_specs(specs: Sequence[DeviceSpec]) -> Any:
    out = ffi.new("vnpu_spec[]", len(specs))
    for n, spec in enumerate(specs):
        problem = spec_problem(spec)
        if problem is not None:
            raise IllegalArgumentError(f"device {n}: {problem}")
        c, thermal = out[n], spec.thermal
        c.channels = spec.channels
        c.scheduler = (
            lib.VNPU_SCHED_FAIR if spec.scheduler == Scheduler.FAIR else lib.VNPU_SCHED_STRICT
        )
        c.nbands = len(spec.bands)
        c.band_first = [band.first_priority for band in spec.bands]
        c.floor_percent = spec.floor_percent
        c.floor_window_us = spec.floor_window_us
        c.sram_bytes = spec.sram_bytes
        c.weight_memory_bytes = spec.weight_memory_bytes
        c.clock_mhz = spec.clock_mhz
        c.slice_us = spec.slice_us
        c.ambient_mc = thermal.ambient_mc
        c.tick_us = thermal.tick_us
        c.heat_per_busy_channel_mc = thermal.heat_per_busy_channel_mc
        c.cooling_permille = thermal.cooling_permille
        c.thresholds_mc = list(thermal.thresholds_mc)
        c.throttle_percent = list(thermal.throttle_percent)
    return out


def config_fields(config: SchedulingConfig) -> list[int]:
    """The six int32 fields of one `vnpu_config`."""
    return [
        config.uid,
        config.min_priority,
        config.max_priority,
        config.app_priority,
        int(config.has_direct_access),
        int(config.can_attribute_other_uid),
    ]


SERIALIZED_CALLS = (
    "configure",
    "load_model",
    "unload_model",
    "submit",
    "add_periodic",
    "end_work",
    "add_heat",
    "now_us",
    "next_event_us",
    "idle",
    "take_events",
    "status",
    "stats",
    "fileno",
    "close",
)


def _holding(lock: threading.RLock, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return call


class VnpuEngine(Engine):
    """The engine over one C handle; every rule lives in `csrc/vnpu.c`."""

    def __init__(
        self,
        specs: Sequence[DeviceSpec],
        max_live_work: int,
        max_models: int,
        *,
        real_time: bool = False,
        event_capacity: int = DEFAULT_EVENT_RING,
    ) -> None:
        self.specs = list(specs)
        self.max_models = max_models
        self.real_time = real_time
        self._closed = False
        unknown = ffi.new(
            "vnpu_config *",
            {
                "uid": 0,
                "min_priority": MIN_PRIORITY,
                "max_priority": MAX_PRIORITY,
                "app_priority": UNKNOWN_UID_PRIORITY,
                "has_direct_access": 1,
                "can_attribute_other_uid": 0,
            },
        )
        out = ffi.new("vnpu_handle **")
        rc = lib.vnpu_create(
            _c_specs(self.specs),
            len(self.specs),
            max_live_work,
            max_models,
            event_capacity,
            lib.VNPU_CLOCK_REAL if real_time else lib.VNPU_CLOCK_VIRTUAL,
            unknown,
            out,
        )
        if rc == lib.VNPU_E_NOMEM:
            raise MemoryError("the vnpu engine could not allocate its pools or threads")
        if rc != lib.VNPU_OK:
            raise IllegalArgumentError(f"the vnpu engine refused its configuration (status {rc})")
        self._h = ffi.gc(out[0], lib.vnpu_destroy)
        self._i64 = ffi.new("int64_t *")
        self._i32 = ffi.new("int32_t *")
        self._reading = ffi.new("vnpu_reading *")
        self._counters = ffi.new("vnpu_counters *")
        self._buf = ffi.new("vnpu_event[]", DRAIN_BATCH)
        self._view = memoryview(ffi.buffer(self._buf))
        self._pending: list[WorkEvent] = []
        # Interned ids: the list ends with a None sentinel, so index -1 maps to None.
        self._groups: list[bytes | None] = [None]
        self._group_index: dict[bytes, int] = {}
        self._features: list[str | None] = [None]
        self._feature_index: dict[str, int] = {}
        self._submit = lib.vnpu_submit
        self._drain_call = lib.vnpu_drain
        self._advance = lib.vnpu_advance_to
        self._idle = lib.vnpu_idle
        self._next = lib.vnpu_next_event
        if real_time:
            self._serialize_calls()

    def _serialize_calls(self) -> None:
        """On the real clock apps call from many threads: one call at a time here.

        The C handle is thread-safe; the scratch buffers and id tables on this side are
        shared, so each public call holds a re-entrant lock (virtual time needs none).
        """
        lock = threading.RLock()
        for name in SERIALIZED_CALLS:
            method = getattr(self, name)
            setattr(self, name, _holding(lock, method))

    # Errors -------------------------------------------------------------------------

    def _fail(self, rc: int, call: str) -> NoReturn:
        if self._closed or rc == lib.VNPU_E_CLOSED:
            raise DriverClosedError("the driver is closed")
        if rc == lib.VNPU_E_NOMEM:
            raise MemoryError(f"{call}: the vnpu engine is out of memory")
        raise IllegalArgumentError(f"{call}: an argument is outside what the vnpu engine accepts")

    def _device_error(self, device: int) -> UnknownDeviceError:
        return UnknownDeviceError(
            f"device {device} does not exist; devices are 0..{len(self.specs) - 1}"
        )

    # Interning ----------------------------------------------------------------------

    def _group(self, group_id: bytes | None) -> int:
        if group_id is None:
            return -1
        index = self._group_index.get(group_id)
        if index is None:
            index = self._group_index[group_id] = len(self._group_index)
            self._groups.insert(index, group_id)
        return index

    def _feature(self, feature_id: str | None) -> int:
        if feature_id is None:
            return -1
        index = self._feature_index.get(feature_id)
        if index is None:
            index = self._feature_index[feature_id] = len(self._feature_index)
            self._features.insert(index, feature_id)
        return index

    def _maybe_compact(self) -> None:
        """Forget interned ids once nothing live or queued can refer to them."""
        if len(self._group_index) + len(self._feature_index) <= COMPACT_INTERNED:
            return
        if not self.idle() or self.stats()["pending_events"] != 0:
            return
        self._groups, self._group_index = [None], {}
        self._features, self._feature_index = [None], {}

    # Calls --------------------------------------------------------------------------

    def configure(self, configs: Mapping[int, SchedulingConfig]) -> None:
        """Schedule by a new complete set of configs; live work is re-ranked."""
        flat: list[int] = []
        for config in configs.values():
            flat += config_fields(config)
        array = ffi.new("int32_t[]", flat)
        rc = lib.vnpu_configure(self._h, ffi.cast("vnpu_config *", array), len(configs))
        if rc != lib.VNPU_OK:
            self._fail(rc, "configure")

    def load_model(self, device: int, weight_bytes: int, sram_bytes: int) -> int:
        """Account a model's weights on a device; refuses what does not fit."""
        rc = lib.vnpu_load_model(self._h, device, weight_bytes, sram_bytes, self._i64)
        if rc == lib.VNPU_OK:
            return int(self._i64[0])
        if rc == lib.VNPU_E_NODEV:
            raise self._device_error(device)
        if rc == lib.VNPU_E_NOMEM:
            if self.stats()["models"] >= self.max_models:
                raise CapacityError(f"the driver holds {self.max_models} models already")
            spec = self.specs[device]
            free = spec.weight_memory_bytes - self.status(device).weight_memory_used_bytes
            if weight_bytes > free:
                raise CapacityError(
                    f"weight_bytes {weight_bytes} does not fit on device {device}: "
                    f"{free} of {spec.weight_memory_bytes} bytes free"
                )
            raise CapacityError(
                f"sram_bytes {sram_bytes} exceeds device {device}'s SRAM of {spec.sram_bytes} bytes"
            )
        self._fail(rc, "load_model")

    def unload_model(self, model: int) -> None:
        """Revoke a model: its live work ends CANCELLED_SYSTEM, its weights are freed."""
        rc = lib.vnpu_unload_model(self._h, model)
        if rc != lib.VNPU_OK:
            self._model_fail(rc, model, "unload_model")

    def _model_fail(self, rc: int, model: int, call: str) -> NoReturn:
        if rc == lib.VNPU_E_NOMODEL and not self._closed:
            raise UnknownModelError(f"model {model} is not loaded")
        self._fail(rc, call)

    def submit(
        self,
        model: int,
        uid: int,
        original_uid: int,
        job_priority: int,
        cost_cycles: int,
        group_id: bytes | None,
        feature_id: str | None,
        debug_pid: int,
    ) -> int:
        """Queue one job now; returns its id (a denied job ends FAILED at once)."""
        rc = self._submit(
            self._h,
            model,
            uid,
            original_uid,
            job_priority,
            cost_cycles,
            -1 if group_id is None else self._group(group_id),
            -1 if feature_id is None else self._feature(feature_id),
            debug_pid,
            self._i64,
        )
        if rc != lib.VNPU_OK:
            self._model_fail(rc, model, "submit")
        return int(self._i64[0])

    def add_periodic(self, model: int, job: Job, cost_cycles: int, arrivals: Arrivals) -> None:
        """Register periodic arrivals on the model's device."""
        assert job.original_uid is not None
        group = job.group_id if isinstance(job.group_id, bytes) or job.group_id is None else None
        rc = lib.vnpu_add_periodic(
            self._h,
            model,
            job.uid,
            job.original_uid,
            job.job_priority,
            cost_cycles,
            arrivals.period_us,
            arrivals.start_us,
            arrivals.times,
            arrivals.burst,
            self._group(group),
            self._feature(job.feature_id),
            job.debug_pid,
        )
        if rc != lib.VNPU_OK:
            self._model_fail(rc, model, "add_periodic")

    def end_work(self, work_id: int, reason: EndReason) -> None:
        """End one live job now with `reason` (CANCELLED_USER, or FAILED for a fault)."""
        rc = lib.vnpu_end_work(self._h, work_id, int(reason))
        if rc == lib.VNPU_E_NOWORK and not self._closed:
            raise UnknownWorkError(f"work_id {work_id} is not live (never submitted or ended)")
        if rc != lib.VNPU_OK:
            self._fail(rc, "end_work")

    def add_heat(self, device: int, millicelsius: int) -> None:
        """A thermal spike: the temperature jumps now."""
        rc = lib.vnpu_add_heat(self._h, device, millicelsius)
        if rc == lib.VNPU_E_NODEV and not self._closed:
            raise self._device_error(device)
        if rc != lib.VNPU_OK:
            self._fail(rc, "add_heat")

    # Time -----------------------------------------------------------------------------

    def advance_to(self, target_us: int) -> None:
        """Run every device up to `target_us`, draining whenever the event queue fills."""
        if target_us >= NEVER:
            raise IllegalArgumentError(
                f"time {target_us} us is past the vnpu engine's horizon of {NEVER - 1} us"
            )
        while True:
            rc = self._advance(self._h, target_us)
            if rc == lib.VNPU_OK:
                return
            if rc != lib.VNPU_E_AGAIN:
                self._fail(rc, "advance_to")
            self._pending.extend(self._drain())

    def now_us(self) -> int:
        """The driver clock (CLOCK_MONOTONIC microseconds on the real clock)."""
        rc = lib.vnpu_now(self._h, self._i64)
        if rc != lib.VNPU_OK:
            self._fail(rc, "now_us")
        return int(self._i64[0])

    def next_event_us(self) -> int:
        """The earliest event point of any device (NEVER if none)."""
        rc = self._next(self._h, self._i64)
        if rc != lib.VNPU_OK:
            self._fail(rc, "next_event_us")
        return int(self._i64[0])

    def idle(self) -> bool:
        """True when no work is live and no arrivals are pending."""
        rc = self._idle(self._h, self._i32)
        if rc != lib.VNPU_OK:
            self._fail(rc, "idle")
        return bool(self._i32[0])

    # Events -----------------------------------------------------------------------------

    def _drain(self) -> list[WorkEvent]:
        """Every event queued in C now, oldest first."""
        out: list[WorkEvent] = []
        count = self._i32
        # The tuples made here hold no references that could form a cycle; pausing the
        # cyclic collector while making them halves the cost of a large batch.
        collecting = gc.isenabled()
        gc.disable()
        try:
            while True:
                rc = self._drain_call(self._h, self._buf, DRAIN_BATCH, count)
                if rc != lib.VNPU_OK:
                    self._fail(rc, "take_events")
                n = count[0]
                if n == 0:
                    break
                groups, features, cls = self._groups, self._features, WorkEvent
                out += [
                    _new(cls, (k, r, i, groups[g], u, p, o, features[f], j, e, ms, d, t, m))
                    for k, r, i, g, u, p, o, f, j, e, ms, d, t, m in struct.iter_unpack(
                        EVENT_FORMAT, self._view[: n * EVENT_SIZE]
                    )
                ]
                if n < DRAIN_BATCH:
                    break
        finally:
            if collecting:
                gc.enable()
        return out

    def take_events(self) -> list[WorkEvent]:
        """Events since the last call, oldest first."""
        events = self._drain()
        if self._pending:
            events, self._pending = self._pending + events, []
        self._maybe_compact()
        return events

    def status(self, device: int) -> DeviceStatus:
        """A reading of one device."""
        r = self._reading
        rc = lib.vnpu_status(self._h, device, r)
        if rc == lib.VNPU_E_NODEV and not self._closed:
            raise self._device_error(device)
        if rc != lib.VNPU_OK:
            self._fail(rc, "status")
        return DeviceStatus(
            number=device,
            now_us=r.now_us,
            weight_memory_bytes=r.weight_memory_bytes,
            weight_memory_used_bytes=r.weight_memory_used_bytes,
            sram_used_bytes=r.sram_used_bytes,
            models_loaded=r.models_loaded,
            queue_depth=r.queue_depth,
            running=tuple(r.running[0 : r.channels]),
            temperature_mc=r.temperature_mc,
            peak_temperature_mc=r.peak_temperature_mc,
            severity=ThermalSeverity(r.severity),
            throttled_us=r.throttled_us,
            shutdown=bool(r.shutdown),
        )

    def stats(self) -> dict[str, int]:
        """The handle's counters: live work, models, generators, queued events, stalls..."""
        c = self._counters
        rc = lib.vnpu_stats(self._h, c)
        if rc != lib.VNPU_OK:
            self._fail(rc, "stats")
        return {name: int(getattr(c, name)) for name in COUNTERS}

    def fileno(self) -> int:
        """The eventfd that is readable while events wait (real clock only)."""
        rc = lib.vnpu_fileno(self._h, self._i32)
        if rc != lib.VNPU_OK:
            self._fail(rc, "fileno")
        return int(self._i32[0])

    def bench_single(
        self, model: int, n: int, uid: int, cost_cycles: int, job_priority: int
    ) -> int:
        """Run the one-job-at-a-time loop n times entirely in C; returns the events made."""
        rc = lib.vnpu_bench_single(
            self._h, model, n, uid, cost_cycles, job_priority, self._buf, DRAIN_BATCH, self._i64
        )
        if rc != lib.VNPU_OK:
            self._model_fail(rc, model, "bench_single")
        return int(self._i64[0])

    @property
    def handle(self) -> Any:
        """The raw `vnpu_handle *` (for benchmarks and the C-boundary tests)."""
        return self._h

    def close(self) -> None:
        """Stop the worker threads and free the handle; idempotent."""
        if self._closed:
            return
        self._closed = True
        lib.vnpu_close(self._h)
        ffi.release(self._h)
        self._h = ffi.NULL
