"""The `openvino` driver: models built here in code, run by OpenVINO on this machine's CPU."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from helpers.console import VTS_AT_NORMAL_PRIORITY

pytest.importorskip("openvino")

import openvino as ov

from helpers.daemon_support import WAIT_S
from npumanager.cli.program import main
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.driver.job import Job
from npumanager.core.plugins.registry import load_plugins
from npumanager.errors import CapacityError, IllegalArgumentError
from npumanager.schemas import DriverCapability, EndReason, SchedulingConfig
from npumanager.schemas.limits import CHAIN_LAYERS, CHAIN_WIDTH
from npumanager.testing import DriverSuite
from npumanager.testing.rules import RULES
from npumanager.vendor_drivers import openvino as ov_plugin
from npumanager.vendor_drivers.openvino.driver import (
    OpenVinoDriver,
    band_properties,
    default_device,
)
from npumanager.vendor_drivers.realexec.chain import chain_inputs, chain_model

WEIGHTS = CHAIN_LAYERS * CHAIN_WIDTH * CHAIN_WIDTH * 4


@pytest.fixture(autouse=True)
def _collect() -> Iterator[None]:
    """OpenVINO objects left in reference cycles go now, with their threads, not during a
    later test that counts the process's threads."""
    yield
    gc.collect()


def ended(events: list[WorkEvent], work: int) -> EndReason | None:
    for event in events:
        if event.id == work and event.kind == EventKind.ENDED:
            return EndReason(event.reason)
    return None


class TestOpenVinoConformance(DriverSuite):
    __test__ = True
    driver_name = "openvino"
    # as VTS_AT_NORMAL_PRIORITY gives `vts`
    driver_options: ClassVar[dict[str, Any]] = {"background_idle": False}
    thread_safe = True


def test_registered_with_honest_capabilities() -> None:
    record = load_plugins().driver("openvino")
    assert set(record.capabilities) == {
        DriverCapability.REAL_TIME,
        DriverCapability.MULTI_DEVICE,
        DriverCapability.FAIR_SHARE,
        DriverCapability.RESTART_PREEMPTION,
    }


def test_vts_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    vts = ["vts", "--driver", "openvino", *VTS_AT_NORMAL_PRIORITY]
    assert main(vts) == 0
    claimed = {str(c) for c in ov_plugin.CAPABILITIES}
    skips = sum(r.capability not in {"-", *claimed} for r in RULES)
    summary = f"driver openvino: {len(RULES) - skips} pass, 0 fail, {skips} skip"
    assert summary in capsys.readouterr().out


def test_the_default_device_is_npu_if_present_else_cpu() -> None:
    core = ov.Core()
    expected = "NPU" if any(d.startswith("NPU") for d in core.available_devices) else "CPU"
    assert default_device(core) == expected
    with OpenVinoDriver() as driver:
        assert driver.device == expected


def test_an_unknown_device_is_refused_naming_what_there_is() -> None:
    with pytest.raises(LookupError, match=r"'TPU' is not available; this machine has \['CPU'"):
        OpenVinoDriver(device="TPU")


def test_a_model_from_onnx_bytes_runs_and_its_constants_are_counted() -> None:
    with OpenVinoDriver() as driver:
        model = driver.load_model(0, model=chain_model())
        assert driver.model_bytes(model) == WEIGHTS
        assert driver.model_info(model).target == "CPU"
        future = driver.submit_future(model, Job(1), chain_inputs(4))
        assert future.result(timeout=WAIT_S)[0].shape == (4, CHAIN_WIDTH)


def test_a_model_from_ir_and_from_an_onnx_path(tmp_path: Path) -> None:
    onnx_path = tmp_path / "chain.onnx"
    onnx_path.write_bytes(chain_model())
    ir_path = tmp_path / "chain.xml"
    ov.save_model(ov.Core().read_model(str(onnx_path)), str(ir_path))
    with OpenVinoDriver() as driver:
        for path in (onnx_path, ir_path):
            model = driver.load_model(0, path=path)
            assert driver.submit_future(model, Job(1), chain_inputs(1)).result(WAIT_S)
        assert driver.device_state(0).models_loaded == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": b"garbage"}, "not an ONNX or OpenVINO IR model"),
        ({"model": 42}, "ONNX bytes or an openvino.Model"),
        ({"path": "model.txt"}, r"\.onnx\) or IR \(\.xml\)"),
    ],
)
def test_a_bad_model_is_refused_and_nothing_is_loaded(kwargs: dict[str, Any], match: str) -> None:
    with OpenVinoDriver() as driver:
        with pytest.raises(IllegalArgumentError, match=match):
            driver.load_model(0, **kwargs)
        assert driver.device_state(0).models_loaded == 0


