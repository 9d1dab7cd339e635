"""Differential test: the C engine (`vnpu`, virtual clock) against the Python oracle.

Random workloads run op by op on `ReferenceDriver` and `VnpuDriver`; after every op both
must have returned the same value or raised the same error, and hold the same events,
device readings, clock, next event point and idleness. Devices are small and hot so that
preemption, throttling and SHUTDOWN happen; they schedule strict or fair, with several
band maps and floors, and workloads hold backlogs of one uid and saturating periodic
foregrounds; a separate test checks that all of that happens.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from npumanager import EndReason, StartReason, ThermalSeverity
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.driver.job import Job
from npumanager.schemas.device import DEFAULT_BANDS, Band, DeviceSpec, Scheduler, ThermalSpec
from npumanager.vendor_drivers.reference import ReferenceDriver
from npumanager.vendor_drivers.simulated import SimulatedDriver
from npumanager.vendor_drivers.vnpu import VnpuDriver

UIDS = [0, 1000, 10001, 10002, 10003, 10004]
GROUPS: list[Any] = [
    None,
    uuid.UUID(int=1),
    uuid.UUID(int=2).bytes,
    str(uuid.UUID(int=3)),
]
FEATURES = [None, "camera", "assistant", "keyboard"]
AMBIENT = 35_000
BAND_MAPS = [
    DEFAULT_BANDS,
    (Band(name="high", first_priority=0), Band(name="low", first_priority=1200)),
    (Band(name="one", first_priority=0),),
    tuple(Band(name=f"b{n}", first_priority=n * 250) for n in range(8)),
]

Op = tuple[Any, ...]


@st.composite
def thermal_specs(draw: st.DrawFn) -> ThermalSpec:
    step = draw(st.sampled_from([2_000, 5_000, 10_000]))
    return ThermalSpec(
        ambient_mc=AMBIENT,
        tick_us=draw(st.sampled_from([50, 100, 250, 1000])),
        heat_per_busy_channel_mc=draw(st.sampled_from([0, 100, 500, 2_000])),
        cooling_permille=draw(st.sampled_from([1, 10, 50, 300, 1000])),
        thresholds_mc=tuple(AMBIENT + step * (i + 1) for i in range(6)),
        throttle_percent=draw(
            st.sampled_from([(100, 80, 60, 40, 20, 10), (90, 70, 50, 30, 15, 5), (100,) * 6])
        ),
    )


@st.composite
def device_specs(draw: st.DrawFn) -> DeviceSpec:
    return DeviceSpec(
        channels=draw(st.integers(1, 3)),
        sram_bytes=draw(st.sampled_from([64, 1000])),
        weight_memory_bytes=draw(st.sampled_from([100, 1000])),
        clock_mhz=draw(st.sampled_from([1, 3, 10])),
        slice_us=draw(st.sampled_from([7, 50, 200, 1000])),
        thermal=draw(thermal_specs()),
        scheduler=draw(st.sampled_from([Scheduler.FAIR, Scheduler.FAIR, Scheduler.STRICT])),
        bands=draw(st.sampled_from(BAND_MAPS)),
        floor_percent=draw(st.sampled_from([10, 0, 30, 50, 1])),
        floor_window_us=draw(st.sampled_from([100_000, 40, 1_000, 7])),
    )


configs = st.builds(
    dict,
    uid=st.sampled_from([*UIDS, 10005]),
    app_priority=st.sampled_from([0, 100, 200, 400, 1000]),
    min_priority=st.sampled_from([0, 0, 200]),
    max_priority=st.sampled_from([1000, 1000, 500]),
    has_direct_access=st.sampled_from([True, True, True, False]),
    can_attribute_other_uid=st.booleans(),
)
priorities = st.sampled_from([500, 0, 100, 250, 1000]) | st.integers(0, 1000)
refs = st.integers(0, 2) | st.integers(0, 6)
"""An index into the models (or recent work ids) seen so far; past the end, an unknown one."""

OPS: dict[str, st.SearchStrategy[Op]] = {
    "set_configs": st.tuples(st.just("set_configs"), st.lists(configs, max_size=4)),
    "update_configs": st.tuples(st.just("update_configs"), st.lists(configs, max_size=3)),
    "load": st.tuples(
        st.just("load"),
        st.integers(0, 3),
        st.sampled_from([0, 10, 60, 400, 2000]),
        st.sampled_from([0, 8, 64, 500, 5000]),
    ),
    "unload": st.tuples(st.just("unload"), refs),
    "submit": st.tuples(
        st.just("submit"),
        refs,
        st.sampled_from(UIDS),
        st.none() | st.sampled_from(UIDS),
        priorities,
        st.sampled_from([3000, 1, 10, 100, 500, 20_000]) | st.integers(1, 5000),
        st.sampled_from(GROUPS),
        st.sampled_from(FEATURES),
        st.integers(-5, 5),
    ),
    "periodic": st.tuples(
        st.just("periodic"),
        refs,
        st.sampled_from(UIDS),
        st.none() | st.sampled_from(UIDS),
        priorities,
        st.integers(1, 800),
        st.sampled_from([1, 30, 100, 700]),
        st.integers(0, 300),
        st.integers(1, 5),
        st.integers(1, 3),
        st.sampled_from(GROUPS),
        st.sampled_from(FEATURES),
    ),
    "cancel": st.tuples(st.just("cancel"), refs),
    "fault": st.tuples(st.just("fault"), refs),
    "heat": st.tuples(
        st.just("heat"),
        st.integers(0, 3),
        st.sampled_from([5_000, 15_000, 30_000, 40_000, -20_000, -40_000])
        | st.integers(-40_000, 40_000),
    ),
    "advance": st.tuples(
        st.just("advance"), st.sampled_from([50, 0, 1, 7]) | st.integers(0, 3_000)
    ),
    "run_until_idle": st.tuples(st.just("run_until_idle"), st.integers(0, 20_000)),
}
KINDS = st.sampled_from(
    ["contend"] * 2
    + ["backlog", "saturate"]
    + ["submit"] * 8
    + ["advance"] * 6
    + ["periodic"] * 2
    + ["cancel", "unload"] * 2
    + ["set_configs", "update_configs", "load", "fault", "heat", "run_until_idle"]
)
"""Which op comes next, weighted towards the ones that make work happen."""


@st.composite
def contention(draw: st.DrawFn) -> list[Op]:
    """A long job, a moment, then a more important one: preemption, unless a channel is free."""
    model = draw(refs)
    slow, fast = draw(st.sampled_from(UIDS)), draw(st.sampled_from(UIDS))
    low = draw(st.integers(300, 1000))
    return [
        ("submit", model, slow, None, low, draw(st.integers(500, 20_000)), None, None, 0),
        ("advance", draw(st.integers(0, 300))),
        ("submit", model, fast, None, draw(st.integers(0, low - 1)), 300, None, "urgent", 1),
        ("advance", draw(st.integers(0, 2000))),
    ]


@st.composite
def backlog(draw: st.DrawFn) -> list[Op]:
    """One uid queues several jobs of one priority at once: FIFO within it, shares across."""
    model, uid, prio = draw(refs), draw(st.sampled_from(UIDS)), draw(priorities)
    cost = draw(st.sampled_from([40, 300, 2000]))
    return [("submit", model, uid, None, prio, cost, None, None, 0)] * draw(st.integers(3, 8))


@st.composite
def saturation(draw: st.DrawFn) -> list[Op]:
    """A foreground that keeps the device busy, and a less important uid under it."""
    model = draw(refs)
    fg, bg = draw(st.sampled_from(UIDS)), draw(st.sampled_from(UIDS))
    return [
        ("periodic", model, fg, None, 0, draw(st.integers(100, 800)), 100, 0, 30, 2, None, None),
        ("submit", model, bg, None, 1000, draw(st.integers(50, 3000)), None, None, 0),
        ("advance", draw(st.integers(500, 3000))),
    ]


def op_lists(kind: str) -> st.SearchStrategy[list[Op]]:
    """The ops one drawn kind stands for."""
    if kind == "contend":
        return contention()
    if kind == "backlog":
        return backlog()
    if kind == "saturate":
        return saturation()
    return OPS[kind].map(lambda op: [op])


@dataclass
class Workload:
    """What one example runs: the devices, the driver's limits, and the ops."""

    specs: list[DeviceSpec]
    max_live_work: int
    max_models: int
    event_capacity: int
    ops: list[Op]


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    specs = draw(st.lists(device_specs(), min_size=1, max_size=3))
    # Models that fit first, one per device, so most submits find one.
    loads: list[Op] = [("load", n, draw(st.integers(0, 50)), 0) for n in range(len(specs))]
    return Workload(
        specs=specs,
        max_live_work=draw(st.sampled_from([64, 4, 16])),
        max_models=draw(st.sampled_from([2, 8])),
        event_capacity=draw(st.sampled_from([1, 3, 16, 1 << 16])),
        ops=loads
        + [
            op
            for kind in draw(st.lists(KINDS, min_size=8, max_size=40))
            for op in draw(op_lists(kind))
        ],
    )


