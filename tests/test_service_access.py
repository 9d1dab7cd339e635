"""Per-uid access overrides, the service snapshot, and leaving with `NpuManager.close()`."""

from __future__ import annotations

from typing import Any

import pytest

from npumanager import ModelLoadRequest, ModelLoadRequestCallback, Service
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.errors import IllegalArgumentError, NpuPermissionError, UnknownRequestError
from npumanager.schemas import EndReason, Importance, ModelLoadRequestStatus, ModelLoadStatus

MIB = 1 << 20


class Loader(ModelLoadRequestCallback):
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.models: list[Any] = []
        self.completions: list[ModelLoadRequestStatus] = []

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == ModelLoadStatus.CAN_LOAD_NOW:
            self.models.append(self.manager.load_model(request, weight_bytes=MIB))
            listener.notify_model_loaded(request)

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        self.completions.append(status)


def loaded(svc: Service, uid: int, request_id: int = 1) -> Loader:
    app = svc.manager(uid, uses_feature=True)
    loader = Loader(app)
    app.request_can_load_model(ModelLoadRequest.Builder(request_id).build(), loader)
    assert loader.models, "status quo grants at once"
    return loader


def test_denying_direct_access_relays_a_config_and_the_work_fails() -> None:
    with Service("reference", clock="virtual") as svc:
        events: list[WorkEvent] = []
        svc.add_listener(events.extend)
        loader = loaded(svc, 10001)
        svc.set_uid_access(10001, has_direct_access=False)
        config = svc.arbiter.scheduling_config(10001)
        assert config.has_direct_access is False
        assert config.can_attribute_other_uid is False
        work = loader.models[0].submit(1000)
        svc.run_until_idle()
        ended = [e.reason for e in events if e.id == work and e.kind == EventKind.ENDED]
        assert ended == [EndReason.FAILED]

        svc.set_uid_access(10001, has_direct_access=True)
        again = loader.models[0].submit(1000)
        svc.run_until_idle()
        ended = [e.reason for e in events if e.id == again and e.kind == EventKind.ENDED]
        assert ended == [EndReason.COMPLETED]


def test_granting_attribution_lets_a_uid_attribute_work_to_another() -> None:
    with Service("reference", clock="virtual") as svc:
        loader = loaded(svc, 10001)
        with pytest.raises(NpuPermissionError, match="may not attribute work to uid 10009"):
            loader.models[0].submit(1000, original_uid=10009)
        svc.set_uid_access(10001, can_attribute_other_uid=True)
        assert svc.arbiter.scheduling_config(10001).has_direct_access is True
        events: list[WorkEvent] = []
        svc.add_listener(events.extend)
        work = loader.models[0].submit(1000, original_uid=10009)
        svc.run_until_idle()
        assert {(e.uid, e.original_uid) for e in events if e.id == work} == {(10001, 10009)}


def test_an_override_survives_an_importance_change() -> None:
    with Service("reference", clock="virtual") as svc:
        svc.set_uid_access(10001, has_direct_access=False)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        config = svc.arbiter.scheduling_config(10001)
        assert (config.app_priority, config.has_direct_access) == (100, False)


def test_root_and_system_keep_their_access() -> None:
    with Service("reference", clock="virtual") as svc:
        for uid in (0, 1000):
            svc.set_uid_access(uid, has_direct_access=False, can_attribute_other_uid=False)
            config = svc.arbiter.scheduling_config(uid)
            assert config.has_direct_access and config.can_attribute_other_uid


@pytest.mark.parametrize("value", [1, "yes", 0.0])
def test_access_values_must_be_bools(value: object) -> None:
    with Service("reference", clock="virtual") as svc:
        with pytest.raises(IllegalArgumentError, match="must be true, false or None"):
            svc.set_uid_access(10001, has_direct_access=value)  # type: ignore[arg-type]
        assert svc.arbiter.scheduling_config(10001).has_direct_access is True


def test_snapshot_reports_policy_configs_requests_and_devices() -> None:
    with Service("reference", "budget", clock="virtual", policy_params={"max_budget": 6}) as svc:
        svc.set_uid_importance(10001, Importance.VISIBLE)
        loaded(svc, 10001, request_id=4)
        snapshot = svc.snapshot()
    assert snapshot["policy"] == {
        "name": "budget",
        "params": {"weights": [1, 2, 4], "max_budget": 6},
    }
    assert {"uid": 10001, "priority": 200}.items() <= next(
        c for c in snapshot["priorities"] if c["uid"] == 10001
    ).items()
    (entry,) = snapshot["requests"]["loaded"]
    assert (entry["uid"], entry["id"], entry["size"], entry["weight"]) == (
        10001,
        4,
        "LESS_THAN_1GB",
        1,
    )
    assert all(not v for k, v in snapshot["requests"].items() if k != "loaded")
    device = snapshot["devices"][0]
    assert device["models_loaded"] == 1 and device["weight_memory_used_bytes"] == MIB
    assert device["running"] == 0 and device["channels"] >= 1


def test_closing_a_manager_ends_its_requests() -> None:
    with Service("reference", "turn_taking", clock="virtual") as svc:
        holder = loaded(svc, 10001)
        manager = holder.manager
        waiter_app = svc.manager(10002, uses_feature=True)
        waiter = Loader(waiter_app)
        waiter_app.request_can_load_model(ModelLoadRequest.Builder(1).build(), waiter)
        assert not waiter.models
        manager.close()
        with pytest.raises(UnknownRequestError):
            svc.state_of(manager, ModelLoadRequest.Builder(1).build())
        assert holder.completions == [ModelLoadRequestStatus.COMPLETE]
        assert waiter.models, "the next app got its turn"
        manager.close()  # closing twice is harmless
