"""Two apps share one device through npu-manager, running a real ONNX model for real.

A background app (cached importance) keeps three inferences in flight; a foreground app
runs one inference every 16.7 ms with `LoadedModel.run`. The example shows, with figures
from this run:

1. the foreground latency alone, beside the background app without npu-manager (both
   calling onnxruntime themselves) and beside it through npu-manager;
2. why: the driver's events show the background app never holds more than one of the
   device's two channels, so a foreground inference starts at once on the other;
3. the background app still gets work done (its inferences per second in both cases).

Figures are this machine's CPU; no NPU is used. Needs: pip install -e '.[onnxruntime]'.

    python examples/onnx_two_apps.py
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]
from onnx import TensorProto, helper, numpy_helper

import npumanager as npu
from npumanager.core.driver.events import EventKind, WorkEvent

FOREGROUND, BACKGROUND = 10001, 10002
SECONDS, PERIOD = 3.0, 1 / 60
WIDTH, LAYERS, ROWS = 256, 6, 256


def model_bytes() -> bytes:
    """A chain of tanh(x @ W) layers, built here (no download)."""
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "x"
    for i in range(LAYERS):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == LAYERS - 1 else f"h{i}"
        nodes += [
            helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"]),
            helper.make_node("Tanh", [f"m{i}"], [out]),
        ]
        current = out
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


INPUTS = {"x": np.full((ROWS, WIDTH), 0.5, np.float32)}


def foreground(run: Callable[[], Any]) -> list[float]:
    """Latencies (ms) of one inference every 16.7 ms."""
    out, next_at = [], time.perf_counter()
    end = next_at + SECONDS
    while next_at < end:
        time.sleep(max(0.0, next_at - time.perf_counter()))
        start = time.perf_counter()
        run()
        out.append((time.perf_counter() - start) * 1000)
        next_at += PERIOD
    return out


def p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))]


def direct() -> tuple[list[float], list[float], float]:
    """Both apps call onnxruntime themselves; the background app with three threads."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model_bytes(), options, providers=["CPUExecutionProvider"])
    alone = foreground(lambda: session.run(None, INPUTS))
    stop, done = threading.Event(), [0]

    def loop() -> None:
        while not stop.is_set():
            session.run(None, INPUTS)
            done[0] += 1

    threads = [threading.Thread(target=loop) for _ in range(3)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    shared = foreground(lambda: session.run(None, INPUTS))
    rate = done[0] / (time.perf_counter() - start)
    stop.set()
    for t in threads:
        t.join()
    return alone, shared, rate


class Channels:
    """The most background inferences running at once, from the driver's events."""

    def __init__(self) -> None:
        self.running = self.most = 0

    def __call__(self, events: Sequence[WorkEvent]) -> None:
        for e in events:
            if e.uid == BACKGROUND and e.kind == EventKind.STARTED:
                self.running += 1
                self.most = max(self.most, self.running)
            elif e.uid == BACKGROUND and e.kind == EventKind.ENDED:
                self.running -= 1


def managed() -> tuple[list[float], float, int, int]:
    """Both apps through one Service on the onnxruntime driver (one device, two channels)."""
    with npu.Service("onnxruntime", "status_quo") as svc:
        channels = Channels()
        svc.add_listener(channels)
        svc.set_uid_importance(FOREGROUND, npu.IMPORTANCE_FOREGROUND)
        svc.set_uid_importance(BACKGROUND, npu.IMPORTANCE_CACHED)
        fg_app = svc.manager(FOREGROUND, uses_feature=True)
        bg_app = svc.manager(BACKGROUND, uses_feature=True)
        size = npu.NPU_MODEL_SIZE_LESS_THAN_1GB
        with (
            fg_app.reserve(
                npu.ModelLoadRequest.Builder(1).set_size(size).build(), timeout_s=30
            ) as fg_lease,
            bg_app.reserve(
                npu.ModelLoadRequest.Builder(2).set_size(size).build(), timeout_s=30
            ) as bg_lease,
        ):
            fg = fg_lease.load_model(model=model_bytes())
            bg = bg_lease.load_model(model=model_bytes())
            stop, done = threading.Event(), [0]

            def flood() -> None:
                pending = [bg.submit(INPUTS) for _ in range(3)]
                while not stop.is_set():
                    pending.pop(0).result()
                    done[0] += 1
                    pending.append(bg.submit(INPUTS))
                for handle in pending:
                    handle.cancel()

            flooder = threading.Thread(target=flood)
            flooder.start()
            start = time.perf_counter()
            shared = foreground(lambda: fg.run(INPUTS))
            rate = done[0] / (time.perf_counter() - start)
            stop.set()
            flooder.join()
            svc.driver.pump()
            total = svc.driver.describe_devices()[0].channels
            return shared, rate, channels.most, total


if __name__ == "__main__":
    alone, beside, direct_rate = direct()
    shared, managed_rate, most, total = managed()
    print(f"one inference: {ROWS} rows through {LAYERS} layers of {WIDTH}x{WIDTH}, on the CPU")
    print(f"{'foreground latency':34} {'median ms':>10} {'p99 ms':>8}")
    for label, values in (
        ("alone", alone),
        ("beside background, direct", beside),
        ("beside background, npu-manager", shared),
    ):
        print(f"  {label:32} {statistics.median(values):10.2f} {p99(values):8.2f}")
    print(
        f"background inferences/s: direct {direct_rate:.0f}, through npu-manager {managed_rate:.0f}"
    )
    print(
        f"background inferences running at once through npu-manager: at most {most} of the "
        f"device's {total} channels (one is kept for more important work)"
    )
