"""The `onnxruntime` driver: real ONNX models built here with `onnx.helper`, nothing downloaded."""

from __future__ import annotations

import importlib.util
import logging
import re
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, ClassVar

import numpy as np
import onnx
import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers.console import VTS_AT_NORMAL_PRIORITY
from helpers.daemon_support import WAIT_S
from npumanager.cli.program import main
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.driver.job import Job
from npumanager.core.plugins.registry import load_plugins
from npumanager.errors import CapacityError, IllegalArgumentError
from npumanager.schemas import DriverCapability, EndReason, SchedulingConfig
from npumanager.schemas.limits import CHAIN_WIDTH
from npumanager.testing import DriverSuite
from npumanager.testing.base import lifecycle
from npumanager.testing.rules import RULES
from npumanager.vendor_drivers import onnxruntime as ort_plugin
from npumanager.vendor_drivers.onnxruntime.driver import (
    OnnxRuntimeDriver,
    OrtSession,
    weight_bytes_of,
)
from npumanager.vendor_drivers.realexec.base import ExecutionError
from npumanager.vendor_drivers.realexec.chain import chain_inputs, chain_model
from npumanager.vendor_drivers.realexec.onnx_weights import count

RNG = np.random.default_rng(5)
W = RNG.standard_normal((4, 8)).astype(np.float32)  # 128 bytes
B = RNG.standard_normal(8).astype(np.float32)  # 32 bytes


def linear_model(w: np.ndarray = W, b: np.ndarray = B) -> onnx.ModelProto:
    """y = x @ w + b, with w and b as initializers."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[1]])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def driver(**options: Any) -> OnnxRuntimeDriver:
    """The driver, its background workers at the normal OS priority unless asked: under
    `SCHED_IDLE` they get next to no CPU beside busy programs, which these tests do not judge."""
    return OnnxRuntimeDriver(**{"background_idle": False, **options})


def ended(events: list[WorkEvent], work: int) -> EndReason | None:
    for event in events:
        if event.id == work and event.kind == EventKind.ENDED:
            return EndReason(event.reason)
    return None


def completion_order(events: list[WorkEvent]) -> list[int]:
    return [e.id for e in events if e.kind == EventKind.ENDED and e.reason == EndReason.COMPLETED]


class TestOnnxRuntimeConformance(DriverSuite):
    __test__ = True
    driver_name = "onnxruntime"
    # as VTS_AT_NORMAL_PRIORITY gives `vts`
    driver_options: ClassVar[dict[str, Any]] = {"background_idle": False}
    thread_safe = True


def test_registered_with_honest_capabilities() -> None:
    record = load_plugins().driver("onnxruntime")
    assert set(record.capabilities) == {
        DriverCapability.REAL_TIME,
        DriverCapability.MULTI_DEVICE,
        DriverCapability.FAIR_SHARE,
        DriverCapability.RESTART_PREEMPTION,
    }


def test_missing_extra_registers_nothing_and_says_which_extra(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "onnxruntime" else real(name, *a),
    )
    with caplog.at_level(logging.INFO):
        assert list(ort_plugin.npumanager_register_drivers()) == []
    assert "npu-manager[onnxruntime]" in caplog.text


def test_plugins_lists_without_the_extra() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["onnxruntime"] = None  # as if the extra were not installed
        from npumanager.cli.program import main
        assert main(["plugins"]) == 0
        """
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "vnpu" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines()]
    assert ["driver", "onnxruntime"] not in [row[:2] for row in rows], "no driver registered"
    assert re.search(
        r"^onnxruntime +npu-manager +unavailable +driver onnxruntime \(pip", done.stdout, re.M
    )
    assert done.stderr == "", "an absent optional driver is not reported as a problem"


