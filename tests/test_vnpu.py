"""The vnpu driver's own behaviour: the raw C boundary, the real clock, back-pressure.

Behaviour shared with the reference driver is in test_simulated_driver.py and
test_differential.py; this file covers what only the C engine has.
"""

from __future__ import annotations

import asyncio
import gc
import os
import select
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.daemon_support import WAIT_S
from npumanager import EndReason, StartReason, ThermalSeverity, load_plugins
from npumanager.core.driver.events import NO_REASON, EventKind, WorkEvent
from npumanager.core.driver.job import Job
from npumanager.errors import DriverClosedError, IllegalArgumentError
from npumanager.schemas import DriverCapability
from npumanager.schemas.device import DeviceSpec, ThermalSpec
from npumanager.schemas.limits import (
    DEFAULT_EVENT_RING,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MAX_CHANNELS,
    MAX_DEVICES,
    MAX_PRIORITY,
    MIN_PRIORITY,
)
from npumanager.vendor_drivers.reference import ReferenceDriver
from npumanager.vendor_drivers.reference import engine as reference_engine
from npumanager.vendor_drivers.vnpu import ClockError, VnpuDriver
from npumanager.vendor_drivers.vnpu import engine as vnpu_engine
from npumanager.vendor_drivers.vnpu._vnpu import ffi, lib

SLOW = DeviceSpec(channels=1, clock_mhz=1, slice_us=100)
"""A one-channel device where a job of N cycles takes N microseconds."""
HUGE = 10**12
"""Cycles of a job that will not end during a test (about 11 days at 1 MHz)."""


def kinds(events: list[WorkEvent]) -> list[tuple[int, int, int]]:
    return [(e.kind, e.reason, e.id) for e in events]


# The C side's constants are the schemas' ---------------------------------------------


def test_c_constants_match_the_python_definitions() -> None:
    assert lib.VNPU_MAX_DEVICES == MAX_DEVICES
    assert lib.VNPU_MAX_CHANNELS == MAX_CHANNELS
    assert (lib.VNPU_MIN_PRIORITY, lib.VNPU_MAX_PRIORITY) == (MIN_PRIORITY, MAX_PRIORITY)
    assert lib.VNPU_NEVER == reference_engine.NEVER
    assert lib.VNPU_SEVERITY_SHUTDOWN == ThermalSeverity.SHUTDOWN
    assert len(ThermalSpec().thresholds_mc) == lib.VNPU_LEVELS
    assert tuple(EventKind) == (lib.VNPU_KIND_REQUESTED, lib.VNPU_KIND_STARTED, lib.VNPU_KIND_ENDED)
    assert lib.VNPU_NO_REASON == NO_REASON
    assert tuple(StartReason) == (lib.VNPU_START_INITIAL, lib.VNPU_START_RESUMED)
    assert tuple(EndReason) == (
        lib.VNPU_END_CANCELLED_USER,
        lib.VNPU_END_CANCELLED_SYSTEM,
        lib.VNPU_END_PAUSED,
        lib.VNPU_END_FAILED,
        lib.VNPU_END_COMPLETED,
    )
    assert lib.VNPU_MAX_COST_CYCLES == INT64_MAX // 100
    assert lib.VNPU_MAX_SPAN_US == INT64_MAX // 4
    assert ffi.sizeof("vnpu_event") == vnpu_engine.EVENT_SIZE
    assert ffi.sizeof("vnpu_config") == 6 * 4


def test_registered_as_vnpu_with_its_capabilities() -> None:
    record = load_plugins().driver("vnpu")
    assert record.factory is VnpuDriver
    assert record.capabilities == {
        DriverCapability.PREEMPTION,
        DriverCapability.THERMAL_MODEL,
        DriverCapability.VIRTUAL_TIME,
        DriverCapability.REAL_TIME,
        DriverCapability.MULTI_DEVICE,
        DriverCapability.FAIR_SHARE,
    }


# The raw C boundary -----------------------------------------------------------------------


def c_spec(**over: Any) -> Any:
    spec = ffi.new("vnpu_spec *")
    spec.channels = 2
    spec.sram_bytes = 1000
    spec.weight_memory_bytes = 1000
    spec.clock_mhz = 1
    spec.slice_us = 10
    spec.ambient_mc = 35_000
    spec.tick_us = 1 << 40
    spec.heat_per_busy_channel_mc = 0
    spec.cooling_permille = 10
    spec.thresholds_mc = [40_000, 45_000, 50_000, 55_000, 60_000, 65_000]
    spec.throttle_percent = [100, 80, 60, 40, 20, 10]
    for name, value in over.items():
        setattr(spec, name, value)
    return spec


