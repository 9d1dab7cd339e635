"""Telemetry from the service: model-load steps, work events, device health, sink isolation."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.daemon_support import WAIT_S
from npumanager import (
    DeviceSample,
    Importance,
    ModelLoadRequest,
    ModelLoadRequested,
    ModelLoadState,
    ModelLoadStateChanged,
    ModelSize,
    Service,
    SinkStats,
    ThermalSeverity,
    UnloadReason,
    WorkEvent,
)
from npumanager.core.driver.debounce import Debouncer
from npumanager.errors import IllegalArgumentError, UnknownPluginError
from npumanager.plugins.sinks import MemorySink
from npumanager.schemas.limits import HEALTH_SAMPLE_INTERVAL_MS

BIG = ModelSize.GREATER_THAN_2G
MIB = 1 << 20


class Obedient:
    """Loads on CAN_LOAD_NOW and unloads when asked."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def on_can_load_model(self, request: ModelLoadRequest, status: int, listener: Any) -> None:
        if status == 0:
            self.model = self.manager.load_model(request, weight_bytes=64 * MIB)
            listener.notify_model_loaded(request)

    def on_request_unload_model(self, request: ModelLoadRequest, reason: Any = None) -> None:
        self.manager.listener.notify_model_unloaded(request)

    def on_model_load_request_complete(self, request: ModelLoadRequest, status: int) -> None:
        pass


def big(request_id: int) -> ModelLoadRequest:
    return ModelLoadRequest.Builder(request_id).set_size(BIG).build()


def of(sink: MemorySink, kind: type) -> list[Any]:
    return [event for event in sink.events if type(event) is kind]


def test_every_step_of_a_turn_taking_flow_reaches_the_sink() -> None:
    sink = MemorySink()
    with Service("vnpu", "turn_taking", clock="virtual", sinks=[sink]) as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        background, foreground = svc.manager(10002, uses_feature=True), svc.manager(10001)
        foreground.declare_feature()
        background.request_can_load_model(big(1), Obedient(background))
        svc.advance(5)
        foreground.request_can_load_model(big(2), Obedient(foreground))
    requested = of(sink, ModelLoadRequested)
    assert [(e.uid, e.request_id, e.size) for e in requested] == [(10002, 1, BIG), (10001, 2, BIG)]
    steps = [(e.uid, ModelLoadState(e.state)) for e in of(sink, ModelLoadStateChanged)]
    assert steps == [
        (10002, ModelLoadState.CAN_LOAD_NOW),
        (10002, ModelLoadState.LOADED),
        (10002, ModelLoadState.UNLOAD_REQUESTED),
        (10001, ModelLoadState.WAIT_FOR_UNLOAD),
        (10002, ModelLoadState.UNLOADED),
        (10002, ModelLoadState.COMPLETE),
        (10001, ModelLoadState.CAN_LOAD_NOW),
        (10001, ModelLoadState.LOADED),
        (10001, ModelLoadState.REVOKED),  # the service closed with the model still loaded
        (10001, ModelLoadState.COMPLETE),
    ]
    unload = next(e for e in of(sink, ModelLoadStateChanged) if e.state == 11)
    assert unload.unload_reason == UnloadReason.HIGHER_PRIORITY_REQUEST
    times = [e.time_us for e in sink.events if type(e) is not WorkEvent]
    assert times == sorted(times) and times[-1] >= 5000
    assert sink.closed


def test_work_events_reach_a_raw_sink_exactly_as_the_listener_sees_them() -> None:
    sink = MemorySink()
    seen: list[WorkEvent] = []
    with Service("vnpu", clock="virtual") as svc:
        svc.add_listener(seen.extend)
        svc.add_sink(sink)
        app = svc.manager(10001, uses_feature=True)
        with app.reserve(big(1)) as lease:
            model = lease.load_model(weight_bytes=MIB)
            for _ in range(5):
                model.submit(2_000_000)
            svc.run_until_idle()
    assert of(sink, WorkEvent) == seen and len(seen) == 15


def _flood(svc: Service, jobs: int) -> None:
    app = svc.manager(10001, uses_feature=True)
    with app.reserve(big(1)) as lease:
        model = lease.load_model(weight_bytes=MIB)
        for _ in range(jobs):
            model.submit(1_000_000)
            svc.advance(3)
        svc.advance(200)


@settings(max_examples=15, deadline=None)
@given(window=st.integers(0, 120), jobs=st.integers(1, 12))
def test_a_debounced_sink_gets_what_the_debouncer_lets_through(window: int, jobs: int) -> None:
    raw, debounced = MemorySink(), MemorySink()
    with Service("vnpu", clock="virtual") as svc:
        svc.add_sink(raw)
        svc.add_sink(debounced, debounce_duration_ms=window)
        _flood(svc, jobs)
        before_close = of(debounced, WorkEvent)
    model = Debouncer(window)
    expected = model.feed(of(raw, WorkEvent)) + model.flush_all()
    assert of(debounced, WorkEvent) == expected
    # 200 ms after the last job every held ENDED has fallen due: released at a step, not
    # only at close.
    assert before_close == expected