def test_vts_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    vts = ["vts", "--driver", "onnxruntime", *VTS_AT_NORMAL_PRIORITY]
    assert main(vts) == 0
    claimed = {str(c) for c in ort_plugin.CAPABILITIES}
    skips = sum(r.capability not in {"-", *claimed} for r in RULES)
    summary = f"driver onnxruntime: {len(RULES) - skips} pass, 0 fail, {skips} skip"
    assert summary in capsys.readouterr().out


def test_weight_bytes_come_from_the_initializers() -> None:
    model = linear_model()
    assert weight_bytes_of(model) == W.nbytes + B.nbytes == 160
    with driver() as d:
        handle = d.load_model(0, model=model.SerializeToString())
        assert d.device_state(0).weight_memory_used_bytes == 160 == d.model_bytes(handle)


def test_load_from_a_path_and_a_model_proto(tmp_path: Any) -> None:
    path = tmp_path / "linear.onnx"
    onnx.save_model(linear_model(), str(path))
    with driver() as d:
        d.load_model(0, path=path)
        d.load_model(0, model=linear_model())
        assert d.device_state(0).models_loaded == 2


def test_the_provider_really_used_is_reported() -> None:
    with driver() as d:
        handle = d.load_model(0, model=linear_model())
        assert d.model_info(handle).target == "CPUExecutionProvider"


def test_a_provider_that_is_not_there_is_refused() -> None:
    with pytest.raises(IllegalArgumentError, match="available"):
        OnnxRuntimeDriver(providers=["NoSuchExecutionProvider"])


def test_a_provider_that_falls_back_is_logged_and_not_claimed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = ort.InferenceSession

    def falls_back(model: bytes, sess_options: Any, providers: list[str]) -> Any:
        return real(model, sess_options=sess_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(ort, "InferenceSession", falls_back)
    with caplog.at_level(logging.WARNING):
        session = OrtSession(count(linear_model()), ["OpenVINOExecutionProvider"], 1, 0)
    assert session.target == "CPUExecutionProvider"
    assert "asked for OpenVINOExecutionProvider but runs on ['CPUExecutionProvider']" in caplog.text


def test_a_load_that_does_not_fit_leaves_nothing_loaded() -> None:
    with driver(capacity_bytes=300) as d:
        d.load_model(0, model=linear_model())
        with pytest.raises(CapacityError, match="do not fit"):
            d.load_model(0, model=linear_model())
        state = d.device_state(0)
        assert (state.weight_memory_used_bytes, state.models_loaded) == (160, 1)


@pytest.mark.parametrize("bad", [b"not onnx", b"", "a string"])
def test_not_an_onnx_model_is_an_illegal_argument(bad: Any) -> None:
    with driver() as d:
        with pytest.raises(IllegalArgumentError, match="ONNX"):
            d.load_model(0, model=bad)
        assert d.device_state(0).models_loaded == 0


def test_an_unknown_device_is_refused_naming_the_devices() -> None:
    with driver() as d, pytest.raises(LookupError, match=r"devices are 0\.\.0"):
        d.load_model(1, model=linear_model())


def test_an_inference_computes_the_model() -> None:
    x = RNG.standard_normal((1, 4)).astype(np.float32)
    with driver() as d:
        model = d.load_model(0, model=linear_model())
        work = d.submit(model, uid=10, inputs={"x": x})
        d.run_until_idle()
        assert ended(d.take_events(), work) == EndReason.COMPLETED
        np.testing.assert_allclose(d.result(work)[0], x @ W + B, rtol=1e-5)
        with pytest.raises(LookupError):
            d.result(work)


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        ({"nope": np.zeros((1, 4), np.float32)}, "unknown \\['nope'\\], missing \\['x'\\]"),
        ({"x": np.zeros((1, 4), np.float64)}, "dtype float64; the model takes float32"),
        (
            {"x": np.zeros((2, 4), np.float32)},
            "shape \\[2, 4\\]; the model takes x: float32\\[1, 4\\]",
        ),
        ({"x": "text"}, "not convertible"),
        (None, "inputs= is required: x: float32"),
    ],
)
def test_wrong_inputs_are_refused_and_nothing_is_queued(inputs: Any, match: str) -> None:
    with driver() as d:
        model = d.load_model(0, model=linear_model())
        with pytest.raises(IllegalArgumentError, match=match):
            d.submit(model, uid=10, inputs=inputs)
        assert d.take_events() == []