def unknown_config() -> Any:
    return ffi.new("vnpu_config *", [0, 0, 1000, 1000, 1, 0])


def create(
    devices: int = 2, max_live: int = 8, models: int = 4, capacity: int = 64, real: bool = False
) -> Any:
    specs = ffi.new("vnpu_spec[]", devices)
    for n in range(devices):
        specs[n] = c_spec()[0]
    out = ffi.new("vnpu_handle **")
    clock = lib.VNPU_CLOCK_REAL if real else lib.VNPU_CLOCK_VIRTUAL
    rc = lib.vnpu_create(specs, devices, max_live, models, capacity, clock, unknown_config(), out)
    assert rc == lib.VNPU_OK
    return out[0]


@pytest.fixture
def handle() -> Iterator[Any]:
    h = create()
    yield h
    assert lib.vnpu_destroy(h) == lib.VNPU_OK


def drain(h: Any, cap: int = 256) -> list[tuple[int, ...]]:
    buf = ffi.new("vnpu_event[]", cap)
    n = ffi.new("int32_t *")
    out: list[tuple[int, ...]] = []
    while True:
        assert lib.vnpu_drain(h, buf, cap, n) == lib.VNPU_OK
        out += struct.iter_unpack(vnpu_engine.EVENT_FORMAT, ffi.buffer(buf, n[0] * 112))
        if n[0] < cap:
            return out


def load(h: Any, device: int = 0, weight: int = 1, sram: int = 0) -> int:
    out = ffi.new("int64_t *")
    assert lib.vnpu_load_model(h, device, weight, sram, out) == lib.VNPU_OK
    return int(out[0])


def submit(h: Any, model: int, uid: int = 5, prio: int = 0, cost: int = 100) -> tuple[int, int]:
    out = ffi.new("int64_t *")
    rc = lib.vnpu_submit(h, model, uid, uid, prio, cost, -1, -1, 0, out)
    return rc, int(out[0])


def test_each_failure_has_its_status_code(handle: Any) -> None:
    h, out = handle, ffi.new("int64_t *")
    assert lib.vnpu_load_model(h, 2, 1, 0, out) == lib.VNPU_E_NODEV
    assert lib.vnpu_load_model(h, -1, 1, 0, out) == lib.VNPU_E_NODEV
    assert lib.vnpu_load_model(h, 0, 1001, 0, out) == lib.VNPU_E_NOMEM  # weights
    assert lib.vnpu_load_model(h, 0, 1, 1001, out) == lib.VNPU_E_NOMEM  # SRAM
    assert lib.vnpu_load_model(h, 0, -1, 0, out) == lib.VNPU_E_INVAL
    assert lib.vnpu_load_model(h, 0, 1, 0, ffi.NULL) == lib.VNPU_E_INVAL
    models = [load(h) for _ in range(4)]
    assert lib.vnpu_load_model(h, 1, 1, 0, out) == lib.VNPU_E_NOMEM  # model table
    assert lib.vnpu_unload_model(h, models[0]) == lib.VNPU_OK
    assert lib.vnpu_unload_model(h, models[0]) == lib.VNPU_E_NOMODEL
    assert submit(h, models[0])[0] == lib.VNPU_E_NOMODEL
    assert submit(h, models[1], cost=0)[0] == lib.VNPU_E_INVAL
    assert submit(h, models[1], prio=1001)[0] == lib.VNPU_E_INVAL
    assert submit(h, models[1], uid=-1)[0] == lib.VNPU_E_INVAL
    rc, work = submit(h, models[1])
    assert rc == lib.VNPU_OK
    assert lib.vnpu_end_work(h, work, 7) == lib.VNPU_E_INVAL
    assert lib.vnpu_end_work(h, work, lib.VNPU_END_CANCELLED_USER) == lib.VNPU_OK
    assert lib.vnpu_end_work(h, work, lib.VNPU_END_CANCELLED_USER) == lib.VNPU_E_NOWORK
    assert lib.vnpu_add_heat(h, 5, 1) == lib.VNPU_E_NODEV
    assert lib.vnpu_add_heat(h, 0, 10**9 + 1) == lib.VNPU_E_INVAL
    assert lib.vnpu_advance_to(h, lib.VNPU_NEVER) == lib.VNPU_E_INVAL
    assert lib.vnpu_status(h, 2, ffi.new("vnpu_reading *")) == lib.VNPU_E_NODEV
    assert lib.vnpu_fileno(h, ffi.new("int32_t *")) == lib.VNPU_E_INVAL  # virtual clock
    bad = ffi.new("vnpu_config[]", [[7, 0, 1000, 0, 1, 0], [7, 0, 1000, 5, 1, 0]])
    assert lib.vnpu_configure(h, bad, 2) == lib.VNPU_E_INVAL  # two configs for one uid
    bad = ffi.new("vnpu_config[]", [[7, 600, 500, 0, 1, 0]])
    assert lib.vnpu_configure(h, bad, 1) == lib.VNPU_E_INVAL  # min above max
    assert lib.vnpu_configure(h, ffi.NULL, 1) == lib.VNPU_E_INVAL
    assert lib.vnpu_configure(h, ffi.NULL, 0) == lib.VNPU_OK


