"""`npu-manager demo --real`: the demo's camera and background apps as real models, on the
wall clock, through a real driver (`onnxruntime`, `openvino`) on this machine's device.

The camera (foreground) runs one inference per 33 ms frame with a 33 ms deadline; the
background app (cached) keeps three inferences in flight. *Direct*: each app opens its own
driver (its own runtime session, nobody arbitrates), as before npu-manager. *Managed*: both
go through one `Service`. The keys are the simulated demo's where they apply.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from npumanager.core.driver import TimedWork
from npumanager.core.plugins import PluginRegistry
from npumanager.core.service import Service
from npumanager.errors import NpuManagerError
from npumanager.schemas import ModelLoadRequest, ModelSize
from npumanager.schemas.enums import Importance

CAMERA, BACKGROUND = 10100, 10300
FRAME_S = 0.033
CAMERA_MS, BACKGROUND_MS = 4.0, 10.0
"""Rough duration of one inference of each app here."""
IN_FLIGHT = 3


def _calibrate(
    registry: PluginRegistry, driver: str
) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    """The model built in code and each app's inputs, sized on this machine."""
    probe: Any = registry.driver(driver).factory()
    close = probe.close
    if not isinstance(probe, TimedWork):
        close()
        raise NpuManagerError(
            f"driver {driver!r} runs no real models; demo --real takes {', '.join(REAL_DRIVERS)}"
        )
    try:
        model = probe.load_timed_model()
        return (
            probe.timed_model(),
            probe.timed_inputs(model, CAMERA_MS),
            probe.timed_inputs(model, BACKGROUND_MS),
        )
    finally:
        close()


def _camera(run: Any, seconds: float) -> list[float]:
    latencies: list[float] = []
    next_at = time.perf_counter()
    end = next_at + seconds
    while next_at < end:
        time.sleep(max(0.0, next_at - time.perf_counter()))
        start = time.perf_counter()
        run()
        latencies.append((time.perf_counter() - start) * 1000)
        next_at = max(next_at + FRAME_S, time.perf_counter() - FRAME_S)
    return latencies


def _background(submit: Any, stop: threading.Event, done: list[int]) -> None:
    pending = [submit() for _ in range(IN_FLIGHT)]
    while not stop.is_set():
        pending.pop(0).result()
        done[0] += 1
        pending.append(submit())
    for handle in pending:
        handle.cancel()


def _metrics(latencies: list[float], background: int) -> dict[str, Any]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
    misses = sum(1 for value in latencies if value > FRAME_S * 1000)
    return {
        "camera_frames": len(latencies),
        "camera_deadline_misses": misses,
        "camera_p99_ms": round(p99, 2),
        "background_jobs_done": background,
        "jobs_done": {"camera": len(latencies), "background": background},
    }


def _play(camera: Any, submit_background: Any, seconds: float) -> dict[str, Any]:
    stop, done = threading.Event(), [0]
    flood = threading.Thread(target=_background, args=(submit_background, stop, done))
    flood.start()
    try:
        latencies = _camera(camera, seconds)
    finally:
        stop.set()
        flood.join()
    return _metrics(latencies, done[0])


def run_direct(registry: PluginRegistry, driver: str, seconds: float) -> dict[str, Any]:
    """Each app with its own driver and runtime session, nobody arbitrating."""
    model, camera_in, background_in = _calibrate(registry, driver)
    factory = registry.driver(driver).factory
    cam: Any = factory(devices=[{"channels": 1}], reserved_channels=0)
    bg: Any = factory(devices=[{"channels": IN_FLIGHT}], reserved_channels=0)
    try:
        cam_model, bg_model = cam.load_model(0, model=model), bg.load_model(0, model=model)
        return _play(
            lambda: cam.run_inference(cam_model, uid=CAMERA, inputs=camera_in),
            lambda: bg.submit_future(bg_model, uid=BACKGROUND, inputs=background_in),
            seconds,
        )
    finally:
        cam.close()
        bg.close()


def run_managed(registry: PluginRegistry, driver: str, seconds: float) -> dict[str, Any]:
    """Both apps through one `Service` on one device of the real driver (its default
    channels, one of them left free of background work)."""
    model, camera_in, background_in = _calibrate(registry, driver)
    with Service(driver, "status_quo", registry=registry) as svc:
        svc.set_uid_importance(CAMERA, Importance.FOREGROUND)
        svc.set_uid_importance(BACKGROUND, Importance.CACHED)
        camera_app = svc.manager(CAMERA, uses_feature=True)
        background_app = svc.manager(BACKGROUND, uses_feature=True)
        request = ModelLoadRequest.Builder(1).set_size(ModelSize.LESS_THAN_1GB).build()
        other = ModelLoadRequest.Builder(2).set_size(ModelSize.LESS_THAN_1GB).build()
        with (
            camera_app.reserve(request, timeout_s=30) as cam_lease,
            background_app.reserve(other, timeout_s=30) as bg_lease,
        ):
            cam = cam_lease.load_model(model=model)
            bg = bg_lease.load_model(model=model)
            return _play(lambda: cam.run(camera_in), lambda: bg.submit(background_in), seconds)


REAL_DRIVERS = ("openvino", "onnxruntime")
"""The real drivers `demo --real` picks from, in order, when none is named."""


def pick_driver(registry: PluginRegistry, asked: str | None) -> str:
    """The named driver, or the first real driver installed."""
    if asked is not None:
        return asked
    for name in REAL_DRIVERS:
        try:
            registry.driver(name)
        except LookupError:
            continue
        return name
    raise LookupError(
        "no real driver is installed: pip install 'npu-manager[onnxruntime]' or '[openvino]'"
    )