class Runner:
    """One driver under a workload, resolving model and work references as it goes."""

    def __init__(self, driver: SimulatedDriver) -> None:
        self.driver = driver
        self.models: list[int] = []
        self.work: list[int] = []
        self.events: list[WorkEvent] = []

    def _model(self, ref: int) -> int:
        return self.models[ref] if ref < len(self.models) else 100 + ref

    def _work(self, ref: int) -> int:
        return self.work[-1 - ref] if ref < len(self.work) else 10_000 + ref

    def apply(self, op: Op) -> Any:
        d = self.driver
        name, *args = op
        if name == "set_configs":
            return d.set_scheduling_configs(args[0])
        if name == "update_configs":
            return d.update_scheduling_configs(args[0])
        if name == "load":
            device, weight, sram = args
            model = d.load_model(device, weight_bytes=weight, sram_bytes=sram)
            self.models.append(model)
            return model
        if name == "unload":
            return d.unload_model(self._model(args[0]))
        if name == "submit":
            ref, uid, original, prio, cost, group, feature, pid = args
            return d.submit(
                self._model(ref),
                uid=uid,
                original_uid=original,
                job_priority=prio,
                cost_cycles=cost,
                group_id=group,
                feature_id=feature,
                debug_pid=pid,
            )
        if name == "periodic":
            ref, uid, original, prio, cost, period, start, count, burst, group, feature = args
            return d.add_periodic(
                self._model(ref),
                Job(
                    uid=uid,
                    original_uid=original,
                    job_priority=prio,
                    group_id=group,
                    feature_id=feature,
                ),
                cost_cycles=cost,
                period_us=period,
                start_us=d.now_us + start,
                count=count,
                burst=burst,
            )
        if name == "cancel":
            return d.cancel(self._work(args[0]))
        if name == "fault":
            return d.inject_fault(self._work(args[0]))
        if name == "heat":
            return d.add_heat(args[0], args[1])
        if name == "advance":
            return d.advance(args[0])
        assert name == "run_until_idle"
        return d.run_until_idle(args[0])

    def step(self, op: Op) -> tuple[Any, ...]:
        """Apply one op; everything observable afterwards."""
        try:
            outcome: tuple[Any, ...] = ("ok", self.apply(op))
        except Exception as exc:  # the same class and message on both sides
            outcome = ("raised", type(exc), str(exc))
        events = self.driver.take_events()
        self.events += events
        self.work += [e.id for e in events if e.kind == EventKind.REQUESTED]
        engine = self.driver.engine
        return (
            outcome,
            events,
            [self.driver.device_state(n) for n in range(self.driver.device_count)],
            self.driver.now_us,
            engine.next_event_us(),
            engine.idle(),
        )