def test_a_null_handle_is_refused_by_every_call() -> None:
    null, i64, i32 = ffi.NULL, ffi.new("int64_t *"), ffi.new("int32_t *")
    buf = ffi.new("vnpu_event[]", 1)
    calls = [
        lib.vnpu_close(null),
        lib.vnpu_destroy(null),
        lib.vnpu_configure(null, ffi.NULL, 0),
        lib.vnpu_load_model(null, 0, 1, 0, i64),
        lib.vnpu_unload_model(null, 1),
        lib.vnpu_submit(null, 1, 1, 1, 0, 1, -1, -1, 0, i64),
        lib.vnpu_add_periodic(null, 1, 1, 1, 0, 1, 1, 0, 1, 1, -1, -1, 0),
        lib.vnpu_end_work(null, 1, 0),
        lib.vnpu_add_heat(null, 0, 1),
        lib.vnpu_advance_to(null, 1),
        lib.vnpu_now(null, i64),
        lib.vnpu_next_event(null, i64),
        lib.vnpu_idle(null, i32),
        lib.vnpu_status(null, 0, ffi.new("vnpu_reading *")),
        lib.vnpu_stats(null, ffi.new("vnpu_counters *")),
        lib.vnpu_drain(null, buf, 1, i32),
        lib.vnpu_fileno(null, i32),
        lib.vnpu_bench_single(null, 1, 1, 1, 1, 0, buf, 1, i64),
        lib.vnpu_monotonic_us(ffi.NULL),
    ]
    assert calls == [lib.VNPU_E_INVAL] * len(calls)


def test_a_closed_handle_answers_closed() -> None:
    h = create()
    model = load(h)
    assert lib.vnpu_close(h) == lib.VNPU_OK
    assert lib.vnpu_close(h) == lib.VNPU_OK
    i64, i32 = ffi.new("int64_t *"), ffi.new("int32_t *")
    assert lib.vnpu_load_model(h, 0, 1, 0, i64) == lib.VNPU_E_CLOSED
    assert submit(h, model)[0] == lib.VNPU_E_CLOSED
    assert lib.vnpu_advance_to(h, 5) == lib.VNPU_E_CLOSED
    assert lib.vnpu_now(h, i64) == lib.VNPU_E_CLOSED
    assert lib.vnpu_idle(h, i32) == lib.VNPU_E_CLOSED
    assert lib.vnpu_drain(h, ffi.new("vnpu_event[]", 1), 1, i32) == lib.VNPU_E_CLOSED
    assert lib.vnpu_destroy(h) == lib.VNPU_OK


