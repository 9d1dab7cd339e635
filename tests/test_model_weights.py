"""Models are data: every byte of an ONNX model's or an IR's weights is counted before a
runtime sees it, a tensor that lies about its size is refused, and data in another file is
read only from descriptors sent with the model, never by a name the model gives."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import npumanager as npu  # noqa: E402
from helpers.daemon_support import WAIT_S  # noqa: E402
from helpers.onnx_builders import (  # noqa: E402
    WIDTH,
    constant_floats_model,
    constant_model,
    external_model,
    function_model,
    initializer_model,
    lying_raw_model,
    lying_typed_model,
    save_external,
    sparse_constant_model,
    subgraph_model,
    values,
)
from npumanager.core.driver.job import Job  # noqa: E402
from npumanager.errors import CapacityError, IllegalArgumentError  # noqa: E402
from npumanager.modelfiles import open_model_files, sidecar_key  # noqa: E402
from npumanager.vendor_drivers.onnxruntime.driver import OnnxRuntimeDriver  # noqa: E402
from npumanager.vendor_drivers.realexec.onnx_weights import count  # noqa: E402

ROW = np.zeros((1, WIDTH), np.float32)
INT64_BYTES = 16
"""The two int64 slice bounds of `constant_model`."""


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (initializer_model, 64),
        (lambda: constant_model(1 << 20), (1 << 20) + INT64_BYTES),
        (constant_floats_model, 64),
        (subgraph_model, 64 + 64 + 1),  # both branches and the bool flag
        (function_model, 64),
        (sparse_constant_model, 64 + 8 * WIDTH),  # values and int64 indices
    ],
    ids=["initializer", "constant", "value_floats", "if_branches", "function", "sparse"],
)
def test_every_place_a_model_keeps_data_is_counted(build: Any, expected: int) -> None:
    model = build()
    assert count(model).weight_bytes == expected
    # and the runtime really computes with that data (so it is weights, not decoration)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": ROW})[0][0], values())


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (lying_raw_model(1 << 20, 4), "needs 4194304 bytes but it holds 16"),
        (lying_raw_model(1, 1 << 16), "needs 4 bytes but it holds 262144"),
        (lying_typed_model(1 << 28, 1), "needs 268435456 values but it holds 1"),
    ],
    ids=["raw_short", "raw_long", "typed_short"],
)
def test_a_tensor_whose_data_disagrees_with_its_shape_is_refused(model: Any, match: str) -> None:
    with pytest.raises(IllegalArgumentError, match=match):
        count(model)


def test_a_negative_dimension_and_an_unknown_type_are_refused() -> None:
    model = initializer_model()
    model.graph.initializer[0].dims[0] = -1
    with pytest.raises(IllegalArgumentError, match="negative dimension"):
        count(model)
    model = initializer_model()
    model.graph.initializer[0].data_type = 999
    with pytest.raises(IllegalArgumentError, match="data type 999 is not taken"):
        count(model)


_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_]


@st.composite
def _arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(st.sampled_from(_DTYPES))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    return np.zeros(shape, dtype)


@given(
    inits=st.lists(_arrays(), max_size=3),
    constants=st.lists(_arrays(), max_size=3),
    nested=st.lists(_arrays(), max_size=2),
    raw=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_the_count_matches_numpy_for_any_mix_of_places(
    inits: list[np.ndarray], constants: list[np.ndarray], nested: list[np.ndarray], raw: bool
) -> None:
    """Differential: the count against the arrays' own nbytes, wherever they sit."""

    def tensor(array: np.ndarray, name: str) -> onnx.TensorProto:
        made = numpy_helper.from_array(array, name)
        if not raw and array.dtype in (np.float32, np.int32, np.int64, np.float64):
            made = helper.make_tensor(name, made.data_type, array.shape, array.flatten().tolist())
        return made

    nodes = [
        helper.make_node("Constant", [], [f"k{n}"], value=tensor(a, f"k{n}"))
        for n, a in enumerate(constants)
    ]
    body = helper.make_graph(
        [
            helper.make_node("Constant", [], [f"b{n}"], value=tensor(a, f"b{n}"))
            for n, a in enumerate(nested)
        ],
        "body",
        [],
        [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, None)],
    )
    nodes.append(helper.make_node("If", ["cond"], ["out"], then_branch=body, else_branch=body))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[tensor(a, f"i{n}") for n, a in enumerate(inits)],
    )
    model = helper.make_model(graph)
    expected = sum(a.nbytes for a in [*inits, *constants, *nested, *nested])
    assert count(model).weight_bytes == expected


