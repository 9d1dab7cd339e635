"""The managed `InferenceSession` against the real ONNX Runtime, input for input: the same
outputs, or the same exception class with the same message, for inputs of any shape and
dtype (hypothesis), and the same description of the model."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.daemon_support import DaemonProcess

ort = pytest.importorskip("onnxruntime")
DTYPES = (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_)
OUTPUT_NAMES = (None, [], ["s"], ["m", "s"], ("m",), ["q"], ["s", "q"])


def two_input_model() -> bytes:
    """s = a + b and m = a * b, with a: float32[n, 3] and b: float32[1, 3]."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["a", "b"], ["m"])],
        "two",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3]),
        ],
        [
            helper.make_tensor_value_info("s", TensorProto.FLOAT, ["n", 3]),
            helper.make_tensor_value_info("m", TensorProto.FLOAT, ["n", 3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.producer_name = "npu-manager tests"
    model.metadata_props.add(key="purpose", value="differential")
    data: bytes = model.SerializeToString()
    return data


@pytest.fixture
def sessions(
    start_onnxruntime: Callable[..., DaemonProcess], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, Any]]:
    """The real session and the managed one (through a real daemon) of `two_input_model`."""
    from npumanager.run.ort_session import managed_session_class
    from npumanager.run.settings import REFUSE, Settings

    daemon = start_onnxruntime()
    monkeypatch.setenv("NPUMANAGER_SOCKET", str(daemon.socket))
    managed_class = managed_session_class(ort, Settings(no_daemon=REFUSE))
    model = two_input_model()
    managed = managed_class(model)
    assert type(managed) is managed_class, "the managed session, not the fallback"
    yield ort.InferenceSession(model), managed
    managed._npu_model.close()
    from npumanager.run.managed import PROCESS

    if PROCESS.manager is not None:
        PROCESS.manager.close()
        PROCESS.manager = None


def array(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.float64) % 7).astype(dtype).reshape(shape)


VALID = {"a": array((2, 3), np.float32), "b": array((1, 3), np.float32)}
"""A feed the model takes: the baseline that one wrong input at a time is put into."""
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
inputs = st.fixed_dictionaries(
    {},
    optional={
        "a": st.tuples(shapes, st.sampled_from(DTYPES)),
        "b": st.tuples(shapes, st.sampled_from(DTYPES)),
        "c": st.tuples(shapes, st.sampled_from(DTYPES)),
    },
)


def outcome(session: Any, names: Any, feed: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", session.run(names, feed)
    except Exception as error:
        return "error", (type(error), str(error))


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    given_inputs=inputs,
    names=st.sampled_from(OUTPUT_NAMES),
    as_list=st.booleans(),
    order=st.booleans(),
)
def test_runs_as_the_runtime_does(
    sessions: tuple[Any, Any],
    given_inputs: dict[str, tuple[tuple[int, ...], Any]],
    names: Any,
    as_list: bool,
    order: bool,
) -> None:
    real, managed = sessions
    keys = sorted(given_inputs, reverse=order)
    feed: dict[str, Any] = {k: array(*given_inputs[k]) for k in keys}
    if as_list and "a" in feed and feed["a"].ndim:
        feed["a"] = feed["a"].tolist()
    expected, got = outcome(real, names, feed), outcome(managed, names, feed)
    assert got[0] == expected[0], (expected, got)
    if expected[0] == "error":
        if got[1] != expected[1]:
            # Several inputs are wrong, and the runtime names the first in its hash map's
            # order: the managed session must say exactly what the runtime says of one of them.
            assert got[1][0] is expected[1][0], (expected, got)
            alone = [outcome(real, names, {**VALID, k: v}) for k, v in feed.items()]
            assert ("error", got[1]) in alone, (got, alone)
        return
    assert len(got[1]) == len(expected[1])
    for mine, theirs in zip(got[1], expected[1], strict=True):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        assert np.array_equal(mine, theirs)


def test_describes_the_model_as_the_runtime_does(sessions: tuple[Any, Any]) -> None:
    real, managed = sessions

    def args(listed: list[Any]) -> list[tuple[str, str, list[Any]]]:
        return [(a.name, a.type, a.shape) for a in listed]

    assert args(managed.get_inputs()) == args(real.get_inputs())
    assert args(managed.get_outputs()) == args(real.get_outputs())
    assert str(managed.get_outputs()[0]) == str(real.get_outputs()[0])
    fields = ("producer_name", "graph_name", "domain", "description", "version")
    assert [getattr(managed.get_modelmeta(), f) for f in fields] == [
        getattr(real.get_modelmeta(), f) for f in fields
    ]
    assert managed.get_modelmeta().custom_metadata_map == real.get_modelmeta().custom_metadata_map
    assert managed.get_providers() == real.get_providers()
    assert isinstance(managed, ort.InferenceSession)
    assert isinstance(managed.get_session_options(), ort.SessionOptions)


def test_ort_values_and_io_binding_as_the_runtime(sessions: tuple[Any, Any]) -> None:
    real, managed = sessions
    a, b = array((2, 3), np.float32), array((1, 3), np.float32)
    values = {"a": ort.OrtValue.ortvalue_from_numpy(a), "b": ort.OrtValue.ortvalue_from_numpy(b)}
    mine, theirs = (
        managed.run_with_ort_values(["m"], values),
        real.run_with_ort_values(["m"], values),
    )
    assert type(mine[0]) is type(theirs[0])
    assert np.array_equal(mine[0].numpy(), theirs[0].numpy())
    results = []
    for session in (managed, real):
        binding = session.io_binding()
        binding.bind_cpu_input("a", a)
        binding.bind_cpu_input("b", b)
        binding.bind_output("s")
        session.run_with_iobinding(binding)
        results.append(binding.copy_outputs_to_cpu()[0])
    assert np.array_equal(results[0], results[1])
    binding = managed.io_binding()
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.NotImplemented):
        binding.bind_input("a", "cuda", 0, np.float32, [2, 3], 0)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.NotImplemented):
        managed.get_tuning_results()


def test_a_terminated_run_fails_as_the_runtime(sessions: tuple[Any, Any]) -> None:
    real, managed = sessions
    options = ort.RunOptions()
    options.terminate = True
    feed = {"a": array((2, 3), np.float32), "b": array((1, 3), np.float32)}
    assert outcome(managed, None, feed)[0] == "ok"
    for session in (real, managed):
        with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="terminate flag"):
            session.run(None, feed, options)


def test_pid_is_this_process(sessions: tuple[Any, Any]) -> None:
    """The managed session's connection is this process's own."""
    from npumanager.run.managed import PROCESS

    _, managed = sessions
    managed.run(None, {"a": array((1, 3), np.float32), "b": array((1, 3), np.float32)})
    assert PROCESS.manager is not None
    assert PROCESS.manager.backend.pid == os.getpid()  # type: ignore[attr-defined]


def test_run_async_calls_back_as_the_runtime(sessions: tuple[Any, Any]) -> None:
    import threading

    real, managed = sessions
    feed = {"a": array((2, 3), np.float32), "b": array((1, 3), np.float32)}
    answers: dict[str, Any] = {}
    done = {"real": threading.Event(), "managed": threading.Event()}

    def callback(outputs: Any, user_data: Any, error: str) -> None:
        answers[user_data] = (outputs, error)
        done[user_data].set()

    for kind, session in (("real", real), ("managed", managed)):
        session.run_async(["m"], feed, callback, kind)
        assert done[kind].wait(60)
    (mine, mine_error), (theirs, their_error) = answers["managed"], answers["real"]
    assert mine_error == their_error == ""
    assert np.array_equal(mine[0], theirs[0])
