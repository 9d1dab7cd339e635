"""Races between a real driver's workers and the calls that end work."""

from __future__ import annotations

import gc
import time
import weakref
from typing import Any

from helpers.daemon_support import WAIT_S
from npumanager.core.driver.job import Job
from npumanager.vendor_drivers.onnxruntime.driver import OnnxRuntimeDriver

# The workers at the OS's normal priority: under SCHED_IDLE (the default for background
# work) a run beside busy programs would not reach the runtime's next check of its stop for
# minutes, and these tests are about the driver's bookkeeping, not the OS's.
AT_NORMAL_PRIORITY: dict[str, Any] = {"background_idle": False, "background_nice": 0}


def test_work_cancelled_after_it_started_but_before_it_ran_ends_and_the_worker_goes_on() -> None:
    with OnnxRuntimeDriver(devices=[{"channels": 1}], **AT_NORMAL_PRIORITY) as d:
        model = d.load_timed_model()
        execute, cancelled = d._execute, []

        def cancel_first(work: Any) -> Any:
            # The window between the worker taking the work and calling the runtime.
            if not cancelled:
                cancelled.append(work.id)
                d.cancel(work.id)
            return execute(work)

        d._execute = cancel_first  # type: ignore[method-assign]
        first = d.submit_future(model, Job(1), d.timed_inputs(model, 5))
        second = d.submit_future(model, Job(1), d.timed_inputs(model, 5))
        assert len(second.result(timeout=WAIT_S)) == 1, "the same worker ran the next work"
        assert cancelled == [first.work_id] and first.cancelled()


def test_the_inputs_of_work_stopped_while_it_ran_are_let_go_at_once() -> None:
    # A daemon's inputs are arrays over a client's shared segment: held a moment too long,
    # the segment of a client that died stays mapped. Nothing here may wait for the cycle
    # collector (the runtime's stop is an exception whose traceback holds the run's frames).
    with OnnxRuntimeDriver(devices=[{"channels": 1}], **AT_NORMAL_PRIORITY) as d:
        model = d.load_timed_model()
        inputs = d.timed_inputs(model, 2000)
        held = [weakref.ref(array) for array in inputs.values()]
        collecting = gc.isenabled()
        gc.disable()
        try:
            future = d.submit_future(model, Job(1), inputs)
            del inputs
            deadline = time.monotonic() + WAIT_S  # bounds a hang, not the machine's speed
            while not d._busy:
                assert time.monotonic() < deadline, "the work never started"
                time.sleep(0.01)
            assert future.cancel()
            deadline = time.monotonic() + WAIT_S
            while not d.idle():
                assert time.monotonic() < deadline, "the work never ended"
                time.sleep(0.01)
            assert [ref() is None for ref in held] == [True] * len(held)
        finally:
            if collecting:
                gc.enable()