def test_cycles_or_a_placeholder_are_refused_by_a_real_driver() -> None:
    with driver() as d:
        model = d.load_model(0, model=linear_model())
        with pytest.raises(IllegalArgumentError, match="simulated"):
            d.submit(model, uid=10, cost_cycles=1000)
        placeholder = d.load_model(0, weight_bytes=100)
        with pytest.raises(IllegalArgumentError, match="no runtime session"):
            d.submit(placeholder, uid=10, inputs={"x": np.zeros((1, 4), np.float32)})


def test_without_restarts_a_more_important_uid_takes_the_next_channel_nothing_paused() -> None:
    with driver(devices=[{"channels": 1}], restart_preemption=False) as d:
        d.set_scheduling_configs(
            [SchedulingConfig(uid=10, app_priority=500), SchedulingConfig(uid=20, app_priority=0)]
        )
        model = d.load_timed_model()
        first = d.submit_future(model, Job(10), d.timed_inputs(model, 50))
        while d.device_state(0).running[0] != first.work_id and not first.done():
            d.run_until_idle(max_us=1000)
        small = d.timed_inputs(model, 1)
        background = d.submit(model, uid=10, inputs=small)
        foreground = d.submit(model, uid=20, inputs=small)
        again = d.submit(model, uid=20, inputs=small)
        d.run_until_idle()
        events = d.take_events()
        assert completion_order(events) == [first.work_id, foreground, again, background]
        assert not [e for e in events if e.kind == EventKind.ENDED and e.reason == EndReason.PAUSED]
        times = [e.time_us for e in events]
        assert times == sorted(times)


def test_a_future_gives_the_outputs_and_cancel_stops_running_work() -> None:
    with driver(devices=[{"channels": 1}]) as d:
        model = d.load_timed_model()
        running = d.submit_future(model, Job(10), d.timed_inputs(model, 2_000))
        queued = d.submit_future(model, Job(10), d.timed_inputs(model, 1))
        while d.device_state(0).running[0] != running.work_id and not running.done():
            d.run_until_idle(max_us=1000)
        assert queued.cancel() and running.cancel()
        done = d.submit_future(model, Job(10), d.timed_inputs(model, 1))
        assert done.result(timeout=WAIT_S)[0].shape[1] == CHAIN_WIDTH
        d.run_until_idle()
        events = d.take_events()
        assert [k for k, _ in lifecycle(events, queued.work_id)] == ["REQUESTED", "ENDED"]
        assert ended(events, running.work_id) == EndReason.CANCELLED_USER
        assert running.cancelled() and queued.cancelled()
        # the runtime stopped the long inference: the next one ran on the only channel
        assert ended(events, done.work_id) == EndReason.COMPLETED


def test_a_runtime_error_ends_the_work_failed() -> None:
    with driver() as d:
        model = d.load_timed_model()
        session = d.model_info(model)

        def broken(feeds: Any, call: Any) -> Any:
            raise RuntimeError("device lost")

        session.run = broken  # type: ignore[method-assign]
        future = d.submit_future(model, Job(10), d.timed_inputs(model, 1))
        with pytest.raises(ExecutionError, match="device lost"):
            future.result(timeout=WAIT_S)
        d.run_until_idle()
        assert ended(d.take_events(), future.work_id) == EndReason.FAILED