def drivers(w: Workload) -> tuple[ReferenceDriver, VnpuDriver]:
    reference = ReferenceDriver(w.specs, max_live_work=w.max_live_work, max_models=w.max_models)
    vnpu = VnpuDriver(
        w.specs,
        max_live_work=w.max_live_work,
        max_models=w.max_models,
        event_capacity=w.event_capacity,
    )
    return reference, vnpu


@settings(
    max_examples=1200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(workloads())
def test_vnpu_matches_the_reference_op_by_op(w: Workload) -> None:
    reference, vnpu = drivers(w)
    expected, actual = Runner(reference), Runner(vnpu)
    try:
        for index, op in enumerate(w.ops):
            want, got = expected.step(op), actual.step(op)
            assert got == want, f"op {index} {op!r} diverged"
    finally:
        vnpu.close()


def observed(events: list[WorkEvent], driver: SimulatedDriver) -> Counter[str]:
    """What interesting behaviour a run showed."""
    seen: Counter[str] = Counter()
    for e in events:
        if e.kind == EventKind.ENDED and e.reason == EndReason.PAUSED:
            seen["paused"] += 1
        if e.kind == EventKind.STARTED and e.reason == StartReason.RESUMED:
            seen["resumed"] += 1
        if e.kind == EventKind.ENDED and e.reason == EndReason.COMPLETED:
            seen["completed"] += 1
        if e.kind == EventKind.ENDED and e.reason == EndReason.CANCELLED_SYSTEM:
            seen["cancelled_system"] += 1
    seen.update(fair_moments(events, driver.specs))
    for n in range(driver.device_count):
        state = driver.device_state(n)
        if state.throttled_us > 0:
            seen["throttled"] += 1
        if state.peak_temperature_mc >= driver.specs[n].thermal.thresholds_mc[-1]:
            seen["shutdown"] += 1
        if state.severity >= ThermalSeverity.SEVERE:
            seen["severe_at_end"] += 1
    return seen


def fair_moments(events: list[WorkEvent], specs: list[DeviceSpec]) -> Counter[str]:
    """Fair-scheduler moments: a floor turn (a job starts while a job of a more important
    band waits) and a time slice (a job pauses while none of a more important band waits)."""
    seen: Counter[str] = Counter()
    waiting: dict[int, dict[int, int]] = {n: {} for n in range(len(specs))}
    for e in events:
        spec, here = specs[e.device_number], waiting[e.device_number]
        if spec.scheduler != Scheduler.FAIR:
            continue
        band = spec.band_of(e.effective_priority)
        better = any(spec.band_of(p) < band for i, p in here.items() if i != e.id)
        if e.kind == EventKind.STARTED:
            seen["floor_turn"] += better
            here.pop(e.id, None)
        elif e.kind == EventKind.REQUESTED or e.reason == EndReason.PAUSED:
            seen["time_slice"] += e.kind == EventKind.ENDED and not better
            here[e.id] = e.effective_priority
        else:
            here.pop(e.id, None)
    return seen


def test_the_workloads_reach_preemption_throttling_and_shutdown() -> None:
    seen: Counter[str] = Counter()

    # A fixed seed: derandomize's follows where the test file lies, and a clean clone's
    # place drew 300 workloads with no floor turn in them; this seed's 500 show 76 here.
    @seed(20261204)
    @settings(max_examples=500, database=None, deadline=None)
    @given(workloads())
    def run(w: Workload) -> None:
        driver = VnpuDriver(w.specs, max_live_work=w.max_live_work, max_models=w.max_models)
        runner = Runner(driver)
        for op in w.ops:
            runner.step(op)
        seen.update(observed(runner.events, driver))
        driver.close()

    run()
    wanted = ("paused", "resumed", "completed", "cancelled_system", "throttled", "shutdown")
    for what in (*wanted, "floor_turn", "time_slice"):
        assert seen[what] > 0, f"no generated workload showed {what}: {dict(seen)}"


def test_identical_behaviour_with_a_callback_and_debouncing() -> None:
    """The same workload delivered through the debouncer reaches both callbacks alike."""

    class Batches:
        def __init__(self) -> None:
            self.events: list[WorkEvent] = []

        def on_work_events(self, events: list[WorkEvent]) -> None:
            self.events += events

    spec = DeviceSpec(channels=2, clock_mhz=1, slice_us=100)
    results = []
    factories: list[Callable[..., SimulatedDriver]] = [ReferenceDriver, VnpuDriver]
    for factory in factories:
        driver = factory([spec, spec])
        sink = Batches()
        driver.set_callback(sink)
        model = driver.load_model(1, weight_bytes=1)
        driver.add_periodic(
            model, Job(uid=10001), cost_cycles=150, period_us=120, count=20, burst=2
        )
        driver.submit(model, uid=0, cost_cycles=2000, job_priority=0)
        driver.run_until_idle()
        results.append(sink.events)
        driver.close()
    assert results[0] == results[1]
    assert results[0]
