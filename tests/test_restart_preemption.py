"""Restart preemption in the real drivers: a running job of a less important band stopped
with the runtime's cancel and requeued (it starts over), and when it is not.

The normal band is a background one, so each driver keeps its background workers at the
normal OS priority (`background_idle=False`): under `SCHED_IDLE` they get next to no CPU
beside busy programs, and the OS's choice is not what these tests judge."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from helpers.daemon_support import WAIT_S
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.driver.job import Job
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import EndReason, SchedulingConfig
from npumanager.testing.base import lifecycle
from npumanager.vendor_drivers.onnxruntime.driver import OnnxRuntimeDriver

CONFIGS = [
    SchedulingConfig(uid=10, app_priority=400),  # normal band
    SchedulingConfig(uid=20, app_priority=100),  # focus band
]
RESTARTED = [
    ("REQUESTED", ""),
    ("STARTED", "INITIAL"),
    ("ENDED", "PAUSED"),
    ("STARTED", "RESUMED"),
    ("ENDED", "COMPLETED"),
]


def started_running(d: Any, count: int) -> None:
    while d.device_state(0).running.count(-1) > len(d.device_state(0).running) - count:
        d.run_until_idle(max_us=1000)


def paused(events: list[WorkEvent]) -> list[int]:
    return [e.id for e in events if e.kind == EventKind.ENDED and e.reason == EndReason.PAUSED]


def test_an_inline_run_that_is_stopped_starts_over_and_still_returns_its_outputs() -> None:
    with OnnxRuntimeDriver(devices=[{"channels": 1}], background_idle=False) as d:
        d.set_scheduling_configs(CONFIGS)
        model = d.load_timed_model()
        out: list[Any] = []
        app = threading.Thread(
            target=lambda: out.append(
                d.run_inference(model, uid=10, inputs=d.timed_inputs(model, 300))
            )
        )
        app.start()
        started_running(d, 1)
        d.submit_future(model, Job(20), d.timed_inputs(model, 1)).result(timeout=WAIT_S)
        app.join(timeout=WAIT_S)
        assert out and out[0][0].shape[0] > 1
        d.run_until_idle()
        assert lifecycle(d.take_events(), 1) == RESTARTED


def test_two_urgent_jobs_stop_two_running_ones_in_turn() -> None:
    with OnnxRuntimeDriver(
        devices=[{"channels": 2}], reserved_channels=0, background_idle=False
    ) as d:
        d.set_scheduling_configs(CONFIGS)
        model = d.load_timed_model()
        slow = [d.submit(model, uid=10, inputs=d.timed_inputs(model, 300)) for _ in range(2)]
        started_running(d, 2)
        urgent = [d.submit(model, uid=20, inputs=d.timed_inputs(model, 1)) for _ in range(2)]
        d.run_until_idle()
        events = d.take_events()
        assert sorted(paused(events)) == slow
        for work in slow:
            assert lifecycle(events, work) == RESTARTED
        done = [
            e.id for e in events if e.kind == EventKind.ENDED and e.reason == EndReason.COMPLETED
        ]
        assert set(done[:2]) == set(urgent), "both urgent jobs finished first"


def test_turned_off_nothing_is_stopped_and_the_urgent_job_waits() -> None:
    with OnnxRuntimeDriver(
        devices=[{"channels": 1}], restart_preemption=False, background_idle=False
    ) as d:
        d.set_scheduling_configs(CONFIGS)
        model = d.load_timed_model()
        slow = d.submit(model, uid=10, inputs=d.timed_inputs(model, 100))
        started_running(d, 1)
        urgent = d.submit(model, uid=20, inputs=d.timed_inputs(model, 1))
        d.run_until_idle()
        events = d.take_events()
        assert paused(events) == []
        order = [e.id for e in events if e.kind == EventKind.ENDED]
        assert order == [slow, urgent]


def test_a_job_of_the_same_band_is_never_stopped() -> None:
    with OnnxRuntimeDriver(devices=[{"channels": 1}], background_idle=False) as d:
        d.set_scheduling_configs([*CONFIGS, SchedulingConfig(uid=11, app_priority=300)])
        model = d.load_timed_model()
        d.submit(model, uid=10, inputs=d.timed_inputs(model, 100))
        started_running(d, 1)
        d.submit(model, uid=11, inputs=d.timed_inputs(model, 1))  # 300: normal, like 400
        d.run_until_idle()
        assert paused(d.take_events()) == []


def test_an_app_holding_every_channel_gives_its_latest_back_to_another_app_of_its_band() -> None:
    """Two long operations of one app hold both channels; another app's tiny inference of
    the same band waits for neither: the latest started operation starts over."""
    with OnnxRuntimeDriver(
        devices=[{"channels": 2}], reserved_channels=0, background_idle=False
    ) as d:
        d.set_scheduling_configs([*CONFIGS, SchedulingConfig(uid=11, app_priority=300)])
        model = d.load_timed_model()
        long_ops = []
        for _ in range(2):
            long_ops.append(d.submit(model, uid=10, inputs=d.timed_inputs(model, 300)))
            started_running(d, len(long_ops))
        tiny = d.submit(model, uid=11, inputs=d.timed_inputs(model, 1))
        d.run_until_idle()
        events = d.take_events()
        assert paused(events) == [long_ops[1]], "the latest started gave its channel back"
        assert lifecycle(events, long_ops[1]) == RESTARTED
        assert lifecycle(events, long_ops[0])[-1] == ("ENDED", "COMPLETED")
        assert lifecycle(events, tiny)[-1] == ("ENDED", "COMPLETED")


def test_an_app_alone_keeps_every_channel_and_one_channel_each_is_never_taken() -> None:
    with OnnxRuntimeDriver(
        devices=[{"channels": 2}], reserved_channels=0, background_idle=False
    ) as d:
        d.set_scheduling_configs([*CONFIGS, SchedulingConfig(uid=11, app_priority=300)])
        model = d.load_timed_model()
        d.submit(model, uid=10, inputs=d.timed_inputs(model, 100))
        started_running(d, 1)
        d.submit(model, uid=11, inputs=d.timed_inputs(model, 100))
        started_running(d, 2)
        d.submit(model, uid=10, inputs=d.timed_inputs(model, 1))  # its app holds a channel
        d.submit(model, uid=10, inputs=d.timed_inputs(model, 1))
        d.run_until_idle()
        assert paused(d.take_events()) == []


def test_restart_preemption_must_be_a_bool() -> None:
    with pytest.raises(IllegalArgumentError, match="restart_preemption must be True or False"):
        OnnxRuntimeDriver(restart_preemption="yes")


def test_an_inline_run_stopped_to_make_room_still_times_out_on_time() -> None:
    # no floor: the stopped job waits for all the urgent work, and times out waiting
    with OnnxRuntimeDriver(
        devices=[{"channels": 1, "floor_percent": 0}], background_idle=False
    ) as d:
        d.set_scheduling_configs(CONFIGS)
        model = d.load_timed_model()
        slow, urgent_inputs = d.timed_inputs(model, 200), d.timed_inputs(model, 100)
        raised: list[BaseException] = []

        def app() -> None:
            try:
                d.run_inference(model, uid=10, inputs=slow, timeout=0.3)
            except TimeoutError as exc:
                raised.append(exc)

        thread = threading.Thread(target=app)
        thread.start()
        started_running(d, 1)
        urgent = [d.submit_future(model, Job(20), urgent_inputs) for _ in range(8)]
        thread.join(timeout=WAIT_S)
        assert raised and not urgent[-1].done(), "it timed out while urgent work still ran"
        d.run_until_idle()
        assert lifecycle(d.take_events(), 1)[-2:] == [
            ("ENDED", "PAUSED"),
            ("ENDED", "CANCELLED_USER"),
        ]
