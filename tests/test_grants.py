"""What a grant allows: bytes bounded by the request's size class or declared bytes, and work
ids that act only on the model that submitted them."""

from __future__ import annotations

from typing import Any

import pytest

from npumanager import (
    EndReason,
    Importance,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelLoadStatus,
    ModelSize,
    Service,
)
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.errors import CapacityError, UnknownWorkError
from npumanager.schemas.limits import GIB, grant_allowance_bytes


class Granted(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.statuses: list[ModelLoadStatus] = []

    def on_can_load_model(self, request: Any, status: ModelLoadStatus, listener: Any) -> None:
        self.statuses.append(status)


def granted(svc: Service, uid: int, request_id: int, size: ModelSize, **kw: Any) -> Any:
    app = svc.manager(uid, uses_feature=True)
    request = ModelLoadRequest.Builder(request_id).set_size(size).build()
    callback = Granted()
    app.request_can_load_model(request, callback, **kw)
    assert callback.statuses[-1] == ModelLoadStatus.CAN_LOAD_NOW
    return app, request


def used_bytes(svc: Service) -> int:
    return sum(
        svc.driver.device_state(d).weight_memory_used_bytes for d in range(svc.driver.device_count)
    )


@pytest.mark.parametrize(
    ("size", "allowed"),
    [
        (ModelSize.LESS_THAN_1GB, GIB),
        (ModelSize.BETWEEN_1GB_AND_2GB, 2 * GIB),
        (ModelSize.GREATER_THAN_2G, 4 * GIB),
    ],
)
def test_the_allowance_of_each_size_class(size: ModelSize, allowed: int) -> None:
    assert grant_allowance_bytes(size, None) == allowed
    assert grant_allowance_bytes(size, 12345) == 12345


def test_one_small_grant_cannot_fill_the_device_under_budget() -> None:
    specs = [{"weight_memory_bytes": 8 * GIB}]
    with Service("reference", "budget", clock="virtual", devices=specs) as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        app, request = granted(svc, 10002, 1, ModelSize.LESS_THAN_1GB)
        app.load_model(request, weight_bytes=GIB)
        before = used_bytes(svc)
        with pytest.raises(CapacityError, match=r"request 1 was granted LESS_THAN_1GB"):
            app.load_model(request, weight_bytes=GIB)
        assert used_bytes(svc) == before == GIB, "the refused load left nothing behind"
        # Two smaller models that fit the allowance together are fine.
        app2, request2 = granted(svc, 10002, 2, ModelSize.LESS_THAN_1GB)
        app2.load_model(request2, weight_bytes=GIB // 2)
        app2.load_model(request2, weight_bytes=GIB // 2)
        with pytest.raises(CapacityError, match="holds 1073741824 of 1073741824 bytes"):
            app2.load_model(request2, weight_bytes=1)


def test_declared_bytes_bound_the_grant_under_pressure() -> None:
    with Service("reference", "pressure", clock="virtual") as svc:
        app, request = granted(svc, 10003, 1, ModelSize.LESS_THAN_1GB, weight_bytes=1 << 20)
        with pytest.raises(CapacityError, match="declared 1048576 bytes"):
            app.load_model(request, weight_bytes=GIB)
        assert used_bytes(svc) == 0
        app.load_model(request, weight_bytes=1 << 20)
        assert used_bytes(svc) == 1 << 20


def test_a_foreground_grant_is_not_starved_by_an_overloaded_background_grant() -> None:
    """The attack of the hardening issue: six 1 GiB loads under one LESS_THAN_1GB grant."""
    specs = [{"weight_memory_bytes": 6 * GIB}]
    params = {"max_budget": 5}  # room for both grants: only the overload could block the second
    with Service(
        "reference", "budget", policy_params=params, clock="virtual", devices=specs
    ) as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        bg, bg_request = granted(svc, 10002, 1, ModelSize.LESS_THAN_1GB)
        loaded = 0
        for _ in range(6):
            try:
                bg.load_model(bg_request, weight_bytes=GIB)
                loaded += 1
            except CapacityError:
                pass
        assert loaded == 1
        fg, fg_request = granted(svc, 10001, 2, ModelSize.GREATER_THAN_2G)
        fg.load_model(fg_request, weight_bytes=4 * GIB)
        assert used_bytes(svc) == 5 * GIB


def test_a_work_id_acts_only_on_the_model_that_submitted_it() -> None:
    with Service("reference", "status_quo", clock="virtual") as svc:
        victim_app, victim_request = granted(svc, 10001, 1, ModelSize.LESS_THAN_1GB)
        thief_app, thief_request = granted(svc, 10002, 2, ModelSize.LESS_THAN_1GB)
        victim = victim_app.load_model(victim_request, weight_bytes=1 << 20)
        thief = thief_app.load_model(thief_request, weight_bytes=1 << 20)
        events: list[WorkEvent] = []
        svc.add_listener(events.extend)
        work = victim.submit(50_000_000)
        svc.advance(1)
        with pytest.raises(UnknownWorkError, match=f"work {work} is not live work of model"):
            thief.cancel(work)
        svc.run_until_idle()
        ends = [(e.id, e.reason) for e in events if e.kind == EventKind.ENDED]
        assert ends == [(work, EndReason.COMPLETED)]
        # The owner can still cancel its own, and an ended id is no longer anyone's.
        second = victim.submit(50_000_000)
        victim.cancel(second)
        with pytest.raises(UnknownWorkError):
            victim.cancel(work)
