"""The fair scheduler's rules on both simulated engines, with exact virtual-time figures.

One channel at 1 MHz (a cycle a microsecond) and 100 us slices unless a test says so; the
default bands put app priority 100 in `focus`, 300..999 in `normal`, 1000 in `idle`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.schemas import EndReason, SchedulingConfig
from npumanager.schemas.device import (
    DEFAULT_BANDS,
    FAIR_WEIGHT_BASE,
    MAX_BANDS,
    MAX_FLOOR_PERCENT,
    MAX_FLOOR_WINDOW_US,
    Band,
    DeviceSpec,
    Scheduler,
)
from npumanager.simulation.scenario import load_scenario
from npumanager.vendor_drivers.reference import ReferenceDriver
from npumanager.vendor_drivers.simulated import SimulatedDriver
from npumanager.vendor_drivers.vnpu import VnpuDriver
from npumanager.vendor_drivers.vnpu._vnpu import lib

SPEC = DeviceSpec(channels=1, clock_mhz=1, slice_us=100)


@pytest.fixture(params=[ReferenceDriver, VnpuDriver], ids=["reference", "vnpu"])
def make(request: pytest.FixtureRequest) -> Iterator[Callable[..., SimulatedDriver]]:
    made: list[SimulatedDriver] = []

    def build(*specs: DeviceSpec, configs: dict[int, int] | None = None) -> SimulatedDriver:
        driver: SimulatedDriver = request.param(list(specs) or [SPEC])
        driver.set_scheduling_configs(
            [SchedulingConfig(uid=u, app_priority=p) for u, p in (configs or {}).items()]
        )
        made.append(driver)
        return driver

    yield build
    for driver in made:
        driver.close()


def completions(events: list[WorkEvent]) -> list[tuple[int, int]]:
    """(work id, time) of every completion, in order."""
    return [
        (e.id, e.time_us)
        for e in events
        if e.kind == EventKind.ENDED and e.reason == EndReason.COMPLETED
    ]


def busy_us(events: list[WorkEvent], until: int) -> dict[int, int]:
    """Device time each uid ran, up to `until`."""
    since: dict[int, int] = {}
    busy: dict[int, int] = {}
    for e in events:
        if e.kind == EventKind.STARTED:
            since[e.id] = e.time_us
        elif e.kind == EventKind.ENDED and e.id in since:
            busy[e.uid] = busy.get(e.uid, 0) + e.time_us - since.pop(e.id)
    for e in events:
        if e.id in since and e.kind == EventKind.STARTED:
            busy[e.uid] = busy.get(e.uid, 0) + until - since.pop(e.id)
    return busy


def test_two_equal_uids_take_turns_a_slice_at_a_time(make: Callable[..., SimulatedDriver]) -> None:
    driver = make(configs={1: 100, 2: 100})
    model = driver.load_model(0, weight_bytes=1)
    first = [driver.submit(model, uid=1, cost_cycles=1000) for _ in range(3)]
    second = [driver.submit(model, uid=2, cost_cycles=1000) for _ in range(3)]
    driver.run_until_idle()
    # The second uid's flow starts at the first's virtual runtime; ties keep the runner.
    assert completions(driver.take_events()) == [
        (second[0], 1900),
        (first[0], 2000),
        (second[1], 3900),
        (first[1], 4000),
        (second[2], 5900),
        (first[2], 6000),
    ]


def test_strict_runs_equal_priorities_in_global_fifo(make: Callable[..., SimulatedDriver]) -> None:
    driver = make(SPEC.model_copy(update={"scheduler": Scheduler.STRICT}), configs={1: 100, 2: 100})
    model = driver.load_model(0, weight_bytes=1)
    works = [driver.submit(model, uid=uid, cost_cycles=1000) for uid in (1, 1, 1, 2, 2, 2)]
    driver.run_until_idle()
    assert completions(driver.take_events()) == [(w, 1000 * (n + 1)) for n, w in enumerate(works)]


def test_in_band_priority_weights_the_share(make: Callable[..., SimulatedDriver]) -> None:
    driver = make(configs={1: 300, 2: 300})  # both in `normal`, whose first priority is 300
    model = driver.load_model(0, weight_bytes=1)
    for _ in range(40):
        driver.submit(model, uid=1, cost_cycles=1000, job_priority=0)  # charged 100 / us
        driver.submit(model, uid=2, cost_cycles=1000, job_priority=100)  # charged 200 / us
    driver.advance(30_000)
    busy = busy_us(driver.take_events(), 30_000)
    assert FAIR_WEIGHT_BASE == 100
    assert busy == {1: 20_000, 2: 10_000}


def test_one_uid_runs_its_own_work_in_fifo_order(make: Callable[..., SimulatedDriver]) -> None:
    driver = make(configs={1: 100, 2: 100})
    model = driver.load_model(0, weight_bytes=1)
    mine = [driver.submit(model, uid=1, cost_cycles=300) for _ in range(4)]
    driver.submit(model, uid=2, cost_cycles=2000)
    driver.run_until_idle()
    events = driver.take_events()
    starts = [e.id for e in events if e.kind == EventKind.STARTED and e.uid == 1]
    assert [w for w, _ in completions(events) if w in mine] == mine
    # Each of the uid's jobs starts (and resumes) only once the one before it completed.
    assert starts == sorted(starts)


def test_a_more_important_job_preempts_inside_its_own_uid(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make(configs={1: 300})
    model = driver.load_model(0, weight_bytes=1)
    slow = driver.submit(model, uid=1, cost_cycles=1000, job_priority=500)
    driver.advance(150)
    fast = driver.submit(model, uid=1, cost_cycles=100, job_priority=250)
    driver.run_until_idle()
    assert completions(driver.take_events()) == [(fast, 300), (slow, 1100)]


def test_the_floor_gives_a_starved_band_ten_percent(make: Callable[..., SimulatedDriver]) -> None:
    driver = make(configs={1: 100, 2: 400})
    model = driver.load_model(0, weight_bytes=1)
    for _ in range(10):
        driver.submit(model, uid=1, cost_cycles=1000)
    low = driver.submit(model, uid=2, cost_cycles=300)
    driver.run_until_idle()
    mine = [(e.kind, e.reason, e.time_us) for e in driver.take_events() if e.id == low]
    # One slice in ten: credit +10/us while the focus band runs, -90/us while it runs.
    assert mine == [
        (EventKind.REQUESTED, -1, 0),
        (EventKind.STARTED, 0, 100),
        (EventKind.ENDED, EndReason.PAUSED, 200),
        (EventKind.STARTED, 1, 1100),
        (EventKind.ENDED, EndReason.PAUSED, 1200),
        (EventKind.STARTED, 1, 2100),
        (EventKind.ENDED, EndReason.COMPLETED, 2200),
    ]


def test_a_zero_floor_lets_the_lower_band_wait(make: Callable[..., SimulatedDriver]) -> None:
    driver = make(SPEC.model_copy(update={"floor_percent": 0}), configs={1: 100, 2: 400})
    model = driver.load_model(0, weight_bytes=1)
    for _ in range(10):
        driver.submit(model, uid=1, cost_cycles=1000)
    low = driver.submit(model, uid=2, cost_cycles=300)
    driver.run_until_idle()
    assert completions(driver.take_events())[-1] == (low, 10_300)


def test_a_more_important_band_waits_at_most_one_slice(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make(configs={1: 100, 2: 400})
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=2, cost_cycles=50_000)
    driver.advance(1234)
    urgent = driver.submit(model, uid=1, cost_cycles=10)
    driver.advance(200)
    started = [e.time_us for e in driver.take_events() if e.id == urgent and e.kind == 1]
    assert started == [1300]


def test_the_victim_is_the_least_important_running_job(
    make: Callable[..., SimulatedDriver],
) -> None:
    spec = SPEC.model_copy(update={"channels": 2})
    driver = make(spec, configs={1: 0, 2: 300, 3: 1000})
    model = driver.load_model(0, weight_bytes=1)
    normal = driver.submit(model, uid=2, cost_cycles=10_000)  # channel 0, boundaries 100k
    driver.advance(50)
    idle = driver.submit(model, uid=3, cost_cycles=10_000)  # channel 1, boundaries 50 + 100k
    driver.advance(60)
    urgent = driver.submit(model, uid=1, cost_cycles=10)
    driver.advance(300)
    paused = [e.id for e in driver.take_events() if e.reason == EndReason.PAUSED]
    # The normal job's boundary (200) is not nearer than the idle one's (150), but it
    # is more important: the idle job gives way.
    assert paused == [idle]
    assert normal != urgent


def test_among_equals_the_victim_is_nearest_its_boundary(
    make: Callable[..., SimulatedDriver],
) -> None:
    driver = make(SPEC.model_copy(update={"channels": 2}), configs={1: 100, 2: 400})
    model = driver.load_model(0, weight_bytes=1)
    early = driver.submit(model, uid=2, cost_cycles=10_000)  # boundaries 100, 200, ...
    driver.advance(50)
    later = driver.submit(model, uid=2, cost_cycles=10_000)  # boundaries 150, 250, ...
    driver.advance(110)
    urgent = driver.submit(model, uid=1, cost_cycles=10)
    driver.advance(100)
    events = driver.take_events()
    assert [e.id for e in events if e.reason == EndReason.PAUSED] == [early]
    assert [e.time_us for e in events if e.id == urgent and e.kind == EventKind.STARTED] == [200]
    assert later > early


# The spec --------------------------------------------------------------------------------


def test_bands_are_validated() -> None:
    for bad in (
        [Band(name="a", first_priority=10)],
        [Band(name="a", first_priority=0), Band(name="b", first_priority=0)],
        [Band(name="a", first_priority=0), Band(name="a", first_priority=5)],
        [Band(name=f"b{n}", first_priority=n) for n in range(MAX_BANDS + 1)],
        [],
    ):
        with pytest.raises(ValidationError):
            DeviceSpec(bands=tuple(bad))
    for field, value in (("floor_percent", MAX_FLOOR_PERCENT + 1), ("floor_window_us", 0)):
        with pytest.raises(ValidationError):
            DeviceSpec.model_validate({field: value})
    assert [DeviceSpec().band_of(p) for p in (0, 99, 100, 299, 300, 999, 1000, 2000)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    assert [b.name for b in DEFAULT_BANDS] == ["realtime", "focus", "normal", "idle"]


def test_the_c_engine_shares_the_schema_constants() -> None:
    assert lib.VNPU_MAX_BANDS == MAX_BANDS
    assert lib.VNPU_FAIR_WEIGHT_BASE == FAIR_WEIGHT_BASE
    assert lib.VNPU_MAX_FLOOR_PERCENT == MAX_FLOOR_PERCENT
    assert lib.VNPU_MAX_FLOOR_WINDOW_US == MAX_FLOOR_WINDOW_US


def test_a_scenario_file_sets_the_scheduling_fields(tmp_path: Path) -> None:
    path = tmp_path / "bands.toml"
    path.write_text(
        """