def test_create_refuses_bad_configurations() -> None:
    out = ffi.new("vnpu_handle **")
    unknown = unknown_config()

    def rc(spec: Any = None, **kw: Any) -> int:
        args = {"n": 1, "live": 8, "models": 4, "cap": 8, "clock": 0, **kw}
        return int(
            lib.vnpu_create(
                spec if spec is not None else c_spec(),
                args["n"],
                args["live"],
                args["models"],
                args["cap"],
                args["clock"],
                unknown,
                out,
            )
        )

    assert rc(n=0) == rc(n=17) == rc(live=0) == rc(models=0) == rc(cap=0) == lib.VNPU_E_INVAL
    assert rc(live=lib.VNPU_MAX_LIVE_WORK + 1) == rc(clock=2) == lib.VNPU_E_INVAL
    for bad in (
        {"channels": 0},
        {"channels": 65},
        {"slice_us": 0},
        {"tick_us": 0},
        {"clock_mhz": 0},
        {"cooling_permille": 1001},
        {"thresholds_mc": [40_000, 40_000, 50_000, 55_000, 60_000, 65_000]},
        {"thresholds_mc": [30_000, 45_000, 50_000, 55_000, 60_000, 65_000]},
        {"throttle_percent": [100, 80, 60, 40, 20, 0]},
        {"heat_per_busy_channel_mc": lib.VNPU_MAX_SPEC_MC + 1},
        {"sram_bytes": lib.VNPU_MAX_SRAM_BYTES + 1},
        {"scheduler": 2},
        {"nbands": lib.VNPU_MAX_BANDS + 1},
        {"nbands": -1},
        {"nbands": 2, "band_first": [0, 0, 0, 0, 0, 0, 0, 0]},
        {"nbands": 1, "band_first": [5, 0, 0, 0, 0, 0, 0, 0]},
        {"nbands": 2, "band_first": [0, 2001, 0, 0, 0, 0, 0, 0]},
        {"floor_percent": lib.VNPU_MAX_FLOOR_PERCENT + 1},
        {"floor_percent": 10, "floor_window_us": 0},
        {"floor_window_us": lib.VNPU_MAX_FLOOR_WINDOW_US + 1},
    ):
        assert rc(c_spec(**bad)) == lib.VNPU_E_INVAL, bad
    assert out[0] == ffi.NULL
    assert lib.vnpu_create(c_spec(), 1, 8, 4, 8, 0, ffi.NULL, out) == lib.VNPU_E_INVAL


I32 = (
    st.integers(-3, 5)
    | st.sampled_from([INT32_MIN, INT32_MAX, 1000, 1001])
    | st.integers(INT32_MIN, INT32_MAX)
)
I64 = (
    st.integers(-3, 5)
    | st.sampled_from([INT64_MIN, INT64_MAX, lib.VNPU_NEVER, lib.VNPU_MAX_COST_CYCLES + 1])
    | st.integers(INT64_MIN, INT64_MAX)
)
BURST = st.integers(-2, 3) | st.sampled_from([lib.VNPU_MAX_BURST + 1, INT32_MAX])
CALLS = st.one_of(
    st.tuples(st.just("load"), I32, I64, I64),
    st.tuples(st.just("unload"), I64),
    st.tuples(st.just("submit"), I64, I32, I32, I32, I64, I32, I32, I32),
    st.tuples(st.just("periodic"), I64, I32, I32, I32, I64, I64, I64, I32, BURST, I32, I32, I32),
    st.tuples(st.just("end"), I64, I32),
    st.tuples(st.just("heat"), I32, I64),
    st.tuples(st.just("advance"), I64),
    st.tuples(st.just("configure"), st.lists(st.tuples(*[I32] * 6), max_size=3)),
    st.tuples(st.just("drain"), st.integers(0, 8)),
    st.tuples(st.just("status"), I32),
    st.tuples(st.just("bench"), I64, st.integers(0, 3), I32, I64, I32),
    st.just(("read",)),
)
OK, INVAL, NOMODEL, NOWORK, NODEV, NOMEM, AGAIN = (
    lib.VNPU_OK,
    lib.VNPU_E_INVAL,
    lib.VNPU_E_NOMODEL,
    lib.VNPU_E_NOWORK,
    lib.VNPU_E_NODEV,
    lib.VNPU_E_NOMEM,
    lib.VNPU_E_AGAIN,
)
ALLOWED = {
    "load": {OK, NODEV, INVAL, NOMEM},
    "unload": {OK, NOMODEL},
    "submit": {OK, INVAL, NOMODEL},
    "periodic": {OK, INVAL, NOMODEL},
    "end": {OK, INVAL, NOWORK},
    "heat": {OK, INVAL, NODEV},
    "advance": {OK, INVAL, AGAIN},
    "configure": {OK, INVAL},
    "drain": {OK},
    "status": {OK, NODEV},
    "bench": {OK, INVAL, NOMODEL, AGAIN},
    "read": {OK},
}


