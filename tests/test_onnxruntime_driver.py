"""The `onnxruntime` driver: real ONNX models built here with `onnx.helper`, nothing downloaded."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npumanager.cli import main
from npumanager.core.events import EventKind, WorkEvent
from npumanager.core.plugins import load_plugins
from npumanager.errors import CapacityError, IllegalArgumentError
from npumanager.schemas import DriverCapability, EndReason, SchedulingConfig
from npumanager.testing import DriverSuite
from npumanager.testing.rules import RULES
from npumanager.vendor_drivers import onnxruntime as ort_plugin
from npumanager.vendor_drivers.onnxruntime.driver import OnnxRuntimeDriver, weight_bytes_of

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


def virtual(**options: Any) -> OnnxRuntimeDriver:
    return OnnxRuntimeDriver(clock="virtual", **options)


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
    thread_safe = True


def test_registered_with_honest_capabilities() -> None:
    record = load_plugins().driver("onnxruntime")
    assert set(record.capabilities) == {DriverCapability.REAL_TIME, DriverCapability.MULTI_DEVICE}


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
        from npumanager.cli import main
        assert main(["plugins"]) == 0
        """
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "vnpu" in done.stdout
    assert "onnxruntime " not in done.stdout
    assert done.stderr == "", "an absent optional driver is not reported as a problem"


def test_vts_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vts", "--driver", "onnxruntime"]) == 0
    claimed = {str(c) for c in ort_plugin.CAPABILITIES}
    skips = sum(r.capability not in {"-", *claimed} for r in RULES)
    summary = f"driver onnxruntime: {len(RULES) - skips} pass, 0 fail, {skips} skip"
    assert summary in capsys.readouterr().out


def test_weight_bytes_come_from_the_initializers() -> None:
    model = linear_model()
    assert weight_bytes_of(model) == W.nbytes + B.nbytes == 160
    with virtual() as driver:
        driver.load_model(0, model=model.SerializeToString())
        assert driver.device_state(0).weight_memory_used_bytes == 160


def test_load_from_path(tmp_path: Any) -> None:
    path = tmp_path / "linear.onnx"
    onnx.save_model(linear_model(), str(path))
    with virtual() as driver:
        handle = driver.load_model(0, path=path)
        assert driver.cost_cycles(handle) >= 1


def test_a_load_that_does_not_fit_leaves_nothing_loaded() -> None:
    with virtual(capacity_bytes=300) as driver:
        driver.load_model(0, model=linear_model())
        with pytest.raises(CapacityError):
            driver.load_model(0, model=linear_model())
        state = driver.device_state(0)
        assert (state.weight_memory_used_bytes, state.models_loaded) == (160, 1)


def test_not_an_onnx_model_is_an_illegal_argument() -> None:
    with virtual() as driver, pytest.raises(IllegalArgumentError):
        driver.load_model(0, model=b"not onnx")
    with virtual() as driver:
        assert driver.device_state(0).models_loaded == 0


def test_an_inference_computes_the_model() -> None:
    x = RNG.standard_normal((1, 4)).astype(np.float32)
    with virtual() as driver:
        model = driver.load_model(0, model=linear_model())
        work = driver.submit(model, uid=10, inputs={"x": x})
        zeros = driver.submit(model, uid=10)
        driver.run_until_idle()
        assert ended(driver.take_events(), work) == EndReason.COMPLETED
        np.testing.assert_allclose(driver.result(work)[0], x @ W + B, rtol=1e-5)
        np.testing.assert_allclose(driver.result(zeros)[0], B[None, :], rtol=1e-5)
        with pytest.raises(LookupError):
            driver.result(work)


def test_wrong_inputs_are_an_illegal_argument() -> None:
    with virtual() as driver:
        model = driver.load_model(0, model=linear_model())
        with pytest.raises(IllegalArgumentError):
            driver.submit(model, uid=10, inputs={"nope": np.zeros((1, 4))})


def test_a_more_important_uid_runs_next_and_nothing_is_paused() -> None:
    with virtual(devices=[{"channels": 1}]) as driver:
        driver.set_scheduling_configs(
            [SchedulingConfig(uid=10, app_priority=500), SchedulingConfig(uid=20, app_priority=0)]
        )
        model = driver.load_model(0, model=linear_model())
        cost = 1_000_000  # 1 ms at 1000 cycles per us
        first = driver.submit(model, uid=10, cost_cycles=cost)
        driver.advance(100)  # `first` is running
        background = driver.submit(model, uid=10, cost_cycles=cost)
        foreground = driver.submit(model, uid=20, cost_cycles=cost)
        again = driver.submit(model, uid=20, cost_cycles=cost)
        driver.run_until_idle()
        events = driver.take_events()
        assert completion_order(events) == [first, foreground, again, background]
        assert not [e for e in events if e.kind == EventKind.ENDED and e.reason == EndReason.PAUSED]
        ids = [e.id for e in events if e.kind == EventKind.REQUESTED]
        assert ids == sorted(ids) and len(set(ids)) == 4
        times = [e.time_us for e in events]
        assert times == sorted(times)
        assert driver.result(foreground)[0].shape == (1, 8)


def test_cancel_and_unload_end_queued_work_and_it_never_runs() -> None:
    with virtual(devices=[{"channels": 1}]) as driver:
        model = driver.load_model(0, model=linear_model())
        running = driver.submit(model, uid=10)
        cancelled = driver.submit(model, uid=10)
        revoked = driver.submit(model, uid=10)
        driver.cancel(cancelled)
        driver.unload_model(model)
        driver.run_until_idle()
        events = driver.take_events()
        assert ended(events, cancelled) == EndReason.CANCELLED_USER
        assert ended(events, revoked) == EndReason.CANCELLED_SYSTEM
        assert ended(events, running) == EndReason.CANCELLED_SYSTEM
        for work in (running, cancelled, revoked):
            with pytest.raises(LookupError):
                driver.result(work)


def test_bind_gives_a_placeholder_its_model() -> None:
    with virtual() as driver:
        handle = driver.load_model(0, weight_bytes=160)
        cost = driver.bind(handle, linear_model())
        assert cost == driver.cost_cycles(handle)
        work = driver.submit(model=handle, uid=10)
        driver.run_until_idle()
        assert driver.result(work)[0].shape == (1, 8)
        small = driver.load_model(0, weight_bytes=100)
        with pytest.raises(IllegalArgumentError):
            driver.bind(small, linear_model())


def test_real_clock_runs_inferences_on_the_wall_clock() -> None:
    with OnnxRuntimeDriver() as driver:
        model = driver.load_model(0, model=linear_model())
        works = [driver.submit(model, uid=10) for _ in range(5)]
        driver.run_until_idle(max_us=5_000_000)
        events = driver.take_events()
        assert [ended(events, w) for w in works] == [EndReason.COMPLETED] * 5
        assert all(driver.result(w)[0].shape == (1, 8) for w in works)
        with pytest.raises(IllegalArgumentError):
            driver.advance(10)