name = "bands"
duration_ms = 100

[[devices]]
channels = 1
scheduler = "strict"
floor_percent = 0
floor_window_us = 5000
bands = [{name = "top", first_priority = 0}, {name = "rest", first_priority = 500}]

[[apps]]
name = "camera"
uid = 10100
model_bytes = 1024
work = {kind = "loop", cost_us = 1000}
""",
        encoding="utf-8",
    )
    device = load_scenario(path).devices[0]
    assert device.scheduler == Scheduler.STRICT
    assert (device.floor_percent, device.floor_window_us) == (0, 5000)
    assert [b.first_priority for b in device.bands] == [0, 500]


def test_many_uids_coming_and_going_run_alike_on_both_engines() -> None:
    """More uids than vnpu keeps idle flows for (64 a device), their work interleaved."""
    results = []
    for factory in (ReferenceDriver, VnpuDriver):
        driver = factory([SPEC.model_copy(update={"channels": 2})])
        model = driver.load_model(0, weight_bytes=1)
        for n in range(300):
            driver.submit(model, uid=20_000 + n % 97, cost_cycles=30 + n % 7 * 40)
            driver.advance(n % 5 * 30)
        driver.update_scheduling_configs([SchedulingConfig(uid=20_003, app_priority=100)])
        driver.run_until_idle()
        results.append(driver.take_events())
        driver.close()
    assert results[0] == results[1]
    assert sum(e.reason == EndReason.PAUSED for e in results[0]) > 10
