"""In-process apps of a real-clock `Service`, for the tests of what asks them to unload."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import npumanager as npu
from helpers.daemon_support import WAIT_S
from npumanager.core.service.service import Service
from npumanager.schemas import UnloadReason

__all__ = ["WAIT_S", "App", "background_app", "wait_for"]


class App(npu.ModelLoadRequestCallback):
    """Loads its model when it may, and gives it back when asked (noting why)."""

    def __init__(self, manager: npu.NpuManager) -> None:
        self.manager = manager
        self.loaded = threading.Event()
        self.unloaded = threading.Event()
        self.reason: UnloadReason | None = None

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == npu.NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW and not self.loaded.is_set():
            self.manager.load_model(request, weight_bytes=1 << 20)
            listener.notify_model_loaded(request)
            self.loaded.set()

    def on_request_unload_model(self, request: Any, reason: Any = None) -> None:
        self.reason = reason
        self.manager.listener.notify_model_unloaded(request)
        self.unloaded.set()


def background_app(service: Service, uid: int = 10_200) -> App:
    """A CACHED uid's app whose background model is loaded."""
    service.set_uid_importance(uid, npu.IMPORTANCE_CACHED)
    app = App(service.manager(uid, uses_feature=True))
    request = (
        npu.ModelLoadRequest.Builder(1)
        .set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB)
        .set_priority(npu.NPU_MODEL_PRIORITY_BACKGROUND)
        .build()
    )
    app.manager.request_can_load_model(request, app)
    assert app.loaded.wait(WAIT_S)
    return app


def wait_for(predicate: Callable[[], Any]) -> None:
    """Wait for an event (`predicate` true); only a hung test outlasts `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"the condition did not hold within {WAIT_S} s"
        time.sleep(0.01)