def test_a_model_too_big_is_refused() -> None:
    with OpenVinoDriver(capacity_bytes=WEIGHTS - 1) as driver:
        with pytest.raises(CapacityError, match=f"{WEIGHTS} weight bytes do not fit"):
            driver.load_model(0, model=chain_model())
        assert driver.device_state(0).weight_memory_used_bytes == 0


def test_wrong_inputs_are_refused() -> None:
    with OpenVinoDriver() as driver:
        model = driver.load_model(0, model=chain_model())
        with pytest.raises(IllegalArgumentError, match=r"x: float32\[\?, 256\]"):
            driver.submit(model, uid=1, inputs={"x": np.zeros((2, 3), np.float32)})


def test_cancel_stops_a_running_request() -> None:
    with OpenVinoDriver(devices=[{"channels": 1}], background_idle=False) as driver:
        model = driver.load_timed_model()
        running = driver.submit_future(model, Job(1), driver.timed_inputs(model, 2_000))
        while driver.device_state(0).running[0] != running.work_id and not running.done():
            driver.run_until_idle(max_us=1000)
        assert running.cancel()
        after = driver.submit_future(model, Job(1), driver.timed_inputs(model, 1))
        assert after.result(timeout=WAIT_S)
        driver.run_until_idle()
        events = driver.take_events()
        assert ended(events, running.work_id) == EndReason.CANCELLED_USER
        assert ended(events, after.work_id) == EndReason.COMPLETED


@pytest.mark.parametrize(
    ("band", "bands", "priority", "workload"),
    [
        (0, 4, "HIGH", "DEFAULT"),
        (1, 4, "HIGH", "DEFAULT"),
        (2, 4, "MEDIUM", "EFFICIENT"),
        (3, 4, "LOW", "EFFICIENT"),
        (0, 2, "HIGH", "DEFAULT"),
        (0, 1, "MEDIUM", "DEFAULT"),
    ],
)
def test_bands_map_to_model_priority_and_workload_type(
    band: int, bands: int, priority: str, workload: str
) -> None:
    assert band_properties(band, bands) == {"MODEL_PRIORITY": priority, "WORKLOAD_TYPE": workload}


def test_the_cpu_takes_no_priority_hint_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    with OpenVinoDriver() as driver, caplog.at_level(logging.INFO):
        driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=1000)])
        handle = driver.load_model(0, model=chain_model(), uid=10)
        driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=100)])
        driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=1000)])
        assert driver.model_info(handle).relayed == {}  # type: ignore[attr-defined]
    lines = [r for r in caplog.records if "driver's own queue orders the work" in r.message]
    assert len(lines) == 1


def test_two_channels_run_two_requests_of_one_model_at_once() -> None:
    most = max(ov.Core().get_property("CPU", "RANGE_FOR_STREAMS"))
    with OpenVinoDriver(device="CPU", devices=[{"channels": 2}]) as d:
        d.set_scheduling_configs([SchedulingConfig(uid=1, app_priority=100)])
        model = d.load_timed_model()
        session: Any = d.model_info(model)
        assert session.streams == min(2, most)
        assert session.compiled.get_property("NUM_STREAMS") == session.streams
        works = [d.submit(model, uid=1, inputs=d.timed_inputs(model, 50)) for _ in range(2)]
        d.run_until_idle()
        events = d.take_events()
        starts = [e.time_us for e in events if e.kind == EventKind.STARTED]
        ends = [e.time_us for e in events if e.kind == EventKind.ENDED]
        assert [ended(events, w) for w in works] == [EndReason.COMPLETED] * 2
        assert max(starts) < min(ends), "both requests were in the runtime at once"


def test_background_workers_keep_the_process_priority_by_default() -> None:
    # OpenVINO computes on its own threads: a lowered waiting worker only hands the GIL
    # back late (the onnxruntime driver, which computes on the worker, lowers it).
    with OpenVinoDriver(device="CPU") as d:
        assert d.background_nice == 0
    with OpenVinoDriver(device="CPU", background_nice=4) as d:
        assert d.background_nice == 4


def test_streams_are_not_pinned_to_cores() -> None:
    # every app's model has streams of its own: pinned, two models' first streams share
    # one core while the other idles
    with OpenVinoDriver(device="CPU") as d:
        session: Any = d.model_info(d.load_model(model=chain_model()))
        assert session.compiled.get_property("ENABLE_CPU_PINNING") is False
