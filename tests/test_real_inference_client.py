"""Real inference through the client API, in process: `load_model(model=...)`, `run`,
`submit` returning a future, on the `onnxruntime` driver."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import CancelledError

import numpy as np
import pytest

import npumanager as npu
from helpers.daemon_support import WAIT_S
from npumanager import ModelLoadRequest
from npumanager.core.service.service import Service
from npumanager.errors import IllegalArgumentError
from npumanager.schemas.limits import CHAIN_LAYERS, CHAIN_WIDTH

pytest.importorskip("onnxruntime")

from npumanager.vendor_drivers.realexec.chain import chain_inputs, chain_model

MODEL = chain_model()
WEIGHTS = CHAIN_LAYERS * CHAIN_WIDTH * CHAIN_WIDTH * 4


def req(request_id: int = 1) -> ModelLoadRequest:
    return (
        ModelLoadRequest.Builder(request_id)
        .set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB)
        .set_priority(npu.NPU_MODEL_PRIORITY_NORMAL)
        .build()
    )


@pytest.fixture
def service() -> Iterator[Service]:
    svc = Service("onnxruntime", "status_quo", devices=[{"channels": 1}])
    yield svc
    svc.close()


def test_run_returns_the_outputs_and_the_bytes_come_from_the_model(service: Service) -> None:
    app = service.manager(10001, uses_feature=True)
    with app.reserve(req(), timeout_s=WAIT_S) as lease:
        model = lease.load_model(model=MODEL)
        assert model.weight_bytes == WEIGHTS
        assert service.driver.device_state(0).weight_memory_used_bytes == WEIGHTS
        outputs = model.run(chain_inputs(3), timeout=WAIT_S)
        assert outputs[0].shape == (3, CHAIN_WIDTH)
        assert np.all(np.abs(outputs[0]) <= 1)  # tanh


def test_submit_gives_a_future_whose_cancel_cancels_the_work(service: Service) -> None:
    app = service.manager(10001, uses_feature=True)
    with app.reserve(req(), timeout_s=WAIT_S) as lease:
        model = lease.load_model(model=MODEL)
        long = model.submit(chain_inputs(200_000))
        queued = model.submit(chain_inputs(1))
        assert queued.cancel() and long.cancel()
        with pytest.raises(CancelledError):
            queued.result(timeout=WAIT_S)
        assert long.cancelled()
        assert model.submit(chain_inputs(2)).result(timeout=WAIT_S)[0].shape == (2, CHAIN_WIDTH)


def test_run_times_out_and_cancels(service: Service) -> None:
    app = service.manager(10001, uses_feature=True)
    with app.reserve(req(), timeout_s=WAIT_S) as lease:
        model = lease.load_model(model=MODEL)
        with pytest.raises(TimeoutError):
            model.run(chain_inputs(400_000), timeout=0.01)
        assert model.run(chain_inputs(1), timeout=WAIT_S)[0].shape == (1, CHAIN_WIDTH)


def test_wrong_inputs_and_a_bad_model_are_refused(service: Service) -> None:
    app = service.manager(10001, uses_feature=True)
    with app.reserve(req(), timeout_s=WAIT_S) as lease:
        with pytest.raises(IllegalArgumentError, match="not an ONNX model"):
            lease.load_model(model=b"\x00garbage")
        assert service.driver.device_state(0).models_loaded == 0
        model = lease.load_model(model=MODEL)
        with pytest.raises(IllegalArgumentError, match="dtype float64"):
            model.run({"x": np.zeros((1, CHAIN_WIDTH))})


def test_a_model_must_be_granted_before_it_loads(service: Service) -> None:
    app = service.manager(10001, uses_feature=True)
    with pytest.raises(LookupError):
        app.load_model(req(7), model=MODEL)
    with app.reserve(req(), timeout_s=WAIT_S), pytest.raises(TypeError):
        app.load_model(req(), model=MODEL, weight_bytes=1)


def test_simulated_drivers_keep_cost_cycles_and_refuse_inputs() -> None:
    with Service("reference", "status_quo", clock="virtual") as svc:
        app = svc.manager(10001, uses_feature=True)
        with app.reserve(req(), timeout_s=10) as lease:
            model = lease.load_model(1 << 20)
            assert isinstance(model.submit(1000), int)
            assert isinstance(model.submit(cost_cycles=1000), int)
            with pytest.raises(IllegalArgumentError, match="runs no real models"):
                model.submit({"x": np.zeros(1)})
            with pytest.raises(IllegalArgumentError, match="runs no real models"):
                app.load_model(req(), model=MODEL)


def test_a_backend_without_real_inference_is_refused_in_words() -> None:
    class SimulatedOnly:
        pass

    manager = npu.NpuManager(SimulatedOnly(), 1, 10001, None, True)  # type: ignore[arg-type]
    model = npu.LoadedModel(manager, req(), 1, 0)
    words = "SimulatedOnly runs no real inference: use a Service's managers or npumanager.connect"
    with pytest.raises(NotImplementedError, match=words):
        model.submit({"x": np.zeros(1)})
    with pytest.raises(NotImplementedError, match=words):
        manager.load_model(req(), model=MODEL)


def test_a_shared_array_in_process_is_plain_memory_a_run_reads(service: Service) -> None:
    app = service.manager(10001, uses_feature=True)
    x = app.shared_array((3, CHAIN_WIDTH))
    assert isinstance(x, np.ndarray) and x.shape == (3, CHAIN_WIDTH) and x.dtype == np.float32
    assert app.shared_array(5, "int8").shape == (5,)
    x[:] = chain_inputs(3)["x"]
    with app.reserve(req(), timeout_s=WAIT_S) as lease:
        model = lease.load_model(model=MODEL)
        assert np.array_equal(model.run({"x": x})[0], model.run(chain_inputs(3))[0])
