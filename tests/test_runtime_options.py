"""Runtime options: what an app sets on its runtime that changes what a run computes
(`load_model(options=)`, which `npu-manager run` fills from the program's own session
options or compile config), carried to the driver of that runtime and applied there, in
process, through a daemon into the model host, and under `run`.

The differential: a Conv and BatchNormalization model, whose output ONNX Runtime's graph
optimisations change in the last bits, gives through the manager exactly what the runtime
itself gives with the same options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import npumanager as npu
from helpers.daemon_support import DaemonProcess
from helpers.onnx_builders import conv_batchnorm_model
from helpers.run_support import managed_sessions
from npumanager.checks import check_runtime_options
from npumanager.daemon.wire import protocol as wire
from npumanager.errors import IllegalArgumentError
from npumanager.schemas.limits import MAX_RUNTIME_OPTIONS

ort = pytest.importorskip("onnxruntime")

from npumanager.vendor_drivers.realexec.chain import chain_model  # noqa: E402

NO_OPTIMISATION = {"onnxruntime.graph_optimization_level": "0"}
X = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)


def _direct(level: Any) -> np.ndarray:
    """The runtime's own output for `X` at a graph optimisation level."""
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    session = ort.InferenceSession(
        conv_batchnorm_model().SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return np.asarray(session.run(None, {"x": X})[0])


@pytest.fixture(scope="module")
def direct() -> dict[str, np.ndarray]:
    outputs = {
        "none": _direct(ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
        "all": _direct(ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
    }
    # The premise: without the option applied, the managed output could not match.
    assert not np.array_equal(outputs["none"], outputs["all"])
    return outputs


def _driver(service: npu.Service) -> Any:
    return service.drivers[0] if hasattr(service, "drivers") else service.driver


def _load(manager: npu.NpuManager, request_id: int, model: bytes, **load: Any) -> Any:
    request = npu.ModelLoadRequest.Builder(request_id).set_size(0).build()
    lease = manager.reserve(request, timeout_s=30)
    lease.__enter__()
    return lease.load_model(model=model, **load)


# The names and values a load takes ------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ([("onnxruntime.x", "1")], "mapping"),
        ({"graph_optimization_level": "0"}, "is not allowed"),
        ({"onnxruntime.": "0"}, "is not allowed"),
        ({"OnnxRuntime.x": "0"}, "is not allowed"),
        ({"onnxruntime.x y": "0"}, "is not allowed"),
        ({"onnxruntime." + "x" * 64: "0"}, "is not allowed"),
        ({"onnxruntime.x": 0}, "must be a string"),
        ({"onnxruntime.x": "v" * 129}, "must be a string"),
        ({f"onnxruntime.k{i}": "0" for i in range(MAX_RUNTIME_OPTIONS + 1)}, "at most 16"),
    ],
)
def test_a_bad_option_is_refused_saying_what_is_allowed(options: Any, complaint: str) -> None:
    with pytest.raises(IllegalArgumentError, match=complaint):
        check_runtime_options(options)


def test_no_options_is_the_drivers_settings() -> None:
    assert check_runtime_options(None) is None
    assert check_runtime_options({}) is None
    assert check_runtime_options(NO_OPTIMISATION) == NO_OPTIMISATION


_KEYS = st.one_of(
    st.sampled_from(["onnxruntime.graph_optimization_level", "openvino.X", "a.b-c.d"]),
    st.text(alphabet="abzAZ09._- .", max_size=70),
)


@given(st.dictionaries(_KEYS, st.text(max_size=140), max_size=MAX_RUNTIME_OPTIONS + 2))
def test_the_wire_takes_exactly_the_options_a_load_takes(options: dict[str, str]) -> None:
    try:
        check_runtime_options(options)
        allowed = True
    except IllegalArgumentError:
        allowed = False
    try:
        wire.LoadRealModel(seq=1, request_id=1, sram_bytes=0, descriptor=True, options=options)
        carried = True
    except ValidationError:
        carried = False
    assert allowed == carried


# In process -------------------------------------------------------------------------------


def _session_options(service: npu.Service, model: Any) -> Any:
    return _driver(service)._models[model.handle].session.session.get_session_options()


def test_the_onnxruntime_driver_applies_its_options_and_leaves_others_alone() -> None:
    with npu.Service("onnxruntime") as service:
        manager = service.manager(10001, uses_feature=True)
        default = _load(manager, 1, chain_model())
        asked = _load(
            manager,
            2,
            chain_model(),
            options={
                **NO_OPTIMISATION,
                "onnxruntime.session.disable_prepacking": "1",
                "openvino.INFERENCE_PRECISION_HINT": "bf16",  # another runtime's: not here
            },
        )
        assert int(_session_options(service, default).graph_optimization_level) == 99
        options = _session_options(service, asked)
        assert int(options.graph_optimization_level) == 0
        assert options.get_session_config_entry("session.disable_prepacking") == "1"


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"onnxruntime.graph_optimization_level": "3"}, "takes '0', '1', '2', '99'; got '3'"),
        ({"onnxruntime.intra_op_num_threads": "2"}, "takes no option .* it takes onnxruntime"),
        ({"onnxruntime.execution_mode": "1"}, "takes no option 'onnxruntime.execution_mode'"),
        ({"onnxruntime.session.set_denormal_as_zero": "yes"}, "takes '0', '1'"),
    ],
)
def test_the_onnxruntime_driver_refuses_what_it_does_not_take(
    options: dict[str, str], complaint: str
) -> None:
    with npu.Service("onnxruntime") as service:
        manager = service.manager(10001, uses_feature=True)
        with pytest.raises(IllegalArgumentError, match=complaint):
            _load(manager, 1, chain_model(), options=options)
        assert not _driver(service)._models, "nothing was opened"