def test_debounce_collapses_back_to_back_runs_to_one_start_and_one_end() -> None:
    sink = MemorySink()
    with Service("vnpu", clock="virtual") as svc:
        svc.add_sink(sink, debounce_duration_ms=50)
        _flood(svc, 10)
        kinds = [e.kind for e in of(sink, WorkEvent)]
    assert kinds == [0, 1, 2]


def test_device_health_is_sampled_on_a_period_and_at_every_change() -> None:
    sink = MemorySink()
    with Service("vnpu", "pressure", clock="virtual", sinks=[sink]) as svc:
        svc.advance(100)
        svc.add_heat(0, 40_000)
        svc.advance(100)
    samples = of(sink, DeviceSample)
    assert samples[0].time_us == 0 and samples[0].severity == ThermalSeverity.NONE
    gaps = [b.time_us - a.time_us for a, b in itertools.pairwise(samples)]
    assert max(gaps) <= HEALTH_SAMPLE_INTERVAL_MS * 1000
    assert len(samples) < 200 // HEALTH_SAMPLE_INTERVAL_MS + 10, "not one a millisecond"
    heated = next(s for s in samples if s.temperature_mc > 70_000)
    assert heated.time_us == 100_000, "a severity change is sampled at once"
    assert heated.severity >= ThermalSeverity.MODERATE
    assert all(s.weight_memory_bytes == 6 << 30 and s.busy_channels == 0 for s in samples)


def test_a_failing_sink_is_counted_and_breaks_nothing() -> None:
    class Broken:
        def handle(self, batch: Any) -> None:
            raise RuntimeError("disk on fire")

    good = MemorySink()
    with Service("vnpu", clock="virtual") as svc:
        broken = svc.add_sink(Broken())
        svc.add_sink(good)
        _flood(svc, 3)
        stats = svc.sink_stats()
    assert stats["Broken"].failed == stats["MemorySink"].delivered > 0
    assert stats["Broken"].delivered == 0 and broken.name == "Broken"
    assert len(good.events) == stats["MemorySink"].delivered


def test_a_stuck_sink_on_the_real_clock_drops_what_does_not_fit_and_blocks_nothing() -> None:
    release = threading.Event()
    entered = threading.Event()

    class Stuck:
        def handle(self, batch: Any) -> None:
            entered.set()
            release.wait(4 * WAIT_S)  # stuck until the test ends: outlasts its waits

    fast = MemorySink()
    svc = Service("vnpu", clock="real")
    try:
        stuck = svc.add_sink(Stuck(), queue_size=4)
        svc.add_sink(fast)
        app = svc.manager(10001, uses_feature=True)
        with app.reserve(big(1), timeout_s=WAIT_S) as lease:
            model = lease.load_model(weight_bytes=MIB)
            ids = [model.submit(1000) for _ in range(30)]
            assert entered.wait(WAIT_S)
            assert _wait(lambda: _ended(fast) >= set(ids))
        stats = svc.sink_stats()[stuck.name]
        assert stats.dropped > 0 and stats.delivered == 0
    finally:
        release.set()
        svc.close()
    final = svc.sink_stats()
    assert final == {}
    assert stuck.stats().delivered + stuck.stats().dropped > 0


def _ended(sink: MemorySink) -> set[int]:
    return {e.id for e in of(sink, WorkEvent) if e.kind == 2}


def _wait(predicate: Any, timeout: float = WAIT_S) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return True
        done.wait(0.01)
    return bool(predicate())


def test_sinks_by_name_with_options_and_the_mistakes_one_can_make(tmp_path: Any) -> None:
    with Service("vnpu", clock="virtual") as svc:
        handle = svc.add_sink("jsonl", path=tmp_path / "e.jsonl")
        assert handle.name == "jsonl" and svc.add_sink("memory").name == "memory"
        assert svc.add_sink("memory").name == "memory#2"
        with pytest.raises(UnknownPluginError, match="unknown sink 'nope'; available: .*jsonl"):
            svc.add_sink("nope")
        with pytest.raises(IllegalArgumentError, match="sink 'jsonl': .*unexpected keyword"):
            svc.add_sink("jsonl", colour="red")
        with pytest.raises(IllegalArgumentError, match="options .* are for a sink given by name"):
            svc.add_sink(MemorySink(), path="x")
        with pytest.raises(IllegalArgumentError, match="must have a handle"):
            svc.add_sink(object())
        with pytest.raises(IllegalArgumentError, match="debounce_duration_ms must be within"):
            svc.add_sink("memory", debounce_duration_ms=-1)
        with pytest.raises(IllegalArgumentError, match="queue_size must be within"):
            svc.add_sink("memory", queue_size=0)
        svc.remove_sink(handle)
        assert set(svc.sink_stats()) == {"memory", "memory#2"}
        assert isinstance(svc.sink_stats()["memory"], SinkStats)
