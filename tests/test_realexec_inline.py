"""The lean path of a real driver's `run_inference`: work that takes a free channel at once
(`DeviceScheduler.admit`) and runs on the caller's thread, with the same rules as queued work."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import weakref
from concurrent.futures import CancelledError
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.daemon_support import WAIT_S
from npumanager.core.driver.events import EventKind
from npumanager.core.driver.job import Job
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import SchedulingConfig
from npumanager.schemas.device import Band, DeviceSpec
from npumanager.schemas.limits import MAX_EFFECTIVE_PRIORITY, MAX_NICE
from npumanager.vendor_drivers.onnxruntime.driver import OnnxRuntimeDriver
from npumanager.vendor_drivers.realexec.session import background_from, is_background
from npumanager.vendor_drivers.realexec.work import SyncOutcome


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(1, MAX_EFFECTIVE_PRIORITY), max_size=5), st.data())
def test_background_from_is_where_the_background_bands_begin(
    firsts: set[int], data: st.DataObject
) -> None:
    bands = tuple(Band(name=f"b{i}", first_priority=p) for i, p in enumerate([0, *sorted(firsts)]))
    spec = DeviceSpec(bands=bands)
    for priority in data.draw(st.lists(st.integers(0, MAX_EFFECTIVE_PRIORITY), max_size=20)):
        expected = is_background(spec.band_of(priority), len(bands))
        assert (priority >= background_from(spec)) == expected


def test_background_work_held_back_is_not_run_inline_but_waits_its_turn() -> None:
    with OnnxRuntimeDriver(devices=[{"channels": 2}], background_idle=False) as d:
        d.set_scheduling_configs([SchedulingConfig(uid=u, app_priority=1000) for u in (10, 11)])
        model = d.load_timed_model()
        session = d.model_info(model)
        real, threads = session.run, []

        def recording(feeds: Any, call: Any) -> Any:
            threads.append(threading.current_thread())
            return real(feeds, call)

        session.run = recording  # type: ignore[method-assign]
        busy = d.submit_future(model, Job(10), d.timed_inputs(model, 200))
        while d.device_state(0).running.count(-1) == 2 and not busy.done():
            d.run_until_idle(max_us=1000)
        d.run_inference(model, uid=11, inputs=d.timed_inputs(model, 1))
        assert threads[-1] is not threading.current_thread(), "a worker ran it, in turn"
        d.run_until_idle()
        events = [(e.kind, e.id) for e in d.take_events()]
        assert events.index((EventKind.ENDED, busy.work_id)) < events.index((EventKind.STARTED, 2))


def test_a_foreground_inference_behind_held_back_background_work_runs_inline() -> None:
    with OnnxRuntimeDriver(devices=[{"channels": 2}], background_idle=False) as d:
        d.set_scheduling_configs(
            [
                SchedulingConfig(uid=10, app_priority=1000),
                SchedulingConfig(uid=20, app_priority=100),
            ]
        )
        model = d.load_timed_model()
        session = d.model_info(model)
        real, threads = session.run, []

        def recording(feeds: Any, call: Any) -> Any:
            threads.append(threading.current_thread())
            return real(feeds, call)

        session.run = recording  # type: ignore[method-assign]
        busy = d.submit_future(model, Job(10), d.timed_inputs(model, 300))
        waiting = d.submit_future(model, Job(10), d.timed_inputs(model, 1))
        while d.device_state(0).running.count(-1) == 2 and not busy.done():
            d.run_until_idle(max_us=1000)
        assert d.device_state(0).queue_depth == 1, "the second background job is held back"
        d.run_inference(model, uid=20, inputs=d.timed_inputs(model, 1))
        assert threads[-1] is threading.current_thread()
        assert not waiting.done() or busy.done()
        d.run_until_idle()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
@pytest.mark.parametrize("idle", [True, False])
def test_background_work_runs_on_workers_of_lower_os_priority(idle: bool) -> None:
    """Niced by `background_nice`, and under SCHED_IDLE unless `background_idle=False`."""
    policies: dict[bool, int] = {}
    with OnnxRuntimeDriver(devices=[{"channels": 2}], background_nice=3, background_idle=idle) as d:
        d.set_scheduling_configs(
            [
                SchedulingConfig(uid=10, app_priority=1000),
                SchedulingConfig(uid=20, app_priority=100),
            ]
        )
        model = d.load_timed_model()
        session = d.model_info(model)
        real, nice = session.run, {}

        def recording(feeds: Any, call: Any) -> Any:
            nice[call.background] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            policies[call.background] = os.sched_getscheduler(0)
            return real(feeds, call)

        session.run = recording  # type: ignore[method-assign]
        d.submit(model, uid=10, inputs=d.timed_inputs(model, 1))
        d.submit(model, uid=20, inputs=d.timed_inputs(model, 1))
        d.run_until_idle()
        ours = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        assert nice == {True: min(MAX_NICE, ours + 3), False: ours}
    assert policies == {
        True: os.SCHED_IDLE if idle else os.SCHED_OTHER,
        False: os.sched_getscheduler(0),
    }


def test_background_nice_out_of_range_is_refused() -> None:
    with pytest.raises(IllegalArgumentError, match="background_nice must be within 0..19"):
        OnnxRuntimeDriver(background_nice=20)
    with pytest.raises(IllegalArgumentError, match="background_idle must be True or False"):
        OnnxRuntimeDriver(background_idle="no")


@pytest.mark.parametrize("inline", [False, True])
def test_foreground_work_does_not_wait_behind_held_back_owed_background_work(
    inline: bool,
) -> None:
    with OnnxRuntimeDriver(devices=[{"channels": 2}], background_idle=False) as d:
        d.set_scheduling_configs(
            [
                SchedulingConfig(uid=10, app_priority=400),  # normal band: background
                SchedulingConfig(uid=11, app_priority=1000),  # idle band: background, owed
                SchedulingConfig(uid=20, app_priority=100),  # focus
            ]
        )
        model = d.load_timed_model()
        busy = d.submit_future(model, Job(10), d.timed_inputs(model, 300))
        while d.device_state(0).running.count(-1) == 2 and not busy.done():
            d.run_until_idle(max_us=1000)
        idle = d.submit_future(model, Job(11), d.timed_inputs(model, 1))
        time.sleep(0.01)  # the idle band's floor credit grows: it heads the queue, held back
        inputs = d.timed_inputs(model, 1)
        if inline:
            d.run_inference(model, uid=20, inputs=inputs)
        else:
            d.submit_future(model, Job(20), inputs).result(timeout=WAIT_S)
        assert not busy.done() and not idle.done(), "the foreground job went first"
        d.run_until_idle()


def _run_on_its_thread(d: Any, model: int, ms: float) -> tuple[threading.Thread, list[Any], int]:
    """Start `run_inference` (no timeout) on a thread of its own; the thread, where its
    outcome goes (outputs or the exception), and the work id once it runs."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(d.run_inference(model, uid=10, inputs=d.timed_inputs(model, ms)))
        except BaseException as exc:  # the test looks at which one
            outcome.append(exc)

    app = threading.Thread(target=run)
    app.start()
    deadline = time.monotonic() + WAIT_S
    while -1 in d.device_state(0).running and time.monotonic() < deadline:
        time.sleep(0.001)
    (work_id,) = d.device_state(0).running
    return app, outcome, work_id