def test_in_process_the_output_is_the_runtimes_own_with_the_same_options(
    direct: dict[str, np.ndarray],
) -> None:
    with npu.Service("onnxruntime") as service:
        manager = service.manager(10001, uses_feature=True)
        model = conv_batchnorm_model().SerializeToString()
        plain = _load(manager, 1, model).run({"x": X})[0]
        unoptimised = _load(manager, 2, model, options=NO_OPTIMISATION).run({"x": X})[0]
    assert np.array_equal(plain, direct["all"])
    assert np.array_equal(unoptimised, direct["none"])


def test_the_openvino_driver_applies_its_options() -> None:
    pytest.importorskip("openvino")
    with npu.Service("openvino") as service:
        manager = service.manager(10001, uses_feature=True)
        accurate = _load(
            manager, 1, chain_model(), options={"openvino.EXECUTION_MODE_HINT": "ACCURACY"}
        )
        default = _load(manager, 2, chain_model(), options=NO_OPTIMISATION)  # not its own
        compiled = _driver(service)._models
        assert str(
            compiled[accurate.handle].session.compiled.get_property("EXECUTION_MODE_HINT")
        ).endswith("ACCURACY")
        assert str(
            compiled[default.handle].session.compiled.get_property("EXECUTION_MODE_HINT")
        ).endswith("PERFORMANCE")
        with pytest.raises(IllegalArgumentError, match="takes 'f32', 'bf16', 'f16'; got 'f64'"):
            _load(manager, 3, chain_model(), options={"openvino.INFERENCE_PRECISION_HINT": "f64"})
        with pytest.raises(IllegalArgumentError, match="takes no option 'openvino.NUM_STREAMS'"):
            _load(manager, 4, chain_model(), options={"openvino.NUM_STREAMS": "4"})


# Through a daemon, into the model host -----------------------------------------------------


def test_through_a_daemon_the_host_runs_the_model_with_the_options_asked(
    start_onnxruntime: Callable[..., DaemonProcess], direct: dict[str, np.ndarray]
) -> None:
    daemon = start_onnxruntime("--model-hosts")
    model = conv_batchnorm_model().SerializeToString()
    with npu.connect(daemon.socket, uses_feature=True) as manager:
        plain = _load(manager, 1, model)
        unoptimised = _load(manager, 2, model, options=NO_OPTIMISATION)
        assert np.array_equal(plain.run({"x": X})[0], direct["all"])
        assert np.array_equal(unoptimised.run({"x": X})[0], direct["none"])
        with pytest.raises(IllegalArgumentError, match="takes '0', '1', '2', '99'; got '7'"):
            _load(manager, 3, model, options={"onnxruntime.graph_optimization_level": "7"})
        assert plain.run({"x": X})[0].shape == (1, 8, 16, 16), "the host serves on"


# Under `npu-manager run` --------------------------------------------------------------------


def test_under_run_a_session_asks_the_options_it_was_given(
    start_onnxruntime: Callable[..., DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
    direct: dict[str, np.ndarray],
) -> None:
    daemon = start_onnxruntime("--model-hosts")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = conv_batchnorm_model().SerializeToString()
    with managed_sessions(daemon.socket, monkeypatch) as (managed_class, sessions):
        sessions.append(managed_class(model, sess_options=options))
        sessions.append(managed_class(model))
        assert all(type(s) is managed_class for s in sessions), "managed, not the fallback"
        assert np.array_equal(sessions[0].run(None, {"x": X})[0], direct["none"])
        assert np.array_equal(sessions[1].run(None, {"x": X})[0], direct["all"])


def test_the_options_a_program_set_are_read_from_its_runtimes_own() -> None:
    from npumanager.run.openvino_model import _options_of as openvino_options
    from npumanager.run.ort_session import _options_of as ort_options
    from npumanager.runtime_options import ONNXRUNTIME_TAKEN as TAKEN

    options = ort.SessionOptions()
    assert ort_options(options) == {}, "the runtime's defaults ask nothing"
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    options.add_session_config_entry("session.disable_prepacking", "true")  # not "1": off
    asked = ort_options(options)
    assert asked == {
        "onnxruntime.graph_optimization_level": "1",
        "onnxruntime.session.set_denormal_as_zero": "1",
        "onnxruntime.session.disable_prepacking": "0",
    }
    assert {key.removeprefix("onnxruntime.") for key in asked} <= set(TAKEN)
    assert check_runtime_options(asked) == asked

    ov = pytest.importorskip("openvino")
    from openvino.properties import hint

    assert openvino_options(None) == {}
    assert openvino_options({"INFERENCE_PRECISION_HINT": ov.Type.f32}) == {
        "openvino.INFERENCE_PRECISION_HINT": "f32"
    }
    assert openvino_options({"EXECUTION_MODE_HINT": hint.ExecutionMode.ACCURACY}) == {
        "openvino.EXECUTION_MODE_HINT": "ACCURACY"
    }
    assert openvino_options({"INFERENCE_PRECISION_HINT": "u8", "PERFORMANCE_HINT": "X"}) == {}