def raw_call(h: Any, call: tuple[Any, ...], buf: Any, clock: int) -> int:
    """One call into the C library with arbitrary (C-typed) arguments."""
    name, *a = call
    i64, i32 = ffi.new("int64_t *"), ffi.new("int32_t *")
    if name == "load":
        return int(lib.vnpu_load_model(h, a[0], a[1], a[2], i64))
    if name == "unload":
        return int(lib.vnpu_unload_model(h, a[0]))
    if name == "submit":
        return int(lib.vnpu_submit(h, *a, i64))
    if name == "periodic":
        return int(lib.vnpu_add_periodic(h, *a))
    if name == "end":
        return int(lib.vnpu_end_work(h, a[0], a[1]))
    if name == "heat":
        return int(lib.vnpu_add_heat(h, a[0], a[1]))
    if name == "advance":
        # Any target; valid ones capped a little ahead so periodic arrivals stay few.
        target = a[0] if a[0] >= lib.VNPU_NEVER or a[0] < clock else min(a[0], clock + 500)
        return int(lib.vnpu_advance_to(h, target))
    if name == "configure":
        configs = ffi.new("vnpu_config[]", [list(c) for c in a[0]] or 1)
        return int(lib.vnpu_configure(h, configs, len(a[0])))
    if name == "drain":
        return int(lib.vnpu_drain(h, buf, a[0], i32))
    if name == "status":
        return int(lib.vnpu_status(h, a[0], ffi.new("vnpu_reading *")))
    if name == "bench":
        model, n, uid, cost, prio = a
        return int(lib.vnpu_bench_single(h, model, n, uid, min(cost, 10**4), prio, buf, 8, i64))
    assert name == "read"
    rcs = {
        lib.vnpu_now(h, i64),
        lib.vnpu_next_event(h, i64),
        lib.vnpu_idle(h, i32),
        lib.vnpu_stats(h, ffi.new("vnpu_counters *")),
    }
    return OK if rcs == {OK} else INVAL


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CALLS, max_size=40), st.integers(1, 5))
def test_arbitrary_calls_get_status_codes_never_a_crash(
    calls: list[tuple[Any, ...]], capacity: int
) -> None:
    h = create(devices=2, max_live=4, models=3, capacity=capacity)
    buf = ffi.new("vnpu_event[]", 8)
    now = ffi.new("int64_t *")
    try:
        load(h, 0), load(h, 1)
        for call in calls:
            assert lib.vnpu_now(h, now) == OK
            rc = raw_call(h, call, buf, int(now[0]))
            assert rc in ALLOWED[call[0]], (call, rc)
        counters = ffi.new("vnpu_counters *")
        assert lib.vnpu_stats(h, counters) == OK
        assert 0 <= counters.live_work <= 4
        assert 0 <= counters.models <= 3
        assert counters.dropped_events == 0
        drain(h)
        assert lib.vnpu_stats(h, counters) == OK
        assert counters.pending_events == 0
    finally:
        assert lib.vnpu_destroy(h) == OK


SPEC_FIELDS = st.fixed_dictionaries(
    {
        "channels": st.integers(-2, 66) | st.integers(INT32_MIN, INT32_MAX),
        "sram_bytes": I64,
        "weight_memory_bytes": I64,
        "clock_mhz": I64,
        "slice_us": I64,
        "ambient_mc": st.sampled_from([35_000, -5]) | I64,
        "tick_us": I64,
        "heat_per_busy_channel_mc": I64,
        "cooling_permille": st.integers(-1, 1001) | I64,
        "thresholds_mc": st.sampled_from([[40_000, 45_000, 50_000, 55_000, 60_000, 65_000]])
        | st.lists(I64, min_size=6, max_size=6),
        "throttle_percent": st.lists(st.integers(-1, 101) | I64, min_size=6, max_size=6),
        "scheduler": st.integers(-1, 2) | I32,
        "nbands": st.integers(-1, 9) | I32,
        "band_first": st.lists(st.integers(-1, 2001) | I64, min_size=8, max_size=8),
        "floor_percent": st.integers(-1, 51) | I64,
        "floor_window_us": I64,
    }
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(SPEC_FIELDS, min_size=lib.VNPU_MAX_DEVICES, max_size=lib.VNPU_MAX_DEVICES),
    st.integers(-1, 17) | st.integers(INT32_MIN, INT32_MAX),
    st.integers(-1, 70) | st.integers(INT32_MIN, INT32_MAX),
    st.integers(-1, 70) | st.integers(INT32_MIN, INT32_MAX),
    st.integers(-1, 70) | st.integers(INT32_MIN, INT32_MAX),
    st.integers(-1, 2),
    st.tuples(*[I32] * 6),
)
def test_create_with_arbitrary_ints_gets_a_status_code(
    fields: list[dict[str, Any]],
    devices: int,
    max_live: int,
    models: int,
    capacity: int,
    clock: int,
    unknown: tuple[int, ...],
) -> None:
    specs = ffi.new("vnpu_spec[]", lib.VNPU_MAX_DEVICES)
    for n, values in enumerate(fields):
        for name, value in values.items():
            setattr(specs[n], name, value)
    out = ffi.new("vnpu_handle **")
    rc = lib.vnpu_create(
        specs, devices, max_live, models, capacity, clock, ffi.new("vnpu_config *", unknown), out
    )
    assert rc in {OK, INVAL, NOMEM}
    assert (out[0] != ffi.NULL) == (rc == OK)
    if rc == OK:
        assert submit(out[0], load(out[0]))[0] == OK
        assert lib.vnpu_destroy(out[0]) == OK


