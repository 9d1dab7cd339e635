"""Races between a real driver's workers and the calls that end work."""

from __future__ import annotations

from typing import Any

from npumanager.vendor_drivers.onnxruntime.driver import OnnxRuntimeDriver


def test_work_cancelled_after_it_started_but_before_it_ran_ends_and_the_worker_goes_on() -> None:
    with OnnxRuntimeDriver(devices=[{"channels": 1}]) as d:
        model = d.load_timed_model()
        execute, cancelled = d._execute, []

        def cancel_first(work: Any) -> Any:
            # The window between the worker taking the work and calling the runtime.
            if not cancelled:
                cancelled.append(work.id)
                d.cancel(work.id)
            return execute(work)

        d._execute = cancel_first  # type: ignore[method-assign]
        first = d.submit_future(model, uid=1, inputs=d.timed_inputs(model, 5))
        second = d.submit_future(model, uid=1, inputs=d.timed_inputs(model, 5))
        assert len(second.result(timeout=30)) == 1, "the same worker ran the next work"
        assert cancelled == [first.work_id] and first.cancelled()