def test_cancel_and_unload_end_queued_work_and_it_never_runs() -> None:
    with driver(devices=[{"channels": 1}]) as d:
        model = d.load_timed_model()
        inputs = d.timed_inputs(model, 1)
        running = d.submit(model, uid=10, inputs=d.timed_inputs(model, 2_000))
        cancelled = d.submit(model, uid=10, inputs=inputs)
        revoked = d.submit(model, uid=10, inputs=inputs)
        d.cancel(cancelled)
        d.unload_model(model)
        d.run_until_idle()
        events = d.take_events()
        assert ended(events, cancelled) == EndReason.CANCELLED_USER
        assert ended(events, revoked) == EndReason.CANCELLED_SYSTEM
        assert ended(events, running) == EndReason.CANCELLED_SYSTEM
        assert [k for k, _ in lifecycle(events, revoked)] == ["REQUESTED", "ENDED"]
        assert d.device_state(0).weight_memory_used_bytes == 0


def test_background_work_is_marked_efficient_where_the_provider_takes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with driver() as d, caplog.at_level(logging.INFO):
        d.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=1000)])
        handle = d.load_model(0, model=linear_model(), uid=10)
        session = d.model_info(handle)
        assert session.background is True  # type: ignore[attr-defined]
        d.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=100)])
        assert session.background is False  # type: ignore[attr-defined]
    assert caplog.text.count("ep.dynamic.workload_type") <= 1


def test_the_last_band_leaves_a_channel_free_for_more_important_work() -> None:
    with driver(devices=[{"channels": 2}]) as d:
        d.set_scheduling_configs(
            [
                SchedulingConfig(uid=10, app_priority=1000),
                SchedulingConfig(uid=20, app_priority=100),
            ]
        )
        model = d.load_timed_model()
        background = [d.submit(model, uid=10, inputs=d.timed_inputs(model, 100)) for _ in range(3)]
        foreground = d.submit(model, uid=20, inputs=d.timed_inputs(model, 1))
        d.run_until_idle()
        events = d.take_events()
        running, most = 0, 0
        for event in events:
            if event.uid == 10 and event.kind == EventKind.STARTED:
                running += 1
            elif event.uid == 10 and event.kind == EventKind.ENDED:
                running -= 1
            most = max(most, running)
        assert most == 1, "background (here cached, 400) takes at most channels - reserved"
        assert [ended(events, w) for w in [*background, foreground]] == [EndReason.COMPLETED] * 4
        first_bg_end = next(
            i for i, e in enumerate(events) if e.uid == 10 and e.kind == EventKind.ENDED
        )
        fg_start = next(
            i for i, e in enumerate(events) if e.id == foreground and e.kind == EventKind.STARTED
        )
        assert fg_start < first_bg_end, "the foreground inference took the free channel"


def test_with_no_reserve_the_last_band_takes_every_channel() -> None:
    with driver(devices=[{"channels": 2}], reserved_channels=0) as d:
        d.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=1000)])
        model = d.load_timed_model()
        works = [d.submit(model, uid=10, inputs=d.timed_inputs(model, 50)) for _ in range(2)]
        d.run_until_idle()
        kinds = [(e.kind, e.id) for e in d.take_events() if e.kind != EventKind.REQUESTED]
        assert kinds[:2] == [(EventKind.STARTED, works[0]), (EventKind.STARTED, works[1])]


def test_run_inference_runs_on_the_calling_thread_when_a_channel_is_free() -> None:
    import threading

    with driver(devices=[{"channels": 1}]) as d:
        model = d.load_timed_model()
        session = d.model_info(model)
        real, threads = session.run, []

        def recording(feeds: Any, call: Any) -> Any:
            threads.append(threading.current_thread())
            return real(feeds, call)

        session.run = recording  # type: ignore[method-assign]
        outputs = d.run_inference(model, uid=1, inputs=d.timed_inputs(model, 1))
        assert outputs[0].shape[1] == CHAIN_WIDTH
        assert threads == [threading.current_thread()]
        busy = d.submit_future(model, Job(1), d.timed_inputs(model, 100))
        while d.device_state(0).running[0] != busy.work_id and not busy.done():
            d.run_until_idle(max_us=1000)
        d.run_inference(model, uid=1, inputs=d.timed_inputs(model, 1))
        assert threads[-1] is not threading.current_thread()  # queued: a worker ran it
        d.run_until_idle()
        events = d.take_events()
        assert [e.kind for e in events if e.id == 1] == [
            EventKind.REQUESTED,
            EventKind.STARTED,
            EventKind.ENDED,
        ]