# Virtual clock: the event queue's back-pressure ------------------------------------------


def test_advance_stops_when_the_queue_is_full_and_loses_nothing() -> None:
    def run(capacity: int) -> tuple[list[tuple[int, ...]], int]:
        h = create(devices=1, max_live=64, capacity=capacity)
        model = load(h)
        rc = lib.vnpu_add_periodic(h, model, 5, 5, 0, 30, 20, 0, 40, 2, -1, -1, 0)
        assert rc == OK
        events: list[tuple[int, ...]] = []
        stops = 0
        counters = ffi.new("vnpu_counters *")
        while (rc := lib.vnpu_advance_to(h, 10_000)) == AGAIN:
            stops += 1
            assert lib.vnpu_stats(h, counters) == OK
            # One event point adds at most: 2 ENDED, 2 REQUESTED, 2 STARTED.
            assert capacity <= counters.pending_events < capacity + 6
            events += drain(h)
        assert rc == OK
        events += drain(h)
        lib.vnpu_destroy(h)
        return events, stops

    small, stops = run(4)
    large, no_stops = run(DEFAULT_EVENT_RING)
    assert stops > 10
    assert no_stops == 0
    assert small == large
    assert len(small) == 40 * 2 * 3


def test_a_tiny_event_capacity_changes_nothing_observable() -> None:
    def run(driver: Any) -> list[WorkEvent]:
        model = driver.load_model(0, weight_bytes=1)
        driver.add_periodic(model, Job(uid=3), cost_cycles=250, period_us=100, count=30, burst=3)
        driver.submit(model, uid=0, cost_cycles=5_000, job_priority=0)
        driver.run_until_idle()
        events: list[WorkEvent] = driver.take_events()
        driver.close()
        return events

    spec = DeviceSpec(channels=2, clock_mhz=1, slice_us=50)
    assert run(VnpuDriver([spec], event_capacity=1)) == run(ReferenceDriver([spec]))


# Python face specifics -------------------------------------------------------------------


def test_specs_beyond_the_engines_int64_range_are_refused() -> None:
    hot = DeviceSpec(thermal=ThermalSpec(heat_per_busy_channel_mc=2**41))
    with pytest.raises(IllegalArgumentError, match="heat_per_busy_channel_mc"):
        VnpuDriver([hot])
    with pytest.raises(IllegalArgumentError, match="sram_bytes"):
        VnpuDriver([DeviceSpec(sram_bytes=2**60)])
    with pytest.raises(IllegalArgumentError, match="clock must be one of"):
        VnpuDriver(clock="wall")
    with pytest.raises(IllegalArgumentError, match="event_capacity"):
        VnpuDriver(event_capacity=0)


def test_the_engine_refuses_targets_at_the_horizon_itself() -> None:
    # The face stops callers first (tests/test_simulated_driver.py); the engine guards too.
    driver = VnpuDriver()
    with pytest.raises(IllegalArgumentError, match="horizon"):
        driver.engine.advance_to(vnpu_engine.NEVER)
    driver.close()


def test_group_and_feature_ids_round_trip_and_the_tables_are_compacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vnpu_engine, "COMPACT_INTERNED", 3)
    driver = VnpuDriver([SLOW])
    model = driver.load_model(0, weight_bytes=1)
    groups = [uuid.UUID(int=n) for n in range(4)]
    for n, group in enumerate(groups):
        driver.submit(model, uid=1, cost_cycles=10, group_id=group, feature_id=f"f{n}")
    driver.run_until_idle()
    events = driver.take_events()
    assert {(e.group_id, e.debug_feature_id) for e in events} == {
        (g.bytes, f"f{n}") for n, g in enumerate(groups)
    }
    assert driver.vnpu._group_index == {}  # idle and drained: forgotten
    driver.submit(model, uid=1, cost_cycles=10, group_id=groups[3], feature_id="again")
    driver.submit(model, uid=1, cost_cycles=10)
    driver.run_until_idle()
    again = driver.take_events()
    assert [(e.group_id, e.debug_feature_id) for e in again[:1]] == [(groups[3].bytes, "again")]
    assert {e.group_id for e in again if e.id == again[-1].id} == {None}
    driver.close()


