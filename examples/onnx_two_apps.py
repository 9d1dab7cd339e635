"""Two apps share the `onnxruntime` driver through the service, on the real clock.

A background app floods the device with inferences of a real ONNX model; a foreground
app submits one inference every 20 ms. The service relays each app's importance as its
scheduling priority, so the foreground app's work runs next (after at most the one
background inference already running: nothing is paused mid-inference) while the
background app's queue waits. Latencies are REQUESTED -> ENDED(COMPLETED) in device
time (the wall clock). Needs the extra: pip install -e '.[onnxruntime]'.

    python examples/onnx_two_apps.py
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import npumanager as npu
from npumanager.core.events import EventKind, WorkEvent
from npumanager.schemas import EndReason
from npumanager.vendor_drivers.onnxruntime.driver import weight_bytes_of

FOREGROUND, BACKGROUND = 10001, 10002
SECONDS = 3.0


def matmul_model(size: int = 512, rows: int = 64):  # type: ignore[no-untyped-def]
    """y = relu(x @ w1) @ w2, weights as initializers (2 * size * size floats)."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((size, size)).astype(np.float32)
    w2 = rng.standard_normal((size, size)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "two_layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, size])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


class Latencies:
    """REQUESTED -> ENDED(COMPLETED) per uid, from the service's raw event batches."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requested: dict[int, int] = {}
        self.by_uid: dict[int, list[float]] = {FOREGROUND: [], BACKGROUND: []}
        self.done = threading.Condition(self.lock)
        self.finished: set[int] = set()

    def __call__(self, events: Sequence[WorkEvent]) -> None:
        with self.lock:
            for e in events:
                if e.kind == EventKind.REQUESTED:
                    self.requested[e.id] = e.time_us
                elif e.kind == EventKind.ENDED and e.reason != EndReason.PAUSED:
                    start = self.requested.pop(e.id, None)
                    if start is not None and e.reason == EndReason.COMPLETED:
                        self.by_uid.setdefault(e.uid, []).append((e.time_us - start) / 1000)
                    self.finished.add(e.id)
            self.done.notify_all()

    def wait(self, work: int, timeout: float = 5.0) -> None:
        with self.lock:
            self.done.wait_for(lambda: work in self.finished, timeout)


class Holder(npu.ModelLoadRequestCallback):
    """Loads the model as soon as the service allows it, and keeps it."""

    def __init__(self, app: npu.NpuManager, weight_bytes: int) -> None:
        self.app = app
        self.weight_bytes = weight_bytes
        self.model: npu.LoadedModel | None = None
        self.ready = threading.Event()

    def on_can_load_model(self, request, status, listener):  # type: ignore[no-untyped-def]
        if status == npu.NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW:
            self.model = self.app.load_model(request, weight_bytes=self.weight_bytes)
            listener.notify_model_loaded(request)
            self.ready.set()

    def on_request_unload_model(self, request, reason=None):  # type: ignore[no-untyped-def]
        self.app.listener.notify_model_unloaded(request)


def load(service: npu.Service, uid: int, model_proto) -> npu.LoadedModel:  # type: ignore[no-untyped-def]
    app = service.manager(uid, uses_feature=True)
    request = (
        npu.ModelLoadRequest.Builder(1)
        .set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB)
        .set_priority(npu.NPU_MODEL_PRIORITY_NORMAL)
        .build()
    )
    holder = Holder(app, weight_bytes_of(model_proto))
    app.request_can_load_model(request, holder)
    if not holder.ready.wait(5) or holder.model is None:
        raise SystemExit(f"uid {uid} was not allowed to load its model")
    return holder.model


def run(with_background: bool) -> Latencies:
    proto = matmul_model()
    service = npu.Service("onnxruntime", "status_quo", clock="real", devices=[{"channels": 1}])
    latencies = Latencies()
    service.add_listener(latencies)
    service.set_uid_importance(FOREGROUND, npu.IMPORTANCE_FOREGROUND)
    service.set_uid_importance(BACKGROUND, npu.IMPORTANCE_CACHED)
    try:
        fg = load(service, FOREGROUND, proto)
        bg = load(service, BACKGROUND, proto)
        cost = service.driver.bind(fg.handle, proto)
        service.driver.bind(bg.handle, proto)
        stop = threading.Event()

        def flood() -> None:
            while not stop.is_set():
                if service.driver.device_state(0).queue_depth < 8:
                    bg.submit(cost)
                time.sleep(cost / 1e9 / 2)

        flooder = threading.Thread(target=flood, daemon=True)
        if with_background:
            flooder.start()
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            latencies.wait(fg.submit(cost))
            time.sleep(0.02)
        stop.set()
        if with_background:
            flooder.join()
        print(f"  one inference measured at {cost / 1e6:.2f} ms")
    finally:
        service.close()
    return latencies


def median(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} ms (n={len(values)})" if values else "  -"


if __name__ == "__main__":
    print("foreground alone:")
    alone = run(with_background=False)
    print(f"  foreground median latency {median(alone.by_uid[FOREGROUND])}")
    print("foreground with a background flood:")
    shared = run(with_background=True)
    print(f"  foreground median latency {median(shared.by_uid[FOREGROUND])}")
    print(f"  background median latency {median(shared.by_uid[BACKGROUND])}")