# External data -----------------------------------------------------------------------------


@pytest.fixture
def ort_driver() -> Iterator[OnnxRuntimeDriver]:
    driver = OnnxRuntimeDriver()
    yield driver
    driver.close()


def run(driver: OnnxRuntimeDriver, handle: int) -> np.ndarray:
    outputs = driver.submit_future(handle, Job(1), {"x": ROW}).result(WAIT_S)
    return np.asarray(outputs[0])[0]


def test_external_data_beside_a_model_file_is_read_from_its_descriptor(
    tmp_path: Path, ort_driver: OnnxRuntimeDriver
) -> None:
    weights = values(start=7)
    path = save_external(tmp_path, weights)
    handle = ort_driver.load_model(0, path=path)
    assert ort_driver.model_bytes(handle) == 64
    np.testing.assert_array_equal(run(ort_driver, handle), weights)


def test_external_data_named_by_a_model_sent_as_bytes_is_never_read(
    tmp_path: Path, ort_driver: OnnxRuntimeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime alone would read `weights.bin` from the working directory."""
    save_external(tmp_path)
    monkeypatch.chdir(tmp_path)
    data = external_model("weights.bin").SerializeToString()
    with pytest.raises(IllegalArgumentError, match="'weights.bin', which did not come with"):
        ort_driver.load_model(0, model=data)
    assert ort_driver.device_state(0).models_loaded == 0


def test_external_data_comes_only_from_the_descriptor_sent_under_its_name(
    tmp_path: Path, ort_driver: OnnxRuntimeDriver
) -> None:
    sent = tmp_path / "sent.bin"
    sent.write_bytes(values(start=3).tobytes())
    fd = os.open(sent, os.O_RDONLY)
    try:
        data = external_model("./weights.bin").SerializeToString()
        handle = ort_driver.load_model(0, model=data, sidecars={"weights.bin": fd})
    finally:
        os.close(fd)
    np.testing.assert_array_equal(run(ort_driver, handle), values(start=3))


def test_a_weights_file_shorter_than_the_model_says_is_refused(
    tmp_path: Path, ort_driver: OnnxRuntimeDriver
) -> None:
    path = save_external(tmp_path, values(WIDTH - 1))
    with pytest.raises(IllegalArgumentError, match="holds 60 bytes; the model names 64"):
        ort_driver.load_model(0, path=path)


@pytest.mark.parametrize(
    "location", ["/etc/passwd", "../secret.bin", "a/../../secret.bin", "", ".", "x\0y"]
)
def test_a_weights_file_outside_the_models_folder_is_refused(tmp_path: Path, location: str) -> None:
    with pytest.raises(IllegalArgumentError, match="weights file must"):
        sidecar_key(location)
    path = tmp_path / "m.onnx"
    path.write_bytes(external_model(location).SerializeToString())
    with pytest.raises(IllegalArgumentError, match="weights file must"):
        open_model_files(path, 1 << 20)


def test_a_missing_weights_file_is_named(tmp_path: Path, ort_driver: OnnxRuntimeDriver) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(external_model("gone.bin").SerializeToString())
    with pytest.raises(IllegalArgumentError, match=r"cannot open the model's weights file .*gone"):
        ort_driver.load_model(0, path=path)


# Counted before anything is allocated ------------------------------------------------------


def test_a_model_over_its_allowance_is_refused_before_the_runtime_opens_it(
    ort_driver: OnnxRuntimeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[object] = []
    monkeypatch.setattr(ort, "InferenceSession", lambda *a, **k: opened.append(a))
    with pytest.raises(CapacityError, match="hold 65552 bytes, more than the 1024 its grant"):
        ort_driver.load_model(0, model=constant_model(1 << 16), max_weight_bytes=1024)
    with pytest.raises(CapacityError, match="do not fit on device 0"):
        OnnxRuntimeDriver(capacity_bytes=1000).load_model(0, model=constant_model(1 << 16))
    assert opened == []


def test_a_declared_grant_bounds_a_constant_node_model_in_the_service() -> None:
    service = npu.Service("onnxruntime")
    try:
        app = service.manager(10123, uses_feature=True)
        request = npu.ModelLoadRequest.Builder(1).set_size(0).build()
        with app.reserve(request, timeout_s=WAIT_S, weight_bytes=1024) as lease:
            with pytest.raises(CapacityError, match="more than the 1024 its grant allows"):
                lease.load_model(model=constant_model(1 << 16))
            model = lease.load_model(model=initializer_model())
            assert model.weight_bytes == 64
    finally:
        service.close()


# OpenVINO IR -------------------------------------------------------------------------------


@pytest.fixture
def ir_files(tmp_path: Path) -> Path:
    ov = pytest.importorskip("openvino")
    xml = tmp_path / "m.xml"
    model = ov.Core().read_model(initializer_model().SerializeToString())
    ov.save_model(model, str(xml), compress_to_fp16=False)
    return xml


def test_an_ir_is_counted_from_its_xml_and_its_bin_comes_by_descriptor(ir_files: Path) -> None:
    from npumanager.vendor_drivers.openvino.driver import OpenVinoDriver

    with OpenVinoDriver() as driver:
        handle = driver.load_model(0, path=ir_files)
        assert driver.model_bytes(handle) == 64
        out = driver.submit_future(handle, Job(1), {"x": ROW}).result(WAIT_S)
        np.testing.assert_array_equal(np.asarray(out[0])[0], values())
        with pytest.raises(IllegalArgumentError, match=r"weights file \(\.bin\) did not come"):
            driver.load_model(0, model=ir_files.read_bytes())


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda x: x.replace(b'size="64"', b'size="640000"'), "needs 64 bytes but it names"),
        (lambda x: b'<!DOCTYPE net [<!ENTITY a "b">]>' + x.split(b"?>", 1)[1], "has a DTD"),
        (lambda x: x.replace(b'offset="0"', b'offset="x"'), "offset 'x' is not a number"),
    ],
    ids=["size_lies", "dtd", "offset"],
)
def test_an_ir_that_lies_is_refused(ir_files: Path, edit: Any, match: str) -> None:
    from npumanager.vendor_drivers.openvino.driver import OpenVinoDriver

    ir_files.write_bytes(edit(ir_files.read_bytes()))
    with OpenVinoDriver() as driver, pytest.raises(IllegalArgumentError, match=match):
        driver.load_model(0, path=ir_files)


def test_openvino_reads_onnx_external_data_only_from_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openvino")
    from npumanager.vendor_drivers.openvino.driver import OpenVinoDriver

    path = save_external(tmp_path, values(start=5))
    monkeypatch.chdir(tmp_path)
    with OpenVinoDriver() as driver:
        with pytest.raises(IllegalArgumentError, match="did not come with the model"):
            driver.load_model(0, model=path.read_bytes())
        handle = driver.load_model(0, path=path)
        out = driver.submit_future(handle, Job(1), {"x": ROW}).result(WAIT_S)
        np.testing.assert_array_equal(np.asarray(out[0])[0], values(start=5))