def test_bench_single_runs_the_one_job_loop_in_c() -> None:
    driver = VnpuDriver([SLOW])
    model = driver.load_model(0, weight_bytes=1)
    assert driver.vnpu.bench_single(model, 100, 7, 50, 0) == 300
    assert driver.engine.idle()
    assert driver.now_us == 100 * 50
    assert driver.take_events() == []
    driver.close()


# The real clock ------------------------------------------------------------------------------


def tasks() -> set[str]:
    """The ids of this process's threads."""
    return set(os.listdir("/proc/self/task"))


@pytest.fixture
def real() -> Iterator[Any]:
    made: list[VnpuDriver] = []

    def build(*args: Any, **kwargs: Any) -> VnpuDriver:
        driver = VnpuDriver(*args, clock="real", **kwargs)
        made.append(driver)
        return driver

    yield build
    for driver in made:
        driver.close()


def asleep(driver: VnpuDriver, workers: int) -> None:
    """Wait until every worker thread sleeps (so a missed wake-up would show)."""
    deadline = time.monotonic() + WAIT_S
    while driver.vnpu.stats()["sleeping"] != workers:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_the_real_clock_runs_work_by_itself(real: Any) -> None:
    driver = real([SLOW])
    model = driver.load_model(0, weight_bytes=1)
    asleep(driver, 1)
    before = time.monotonic_ns() // 1000
    work = driver.submit(model, uid=1, cost_cycles=2_000)
    events = driver.take_events()
    assert kinds(events) == [
        (EventKind.REQUESTED, NO_REASON, work),
        (EventKind.STARTED, StartReason.INITIAL, work),
    ]
    # Nothing is called from here until the worker thread has ended the job.
    assert select.select([driver.fileno()], [], [], WAIT_S)[0] == [driver.fileno()]
    after = time.monotonic_ns() // 1000
    events += driver.take_events()
    assert kinds(events)[2:] == [(EventKind.ENDED, EndReason.COMPLETED, work)]
    times = [e.time_us for e in events]
    assert before <= times[0] <= times[1] <= times[2] <= after  # the monotonic clock
    assert times[2] - times[1] == 2_000  # at 1 MHz, 2000 cycles take 2000 us
    assert all(e.timestamp_ms == e.time_us // 1000 for e in events)
    assert driver.wait_idle(WAIT_S)


def test_real_clock_preemption_happens_at_a_slice_boundary(real: Any) -> None:
    driver = real([SLOW])
    model = driver.load_model(0, weight_bytes=1)
    low = driver.submit(model, uid=1, cost_cycles=HUGE, job_priority=900)
    high = driver.submit(model, uid=1, cost_cycles=300, job_priority=0)
    deadline = time.monotonic() + WAIT_S
    events: list[WorkEvent] = []
    while not any(e.id == high and e.kind == EventKind.ENDED for e in events):
        assert time.monotonic() < deadline
        select.select([driver.fileno()], [], [], 1.0)
        events += driver.take_events()
    by = {(e.id, e.kind, e.reason): e.time_us for e in events}
    started = by[(low, EventKind.STARTED, StartReason.INITIAL)]
    paused = by[(low, EventKind.ENDED, EndReason.PAUSED)]
    assert (paused - started) % SLOW.slice_us == 0 and paused > started
    assert by[(high, EventKind.STARTED, StartReason.INITIAL)] == paused
    assert by[(high, EventKind.ENDED, EndReason.COMPLETED)] == paused + 300
    assert by[(low, EventKind.STARTED, StartReason.RESUMED)] == paused + 300
    driver.cancel(low)


def test_virtual_only_and_real_only_calls_say_so(real: Any) -> None:
    driver = real([SLOW])
    with pytest.raises(ClockError, match="real clock"):
        driver.advance(10)
    virtual, loop = VnpuDriver(), asyncio.new_event_loop()
    for call in (virtual.fileno, virtual.wait_idle, lambda: virtual.attach(loop)):
        with pytest.raises(ClockError, match="virtual time"):
            call()
    loop.close()
    assert virtual.stalls == 0
    virtual.close()
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=1, cost_cycles=100)
    assert driver.run_until_idle() >= driver.take_events()[-1].time_us