@pytest.mark.parametrize("end", ["cancel", "inject_fault"])
def test_a_run_on_the_callers_thread_ended_by_another_thread_raises_how_it_ended(
    end: str,
) -> None:
    """A run with no timeout keeps its outcome without a thread-safe future (only its
    own thread waits): a cancel or a failure from elsewhere still reaches it."""
    from concurrent.futures import CancelledError

    from npumanager.errors import ExecutionError

    with OnnxRuntimeDriver(devices=[{"channels": 1}]) as d:
        model = d.load_timed_model()
        app, outcome, work_id = _run_on_its_thread(d, model, 300)
        getattr(d, end)(work_id)
        app.join(timeout=WAIT_S)
        expected = CancelledError if end == "cancel" else ExecutionError
        assert len(outcome) == 1 and isinstance(outcome[0], expected), outcome
        assert d.run_inference(model, uid=10, inputs=d.timed_inputs(model, 1))[0].size > 0


def test_work_submitted_after_a_config_change_takes_the_new_priority_and_permission() -> None:
    """The driver keeps each (uid, original uid, job priority)'s priority and permission
    worked out, for as long as the configs stay the same, and not a moment longer."""
    from npumanager.errors import ExecutionError

    with OnnxRuntimeDriver() as d:
        model = d.load_timed_model()
        inputs = d.timed_inputs(model, 1)

        def started_priority() -> int:
            d.run_inference(model, uid=10, inputs=inputs, job_priority=3)
            d.run_until_idle()
            (started,) = [e for e in d.take_events() if e.kind == EventKind.STARTED]
            return started.effective_priority

        d.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=100, max_priority=5)])
        assert started_priority() == 103
        d.update_scheduling_configs([SchedulingConfig(uid=10, app_priority=300, max_priority=2)])
        assert started_priority() == 302
        d.set_scheduling_configs(
            [SchedulingConfig(uid=10, app_priority=300, has_direct_access=False)]
        )
        with pytest.raises(ExecutionError, match="may not run"):
            d.run_inference(model, uid=10, inputs=inputs, job_priority=3)


def test_a_sync_outcome_calls_its_done_callbacks_once_as_a_future_would() -> None:
    """`SyncOutcome` is a `WorkHandle`: a callback added before the end runs at the end,
    once; one added after runs at once; a second end changes nothing."""
    from npumanager.vendor_drivers.realexec.work import SyncOutcome

    with OnnxRuntimeDriver() as d:
        outcome = SyncOutcome(7, d)
        seen: list[tuple[str, Any]] = []
        outcome.add_done_callback(lambda o: seen.append(("before", o.result())))
        assert not outcome.done() and seen == []
        outcome.succeed(["out"])
        outcome.fail(RuntimeError("late"))
        outcome.add_done_callback(lambda o: seen.append(("after", o.result())))
        assert seen == [("before", ["out"]), ("after", ["out"])]
        assert outcome.done() and not outcome.cancelled()


def test_a_cancelled_sync_outcome_does_not_keep_its_callers_frame_alive() -> None:
    """`result()` of cancelled work raises a new CancelledError, as `Future.result` does:
    the one the outcome keeps would take the catching frame (a lane's, holding a client's
    segment) into its traceback, and the segment would stay mapped until the collector
    ran."""

    class Segment:
        pass

    def lane_like(outcome: SyncOutcome, segment: Segment) -> str:
        try:
            outcome.result()
        except CancelledError:
            return "cancelled"
        return "ran"

    outcome = SyncOutcome(1, None)  # type: ignore[arg-type]
    outcome.cancelled_by_driver()
    segment = Segment()
    held = weakref.ref(segment)
    gc.disable()
    try:
        assert lane_like(outcome, segment) == "cancelled"
        del segment
        assert held() is None, "freed without the cycle collector"
    finally:
        gc.enable()
    assert outcome.cancelled()