def test_run_inference_on_the_calling_thread_times_out_and_is_cancelled() -> None:
    with driver() as d:
        model = d.load_timed_model()
        with pytest.raises(TimeoutError):
            d.run_inference(model, uid=1, inputs=d.timed_inputs(model, 2_000), timeout=0.02)
        d.run_until_idle()
        assert ended(d.take_events(), 1) == EndReason.CANCELLED_USER


def test_a_futures_callbacks_run_without_the_drivers_lock() -> None:
    """A daemon writes a client's outputs from the done callback: the other channels, and
    submissions, must not wait for it."""
    with driver() as ort_driver:
        model = ort_driver.load_model(model=chain_model())
        others_went_on: list[bool] = []

        def callback(_: Any) -> None:
            reader = threading.Thread(target=ort_driver.device_state, args=(0,))
            reader.start()
            reader.join(timeout=WAIT_S)  # blocks until this callback returns if the lock is held
            others_went_on.append(not reader.is_alive())

        future = ort_driver.submit_future(model, Job(10001), chain_inputs(4))
        future.add_done_callback(callback)
        future.result(timeout=WAIT_S)
        deadline = time.monotonic() + 2 * WAIT_S  # outlasts the callback's join
        while not others_went_on and time.monotonic() < deadline:
            time.sleep(0.01)
        assert others_went_on == [True]


def test_the_restart_preemption_rule_fails_a_driver_that_never_restarts() -> None:
    """Each attempt of the rule without a pause is tried again (a busy machine may hide the
    premise), and the last one judged: a driver that never stops a running job still fails."""
    record = load_plugins().driver("onnxruntime")
    suite = TestOnnxRuntimeConformance()
    suite._caps = frozenset(record.capabilities)  # what the capability gate sets
    suite.real_time_tries = 2
    made: list[Any] = []

    def make(devices: Any = None) -> Any:
        made.append(record.factory(devices=devices, restart_preemption=False))
        return made[-1]

    try:
        with pytest.raises(AssertionError, match="RestartPreemption: expected the running"):
            suite.test_RestartPreemption(make)
        assert len(made) == 2, "tried again once before judging"
    finally:
        for built in made:
            built.close()


def test_the_debounce_rule_tries_a_longer_window_when_a_busy_machine_let_one_pass() -> None:
    """The first driver delivers Ended at once whatever window it is given, as a machine
    too busy to submit within the window would see it; the rule tries again with a longer
    window on a fresh driver and judges that one, where it used to skip."""
    record = load_plugins().driver("onnxruntime")
    suite = TestOnnxRuntimeConformance()
    suite._caps = frozenset(record.capabilities)  # what the capability gate sets
    made: list[Any] = []
    windows: list[int] = []

    def make(devices: Any = None) -> Any:
        driver = record.factory() if devices is None else record.factory(devices=devices)
        if not made:  # the window passes at once on the first driver
            given = driver.set_callback

            def set_callback(callback: Any, debounce_duration_ms: int = 0) -> None:
                windows.append(debounce_duration_ms)
                given(callback, debounce_duration_ms=0)

            driver.set_callback = set_callback
        made.append(driver)
        return driver

    try:
        try:
            suite.test_DebounceSuppressesWithinWindow(make)
        except pytest.skip.Exception as skipped:
            pytest.fail(f"the rule gave up instead of trying a longer window: {skipped}")
        assert len(made) == 2 and windows == [400], "tried again once, on a fresh driver"
    finally:
        for built in made:
            built.close()