def test_the_fd_is_readable_exactly_while_events_wait(real: Any) -> None:
    driver = real([SLOW])
    fd = driver.fileno()
    assert select.select([fd], [], [], 0)[0] == []
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=1, cost_cycles=HUGE)  # REQUESTED and STARTED, then nothing
    assert select.select([fd], [], [], 0)[0] == [fd]
    assert len(driver.take_events()) == 2
    assert select.select([fd], [], [], 0)[0] == []


def test_a_reader_that_does_not_drain_holds_the_workers_up(real: Any) -> None:
    capacity = 8
    driver = real([DeviceSpec(channels=1, clock_mhz=1)], event_capacity=capacity)
    model = driver.load_model(0, weight_bytes=1)
    driver.add_periodic(model, Job(uid=1), cost_cycles=10, period_us=50, count=200)
    deadline = time.monotonic() + WAIT_S
    while driver.stalls == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    pending = driver.vnpu.stats()["pending_events"]
    assert capacity <= pending < capacity + 4  # one event point adds at most 3
    assert driver.wait_idle(WAIT_S)
    events = driver.take_events()
    assert len(events) == 200 * 3
    assert [e.time_us for e in events] == sorted(e.time_us for e in events)
    ids = sorted({e.id for e in events})
    assert ids == list(range(1, 201))
    assert all(e.reason == EndReason.COMPLETED for e in events if e.kind == EventKind.ENDED)


def test_a_late_start_is_clamped_to_now_on_the_real_clock() -> None:
    for real_clock, expected in ((True, OK), (False, INVAL)):
        h = create(devices=1, real=real_clock)
        model = load(h)
        lib.vnpu_advance_to(h, 100)
        rc = lib.vnpu_add_periodic(h, model, 1, 1, 0, 10, 1000, 0, 1, 1, -1, -1, 0)
        assert rc == expected
        lib.vnpu_destroy(h)


def test_attach_delivers_through_the_loop_including_debounced_ends(real: Any) -> None:
    driver = real([SLOW, SLOW])

    class Callback:
        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []
            self.done = asyncio.Event()

        def on_work_requested(self, info: Any) -> None:
            self.calls.append(("requested", info.id))

        def on_work_started(self, info: Any, reason: StartReason) -> None:
            self.calls.append(("started", info.id))

        def on_work_ended(self, info: Any, reason: EndReason) -> None:
            self.calls.append(("ended", info.id))
            self.done.set()

    async def main() -> list[tuple[str, int]]:
        callback = Callback()
        driver.set_callback(callback)  # the default 50 ms debounce window
        driver.attach(asyncio.get_running_loop())
        model = driver.load_model(1, weight_bytes=1)
        first = driver.submit(model, uid=1, cost_cycles=20_000)
        second = driver.submit(model, uid=1, cost_cycles=20_000)
        await asyncio.wait_for(callback.done.wait(), WAIT_S)
        driver.detach()
        assert callback.calls == [("requested", first), ("started", first), ("ended", second)]
        return callback.calls

    asyncio.run(main())


def test_close_joins_the_threads_and_garbage_collection_does_too() -> None:
    # By thread id: other tests' leftovers (a runtime's pool) may start or end threads
    # meanwhile, so only the driver's own are followed.
    gc.collect()
    before = tasks()
    driver = VnpuDriver([SLOW] * 3, clock="real")
    made = tasks() - before
    assert len(made) == 3
    driver.close()
    driver.close()
    assert _gone(made), "close() returned with the driver's threads still running"
    for call in (lambda: driver.now_us, lambda: driver.stalls, driver.fileno, driver.pump):
        with pytest.raises(DriverClosedError):
            call()
    before = tasks()
    dropped = VnpuDriver([SLOW] * 2, clock="real")
    model = dropped.load_model(0, weight_bytes=1)
    dropped.submit(model, uid=1, cost_cycles=HUGE)
    made = tasks() - before
    assert len(made) == 2
    del dropped
    gc.collect()
    assert _gone(made), "the dropped driver's threads still run"


def _gone(threads: set[str]) -> bool:
    """True once none of `threads` is listed in /proc: a thread joined in C still shows
    there until the kernel reaps it, a moment later (longer on a busy machine)."""
    deadline = time.monotonic() + WAIT_S
    while threads & tasks():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
