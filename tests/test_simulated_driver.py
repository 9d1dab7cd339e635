"""The simulated NPU's behaviour, HAL and execution, on every simulated driver."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from npumanager import (
    EndReason,
    SchedulingConfig,
    StartReason,
    ThermalSeverity,
    WorkInfo,
)
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.driver.job import Job
from npumanager.errors import (
    CapacityError,
    DriverClosedError,
    IllegalArgumentError,
    UnknownDeviceError,
    UnknownModelError,
    UnknownWorkError,
)
from npumanager.schemas.device import DeviceSpec, ThermalSpec
from npumanager.testing.base import Recorder, lifecycle
from npumanager.vendor_drivers.reference import ReferenceDriver
from npumanager.vendor_drivers.simulated import SimulatedDriver

DRIVERS: dict[str, Callable[..., SimulatedDriver]] = {"reference": ReferenceDriver}

try:
    from npumanager.vendor_drivers.vnpu import VnpuDriver
except ImportError:  # pragma: no cover - the C driver lands separately
    pass
else:
    DRIVERS["vnpu"] = VnpuDriver

ONE_CHANNEL = DeviceSpec(channels=1, slice_us=1000)
MS = 1000
CYCLES_PER_MS = 1_000_000  # at the default 1000 MHz


@pytest.fixture(params=sorted(DRIVERS))
def make(request: pytest.FixtureRequest) -> Callable[..., SimulatedDriver]:
    factory = DRIVERS[request.param]
    made: list[SimulatedDriver] = []

    def build(*args: Any, **kwargs: Any) -> SimulatedDriver:
        driver = factory(*args, **kwargs)
        made.append(driver)
        return driver

    yield build
    for driver in made:
        driver.close()


kinds = lifecycle
"""(kind, reason name) of one work id's events: the suite's helper."""


def end_reason(events: list[WorkEvent], work: int) -> EndReason:
    (last,) = [e for e in events if e.id == work and e.kind == EventKind.ENDED][-1:]
    return EndReason(last.reason)


def finish_order(events: list[WorkEvent]) -> list[int]:
    return [e.id for e in events if e.kind == EventKind.ENDED and e.reason == EndReason.COMPLETED]


# The platform's HAL checks ------------------------------------------------------------


def test_one_inference_reports_requested_started_ended(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make()
    driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=300)])
    model = driver.load_model(0, weight_bytes=1 << 20)
    work = driver.submit(
        model, uid=10, cost_cycles=5 * CYCLES_PER_MS, job_priority=250, debug_pid=77
    )
    driver.run_until_idle()
    events = driver.take_events()
    assert kinds(events, work) == [
        ("REQUESTED", ""),
        ("STARTED", "INITIAL"),
        ("ENDED", "COMPLETED"),
    ]
    assert all(e.job_priority == 250 for e in events)
    assert all(e.effective_priority == 550 for e in events), "300 for the uid + 250 job"
    assert [e.timestamp_ms for e in events] == [0, 0, 5]
    assert {(e.debug_pid, e.device_number, e.original_uid) for e in events} == {(77, 0, 10)}


def test_ids_strictly_increase_and_timestamps_never_go_back(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make()
    model = driver.load_model(0, weight_bytes=1)
    ids = []
    for i in range(20):
        ids.append(driver.submit(model, uid=10 + i % 3, cost_cycles=100_000 * (i + 1)))
        driver.advance(300)
    driver.run_until_idle()
    events = driver.take_events()
    assert ids == sorted(set(ids))
    times = [e.time_us for e in events]
    assert times == sorted(times)
    assert [e.timestamp_ms for e in events] == [t // 1000 for t in times]


def test_higher_job_priority_number_gives_higher_effective(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make()
    driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=200)])
    model = driver.load_model(0, weight_bytes=1)
    effective = {}
    for job in (0, 100, 900):
        work = driver.submit(model, uid=10, cost_cycles=1000, job_priority=job)
        effective[job] = [e for e in driver.take_events() if e.id == work][0].effective_priority
    assert effective == {0: 200, 100: 300, 900: 1100}


def test_more_important_job_submitted_later_finishes_first(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make([ONE_CHANNEL])
    driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=100)])
    model = driver.load_model(0, weight_bytes=1)
    slow = driver.submit(model, uid=10, cost_cycles=200 * CYCLES_PER_MS, job_priority=500)
    driver.advance(50 * MS)
    fast = driver.submit(model, uid=10, cost_cycles=20 * CYCLES_PER_MS, job_priority=250)
    driver.run_until_idle()
    events = driver.take_events()
    assert finish_order(events) == [fast, slow]
    assert kinds(events, slow) == [
        ("REQUESTED", ""),
        ("STARTED", "INITIAL"),
        ("ENDED", "PAUSED"),
        ("STARTED", "RESUMED"),
        ("ENDED", "COMPLETED"),
    ]


def test_work_fails_without_direct_access(make: Callable[..., SimulatedDriver]) -> None:
    driver = make()
    driver.set_scheduling_configs(
        [SchedulingConfig(uid=10, app_priority=100, has_direct_access=False)]
    )
    model = driver.load_model(0, weight_bytes=1)
    work = driver.submit(model, uid=10, cost_cycles=1000)
    driver.run_until_idle()
    assert kinds(driver.take_events(), work) == [("REQUESTED", ""), ("ENDED", "FAILED")]


def test_attributing_another_uid_needs_permission(make: Callable[..., SimulatedDriver]) -> None:
    driver = make()
    driver.set_scheduling_configs(
        [
            SchedulingConfig(uid=10, app_priority=900),
            SchedulingConfig(uid=20, app_priority=900, can_attribute_other_uid=True),
            SchedulingConfig(uid=30, app_priority=100),
        ]
    )
    model = driver.load_model(0, weight_bytes=1)
    denied = driver.submit(model, uid=10, original_uid=30, cost_cycles=1000)
    allowed = driver.submit(model, uid=20, original_uid=30, cost_cycles=1000, job_priority=5)
    driver.run_until_idle()
    events = driver.take_events()
    assert end_reason(events, denied) == EndReason.FAILED
    assert end_reason(events, allowed) == EndReason.COMPLETED
    allowed_event = [e for e in events if e.id == allowed][0]
    assert (allowed_event.uid, allowed_event.original_uid) == (20, 30)
    assert allowed_event.effective_priority == 105, "ranked as the uid it works for"


# Scheduling ----------------------------------------------------------------------------


def test_lowest_effective_priority_runs_first_fifo_among_equals(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make([ONE_CHANNEL])
    model = driver.load_model(0, weight_bytes=1)
    blocker = driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS, job_priority=0)
    driver.advance(1)
    order = [
        driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS, job_priority=p)
        for p in (700, 300, 500, 300, 700)
    ]
    driver.run_until_idle()
    by_priority = [order[1], order[3], order[2], order[0], order[4]]
    assert finish_order(driver.take_events()) == [blocker, *by_priority]


def test_pause_happens_at_the_next_slice_boundary_and_no_work_is_lost(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make([DeviceSpec(channels=1, slice_us=1000)])
    model = driver.load_model(0, weight_bytes=1)
    low = driver.submit(model, uid=1, cost_cycles=10 * CYCLES_PER_MS, job_priority=900)
    driver.advance(2500)
    high = driver.submit(model, uid=1, cost_cycles=2 * CYCLES_PER_MS, job_priority=0)
    driver.run_until_idle()
    events = {(e.id, e.kind, e.reason): e.time_us for e in driver.take_events()}
    assert events[(low, EventKind.ENDED, EndReason.PAUSED)] == 3000
    assert events[(high, EventKind.STARTED, StartReason.INITIAL)] == 3000
    assert events[(high, EventKind.ENDED, EndReason.COMPLETED)] == 5000
    assert events[(low, EventKind.STARTED, StartReason.RESUMED)] == 5000
    # 3 ms done before the pause, 7 ms after it: 10 ms of work in all.
    assert events[(low, EventKind.ENDED, EndReason.COMPLETED)] == 12000


def test_least_important_running_job_is_the_one_paused(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make([DeviceSpec(channels=2, slice_us=1000)])
    model = driver.load_model(0, weight_bytes=1)
    medium = driver.submit(model, uid=1, cost_cycles=10 * CYCLES_PER_MS, job_priority=400)
    low = driver.submit(model, uid=1, cost_cycles=10 * CYCLES_PER_MS, job_priority=800)
    driver.advance(100)
    driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS, job_priority=0)
    driver.run_until_idle()
    paused = [
        e.id
        for e in driver.take_events()
        if e.kind == EventKind.ENDED and e.reason == EndReason.PAUSED
    ]
    assert paused == [low]
    assert medium != low


def test_a_channel_freed_at_a_boundary_is_used_instead_of_pausing(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make([DeviceSpec(channels=2, clock_mhz=1, slice_us=100)])
    model = driver.load_model(0, weight_bytes=1)
    long = driver.submit(model, uid=1, cost_cycles=10_000, job_priority=900)
    driver.submit(model, uid=1, cost_cycles=100, job_priority=800)
    driver.advance(50)
    urgent = driver.submit(model, uid=1, cost_cycles=10, job_priority=0)
    driver.advance(60)
    events = driver.take_events()
    assert all(e.reason != EndReason.PAUSED for e in events), "a free channel was there"
    started = next(e for e in events if e.id == urgent and e.kind == EventKind.STARTED)
    assert started.time_us == 100
    assert long not in {e.id for e in events if e.kind == EventKind.ENDED}


def test_time_stops_short_of_the_horizon(make: Callable[..., SimulatedDriver]) -> None:
    driver = make()
    with pytest.raises(IllegalArgumentError, match="us must be within"):
        driver.advance(1 << 62)
    driver.advance((1 << 62) - 1)
    with pytest.raises(IllegalArgumentError, match="us must be within 0..0"):
        driver.advance(1)


def test_equal_priority_never_preempts(make: Callable[..., SimulatedDriver]) -> None:
    # Under the strict scheduler; fair share time-slices uids (tests/test_fair_scheduling.py).
    driver = make([DeviceSpec(channels=1, slice_us=1000, scheduler="strict")])
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=1, cost_cycles=5 * CYCLES_PER_MS, job_priority=300)
    driver.advance(10)
    driver.submit(model, uid=2, cost_cycles=CYCLES_PER_MS, job_priority=300)
    driver.run_until_idle()
    assert all(e.reason != EndReason.PAUSED for e in driver.take_events())


def test_config_change_reranks_waiting_work(make: Callable[..., SimulatedDriver]) -> None:
    driver = make([ONE_CHANNEL])
    driver.set_scheduling_configs(
        [SchedulingConfig(uid=1, app_priority=100), SchedulingConfig(uid=2, app_priority=400)]
    )
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    driver.advance(1)
    first = driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    second = driver.submit(model, uid=2, cost_cycles=CYCLES_PER_MS)
    driver.update_scheduling_configs([SchedulingConfig(uid=2, app_priority=0)])
    driver.run_until_idle()
    order = finish_order(driver.take_events())
    assert order.index(second) < order.index(first)


def test_periodic_arrivals_are_generated_inside_the_device(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make()
    model = driver.load_model(0, weight_bytes=1)
    driver.add_periodic(
        model, Job(uid=3), cost_cycles=CYCLES_PER_MS, period_us=10 * MS, count=5, burst=2
    )
    driver.run_until_idle()
    events = driver.take_events()
    requested = [e.time_us for e in events if e.kind == EventKind.REQUESTED]
    assert requested == [t * 10 * MS for t in range(5) for _ in range(2)]
    assert len(finish_order(events)) == 10


def test_an_hour_of_device_time_simulates(make: Callable[..., SimulatedDriver]) -> None:
    driver = make()
    model = driver.load_model(0, weight_bytes=1)
    driver.add_periodic(
        model, Job(uid=3), cost_cycles=CYCLES_PER_MS, period_us=60 * 1000 * MS, count=60
    )
    driver.advance(3600 * 1000 * MS)
    assert driver.now_us == 3600 * 1000 * MS
    assert len(finish_order(driver.take_events())) == 60


# Cancel, revoke, faults --------------------------------------------------------------


def test_cancel_queued_and_running_work(make: Callable[..., SimulatedDriver]) -> None:
    driver = make([ONE_CHANNEL])
    model = driver.load_model(0, weight_bytes=1)
    running = driver.submit(model, uid=1, cost_cycles=10 * CYCLES_PER_MS)
    queued = driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    third = driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    driver.advance(MS)
    driver.cancel(queued)
    driver.cancel(running)
    driver.run_until_idle()
    events = driver.take_events()
    assert end_reason(events, queued) == EndReason.CANCELLED_USER
    assert end_reason(events, running) == EndReason.CANCELLED_USER
    assert kinds(events, queued) == [("REQUESTED", ""), ("ENDED", "CANCELLED_USER")]
    started = [e for e in events if e.id == third and e.kind == EventKind.STARTED][0]
    assert started.time_us == MS, "the freed channel is used at once"
    with pytest.raises(UnknownWorkError, match=f"work_id {queued} is not live"):
        driver.cancel(queued)
    with pytest.raises(LookupError):
        driver.cancel(9999)


def test_unloading_a_model_revokes_its_work(make: Callable[..., SimulatedDriver]) -> None:
    driver = make([ONE_CHANNEL])
    victim = driver.load_model(0, weight_bytes=1000)
    other = driver.load_model(0, weight_bytes=500)
    running = driver.submit(victim, uid=1, cost_cycles=10 * CYCLES_PER_MS)
    queued = driver.submit(victim, uid=1, cost_cycles=CYCLES_PER_MS)
    survivor = driver.submit(other, uid=2, cost_cycles=CYCLES_PER_MS)
    driver.advance(MS)
    driver.unload_model(victim)
    assert driver.device_state(0).weight_memory_used_bytes == 500
    driver.run_until_idle()
    events = driver.take_events()
    assert end_reason(events, running) == EndReason.CANCELLED_SYSTEM
    assert end_reason(events, queued) == EndReason.CANCELLED_SYSTEM
    assert end_reason(events, survivor) == EndReason.COMPLETED
    with pytest.raises(UnknownModelError, match=f"model {victim} is not loaded"):
        driver.unload_model(victim)
    with pytest.raises(LookupError):
        driver.submit(victim, uid=1, cost_cycles=1)


def test_injected_fault_fails_the_work(make: Callable[..., SimulatedDriver]) -> None:
    driver = make()
    model = driver.load_model(0, weight_bytes=1)
    work = driver.submit(model, uid=1, cost_cycles=10 * CYCLES_PER_MS)
    driver.advance(MS)
    driver.inject_fault(work)
    driver.run_until_idle()
    assert kinds(driver.take_events(), work)[-1] == ("ENDED", "FAILED")


# Capacity and devices ------------------------------------------------------------------


def test_a_load_that_does_not_fit_leaves_nothing_loaded(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make([DeviceSpec(weight_memory_bytes=1000, sram_bytes=64)])
    driver.load_model(0, weight_bytes=600)
    before = driver.device_state(0)
    with pytest.raises(
        CapacityError, match="weight_bytes 500 does not fit on device 0: 400 of 1000"
    ):
        driver.load_model(0, weight_bytes=500)
    with pytest.raises(CapacityError, match="sram_bytes 65 exceeds"):
        driver.load_model(0, weight_bytes=1, sram_bytes=65)
    assert driver.device_state(0) == before
    assert driver.load_model(0, weight_bytes=400) > 0, "exactly the free space still fits"


def test_devices_are_numbered_and_independent(make: Callable[..., SimulatedDriver]) -> None:
    driver = make([DeviceSpec(channels=1), DeviceSpec(channels=1), DeviceSpec(channels=2)])
    assert [d.number for d in driver.describe_devices()] == [0, 1, 2]
    models = [driver.load_model(n, weight_bytes=1) for n in range(3)]
    works = [driver.submit(m, uid=1, cost_cycles=CYCLES_PER_MS) for m in models]
    driver.run_until_idle()
    events = driver.take_events()
    assert {e.id: e.device_number for e in events} == dict(zip(works, [0, 1, 2], strict=True))
    assert all(e.time_us == 0 for e in events if e.kind == EventKind.STARTED), (
        "each device runs its own work at once"
    )
    with pytest.raises(UnknownDeviceError, match="device 3 does not exist; devices are 0..2"):
        driver.load_model(3, weight_bytes=1)


def test_sram_in_use_follows_running_work(make: Callable[..., SimulatedDriver]) -> None:
    driver = make([DeviceSpec(channels=2, sram_bytes=1000)])
    model = driver.load_model(0, weight_bytes=1, sram_bytes=300)
    driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    driver.advance(1)
    state = driver.device_state(0)
    assert state.sram_used_bytes == 600
    assert state.queue_depth == 0
    assert all(work > 0 for work in state.running)
    driver.run_until_idle()
    assert driver.device_state(0).sram_used_bytes == 0


# Thermal -------------------------------------------------------------------------------

HOT = ThermalSpec(
    ambient_mc=30_000,
    tick_us=1000,
    heat_per_busy_channel_mc=500,
    cooling_permille=10,
    thresholds_mc=(40_000, 45_000, 50_000, 55_000, 60_000, 65_000),
    throttle_percent=(100, 50, 50, 25, 25, 10),
)


def test_busy_channels_heat_the_device_and_it_cools_when_idle(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make([DeviceSpec(channels=1, thermal=HOT)])
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=1, cost_cycles=10 * CYCLES_PER_MS)
    driver.advance(10 * MS)
    hot = driver.device_state(0).temperature_mc
    assert hot > 30_000
    driver.advance(100 * MS)
    cooler = driver.device_state(0)
    assert 30_000 <= cooler.temperature_mc < hot
    assert cooler.peak_temperature_mc == hot


def test_throttling_slows_the_clock(make: Callable[..., SimulatedDriver]) -> None:
    driver = make([DeviceSpec(channels=1, thermal=HOT)])
    model = driver.load_model(0, weight_bytes=1)
    driver.add_heat(0, 16_000)  # 46 C: MODERATE, half speed
    assert driver.device_state(0).severity == ThermalSeverity.MODERATE
    work = driver.submit(model, uid=1, cost_cycles=4 * CYCLES_PER_MS)
    driver.run_until_idle()
    events = [e for e in driver.take_events() if e.id == work]
    duration = events[-1].time_us - events[1].time_us
    assert duration > 4 * MS
    assert driver.device_state(0).throttled_us > 0


def test_shutdown_fails_everything_and_refuses_work_until_cool(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make([DeviceSpec(channels=1, thermal=HOT)])
    model = driver.load_model(0, weight_bytes=1)
    running = driver.submit(model, uid=1, cost_cycles=100 * CYCLES_PER_MS)
    queued = driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    driver.advance(MS)
    driver.add_heat(0, 40_000)
    assert driver.device_state(0).shutdown
    refused = driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    driver.advance(MS)
    events = driver.take_events()
    assert end_reason(events, running) == EndReason.FAILED
    assert end_reason(events, queued) == EndReason.FAILED
    assert kinds(events, refused) == [("REQUESTED", ""), ("ENDED", "FAILED")]
    driver.advance(500 * MS)
    assert not driver.device_state(0).shutdown
    accepted = driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    driver.run_until_idle()
    assert end_reason(driver.take_events(), accepted) == EndReason.COMPLETED


# The HAL surface -----------------------------------------------------------------------


def test_invalid_configs_are_illegal_arguments_and_nothing_is_applied(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make()
    good = SchedulingConfig(uid=1, app_priority=100)
    driver.set_scheduling_configs([good])
    with pytest.raises(
        IllegalArgumentError, match=r"configs\[1\]: appPriority: must be a priority"
    ):
        driver.set_scheduling_configs([{"uid": 2, "appPriority": 5}, {"uid": 3, "appPriority": -1}])
    with pytest.raises(IllegalArgumentError, match="configs.0. and configs.1. are both for uid 4"):
        driver.update_scheduling_configs(
            [SchedulingConfig(uid=4, app_priority=1), SchedulingConfig(uid=4, app_priority=2)]
        )
    assert driver.scheduling_configs == {1: good}


def test_set_replaces_update_upserts_empty_clears(make: Callable[..., SimulatedDriver]) -> None:
    driver = make()
    driver.set_scheduling_configs([SchedulingConfig(uid=1, app_priority=100)])
    driver.update_scheduling_configs([SchedulingConfig(uid=2, app_priority=200)])
    assert sorted(driver.scheduling_configs) == [1, 2]
    driver.set_scheduling_configs([SchedulingConfig(uid=3, app_priority=300)])
    assert sorted(driver.scheduling_configs) == [3]
    driver.set_scheduling_configs([])
    model = driver.load_model(0, weight_bytes=1)
    work = driver.submit(model, uid=3, cost_cycles=1, job_priority=7)
    assert [e for e in driver.take_events() if e.id == work][0].effective_priority == 1007


def test_callback_gets_validated_work_info_debounced_by_default(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make()
    recorder = Recorder()
    driver.set_callback(recorder)
    assert driver.debounce_duration_ms == 50
    model = driver.load_model(0, weight_bytes=1)
    for _ in range(3):
        driver.submit(
            model,
            uid=5,
            cost_cycles=CYCLES_PER_MS,
            group_id="12345678-90ab-cdef-1122-334455667788",
            feature_id="f",
        )
        driver.run_until_idle()
    names = [name for name, _, _ in recorder.calls]
    assert names[:2] == ["requested", "started"]
    assert names.count("ended") <= 3
    assert all(isinstance(info, WorkInfo) for _, info, _ in recorder.calls)
    assert str(recorder.calls[0][1].group_id) == "12345678-90ab-cdef-1122-334455667788"
    assert recorder.calls[0][1].debug_feature_id == "f"


def test_debounce_zero_gives_raw_events_and_none_clears(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make()
    recorder = Recorder()
    driver.set_callback(recorder, debounce_duration_ms=0)
    model = driver.load_model(0, weight_bytes=1)
    for _ in range(3):
        driver.submit(model, uid=5, cost_cycles=CYCLES_PER_MS)
    driver.run_until_idle()
    assert [name for name, _, _ in recorder.calls].count("started") == 3
    driver.set_callback(None)
    driver.submit(model, uid=5, cost_cycles=CYCLES_PER_MS)
    driver.run_until_idle()
    assert len(recorder.calls) == 9
    assert len(driver.take_events()) == 3, "with no callback, events wait for take_events"


def test_a_raising_callback_is_isolated(make: Callable[..., SimulatedDriver]) -> None:
    driver = make()

    class Broken(Recorder):
        def on_work_started(self, info: WorkInfo, reason: StartReason) -> None:
            raise RuntimeError("boom")

    broken = Broken()
    driver.set_callback(broken, debounce_duration_ms=0)
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=5, cost_cycles=CYCLES_PER_MS)
    driver.run_until_idle()
    assert driver.callback_errors == 1
    assert [name for name, _, _ in broken.calls] == ["requested", "ended"]


def test_set_callback_rejects_bad_arguments(make: Callable[..., SimulatedDriver]) -> None:
    driver = make()
    with pytest.raises(IllegalArgumentError, match="debounce_duration_ms must be >= 0"):
        driver.set_callback(Recorder(), debounce_duration_ms=-1)
    with pytest.raises(IllegalArgumentError, match="callback must have on_work_requested"):
        driver.set_callback(object())  # type: ignore[arg-type]


# Bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda d, m: d.submit(m, uid=1, cost_cycles=-5), IllegalArgumentError, "cost_cycles"),
        (lambda d, m: d.submit(m, uid=1, cost_cycles=0), IllegalArgumentError, "cost_cycles"),
        (lambda d, m: d.submit(m, uid=-1, cost_cycles=5), IllegalArgumentError, "uid"),
        (
            lambda d, m: d.submit(m, uid=1, cost_cycles=5, job_priority=1001),
            IllegalArgumentError,
            "job_priority must be within 0..1000",
        ),
        (
            lambda d, m: d.submit(m, uid=1, cost_cycles=5, job_priority="9"),
            IllegalArgumentError,
            "job_priority must be an int",
        ),
        (lambda d, m: d.submit(m + 99, uid=1, cost_cycles=5), UnknownModelError, "is not loaded"),
        (
            lambda d, m: d.submit(m, uid=1, cost_cycles=5, group_id="nope"),
            IllegalArgumentError,
            "group_id",
        ),
        (lambda d, m: d.load_model(7, weight_bytes=1), UnknownDeviceError, "device 7"),
        (lambda d, m: d.load_model(0, weight_bytes=-1), IllegalArgumentError, "weight_bytes"),
        (lambda d, m: d.cancel(12345), UnknownWorkError, "work_id 12345"),
        (lambda d, m: d.inject_fault(-3), IllegalArgumentError, "work_id"),
        (lambda d, m: d.advance(-1), IllegalArgumentError, "us must be within"),
        (
            lambda d, m: d.add_periodic(m, Job(uid=1), cost_cycles=1, period_us=0, count=1),
            IllegalArgumentError,
            "period_us",
        ),
        (
            lambda d, m: d.add_periodic(
                m, Job(uid=1), cost_cycles=1, period_us=1, count=1, start_us=-1
            ),
            IllegalArgumentError,
            "start_us",
        ),
    ],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(
    make: Callable[..., SimulatedDriver], call: Any, error: type[Exception], message: str
) -> None:
    driver = make()
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=1, cost_cycles=CYCLES_PER_MS)
    driver.advance(10)
    before = (driver.device_state(0), driver.take_events())
    with pytest.raises(error, match=message):
        call(driver, model)
    assert (driver.device_state(0), driver.take_events()) == (before[0], [])


def test_closed_driver_refuses_calls(make: Callable[..., SimulatedDriver]) -> None:
    driver = make()
    driver.close()
    driver.close()
    with pytest.raises(DriverClosedError):
        driver.load_model(0, weight_bytes=1)
