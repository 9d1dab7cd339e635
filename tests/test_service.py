"""The service and the client API, end to end, in virtual time on the reference driver."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import npumanager
from helpers.daemon_support import WAIT_S
from npumanager import (
    EndReason,
    Importance,
    LeaseEndedError,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    ModelSize,
    Service,
    UnloadReason,
)
from npumanager.core.arbiter.actions import RequestState
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.errors import (
    DuplicateRequestError,
    FeatureNotDeclaredError,
    FeatureWarning,
    IllegalArgumentError,
    NpuPermissionError,
    PolicyParamsError,
    RequestStateError,
    UnknownModelError,
    UnknownPluginError,
    UnknownRequestError,
)

BIG = ModelSize.GREATER_THAN_2G
GIB = 1 << 30


def service(policy: str = "status_quo", **kwargs: Any) -> Service:
    kwargs.setdefault("clock", "virtual")
    return Service("reference", policy, **kwargs)


def req(request_id: int, size: ModelSize = ModelSize.LESS_THAN_1GB) -> ModelLoadRequest:
    return ModelLoadRequest.Builder(request_id).set_size(size).build()


class Recorder(ModelLoadRequestCallback):
    """Records every callback; optionally loads on CAN_LOAD_NOW and unloads when asked."""

    def __init__(self, manager: Any, *, load: bool = True, obey: bool = True) -> None:
        self.manager = manager
        self.load = load
        self.obey = obey
        self.calls: list[tuple[str, Any]] = []
        self.threads: set[str] = set()
        self.models: list[Any] = []

    def on_can_load_model(
        self, request: ModelLoadRequest, status: ModelLoadStatus, listener: Any
    ) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls.append(("can_load", status))
        if status == ModelLoadStatus.CAN_LOAD_NOW and self.load:
            self.models.append(self.manager.load_model(request, weight_bytes=GIB // 4))
            listener.notify_model_loaded(request)

    def on_request_unload_model(
        self, request: ModelLoadRequest, reason: UnloadReason | None = None
    ) -> None:
        self.calls.append(("unload", reason))
        if self.obey:
            self.manager.listener.notify_model_unloaded(request)

    def on_model_load_request_complete(
        self, request: ModelLoadRequest, status: ModelLoadRequestStatus
    ) -> None:
        self.calls.append(("complete", status))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


# The platform's acceptance flows -----------------------------------------------------------


def test_status_quo_grants_at_once_and_cancel_completes_cancelled() -> None:
    with service() as svc:
        app = svc.manager(10001, uses_feature=True)
        recorder = Recorder(app, load=False)
        request = req(54)
        app.request_can_load_model(request, recorder)
        assert recorder.calls == [("can_load", ModelLoadStatus.CAN_LOAD_NOW)]
        app.cancel_model_load(request)
        assert recorder.calls[-1] == ("complete", ModelLoadRequestStatus.CANCELLED)


@pytest.mark.parametrize("policy", ["turn_taking", "budget"])
def test_foreground_request_makes_the_background_app_unload(policy: str) -> None:
    with service(policy) as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        background = svc.manager(10002, uses_feature=True)
        foreground = svc.manager(10001, uses_feature=True)
        bg = Recorder(background)
        background.request_can_load_model(req(1, BIG), bg)
        assert bg.calls == [("can_load", ModelLoadStatus.CAN_LOAD_NOW)]
        assert svc.state_of(background, req(1, BIG)) == RequestState.LOADED
        fg = Recorder(foreground)
        foreground.request_can_load_model(req(2, BIG), fg)
        assert fg.calls[0] == ("can_load", ModelLoadStatus.WAIT_FOR_UNLOAD)
        assert ("unload", UnloadReason.HIGHER_PRIORITY_REQUEST) in bg.calls
        assert bg.calls[-1] == ("complete", ModelLoadRequestStatus.COMPLETE)
        assert fg.calls[-1] == ("can_load", ModelLoadStatus.CAN_LOAD_NOW)
        assert svc.state_of(foreground, req(2, BIG)) == RequestState.LOADED


def test_a_granted_request_that_never_reports_loaded_still_holds_its_budget() -> None:
    with service("turn_taking") as svc:
        first = svc.manager(10001, uses_feature=True)
        second = svc.manager(10002, uses_feature=True)
        holder = Recorder(first, load=False)
        first.request_can_load_model(req(1), holder)
        assert holder.calls == [("can_load", ModelLoadStatus.CAN_LOAD_NOW)]
        other = Recorder(second)
        second.request_can_load_model(req(2), other)
        assert other.calls == [("can_load", ModelLoadStatus.NOT_PRIORITIZED)]


def test_a_dead_client_frees_its_share() -> None:
    with service("turn_taking") as svc:
        first = svc.manager(10001, uses_feature=True)
        second = svc.manager(10002, uses_feature=True)
        first.request_can_load_model(req(1), Recorder(first))
        waiting = Recorder(second)
        second.request_can_load_model(req(2), waiting)
        assert waiting.calls == [("can_load", ModelLoadStatus.NOT_PRIORITIZED)]
        svc.client_died(first)
        assert waiting.calls[-1] == ("can_load", ModelLoadStatus.CAN_LOAD_NOW)


def test_setting_the_policy_without_permission_is_refused() -> None:
    with service() as svc:
        app = svc.manager(10001)
        with pytest.raises(NpuPermissionError, match="needs the management permission"):
            app.set_policy(npumanager.NPU_MODEL_POLICY_BUDGET)
        assert svc.policy_name == "status_quo"
        svc.manager(1000).set_policy(npumanager.NPU_MODEL_POLICY_BUDGET, {"max_budget": 8})
        assert svc.policy_name == "budget"


# Robustness ----------------------------------------------------------------------------------


def test_a_client_that_ignores_an_unload_request_is_revoked_after_the_grace_period() -> None:
    with service("turn_taking", unload_grace_ms=200) as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        stubborn_app = svc.manager(10002, uses_feature=True)
        stubborn = Recorder(stubborn_app, obey=False)
        stubborn_app.request_can_load_model(req(1), stubborn)
        work = stubborn.models[0].submit(10**12)
        events: list[WorkEvent] = []
        svc.add_listener(events.extend)
        fg_app = svc.manager(10001, uses_feature=True)
        fg = Recorder(fg_app)
        fg_app.request_can_load_model(req(2), fg)
        assert stubborn.names()[-1] == "unload"
        svc.advance(199)
        assert stubborn.names()[-1] == "unload", "still inside the grace period"
        svc.advance(2)
        assert stubborn.calls[-1] == ("complete", ModelLoadRequestStatus.COMPLETE)
        ended = [e for e in events if e.id == work and e.kind == EventKind.ENDED]
        assert [EndReason(e.reason) for e in ended] == [EndReason.CANCELLED_SYSTEM]
        assert fg.calls[-1] == ("can_load", ModelLoadStatus.CAN_LOAD_NOW)
        with pytest.raises(UnknownModelError, match="no longer loaded"):
            stubborn.models[0].submit(1)


def test_a_raising_callback_is_isolated() -> None:
    class Broken(Recorder):
        def on_can_load_model(self, *args: Any) -> None:
            raise RuntimeError("client bug")

    with service() as svc:
        bad_app = svc.manager(10001, uses_feature=True)
        good_app = svc.manager(10002, uses_feature=True)
        bad_app.request_can_load_model(req(1), Broken(bad_app))
        good = Recorder(good_app)
        good_app.request_can_load_model(req(2), good)
        assert good.calls == [("can_load", ModelLoadStatus.CAN_LOAD_NOW)]
        assert svc.callback_errors == 1


def test_callbacks_run_on_the_given_executor_in_order() -> None:
    with ThreadPoolExecutor(4, thread_name_prefix="app") as pool, service("turn_taking") as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        bg_app = svc.manager(10002, uses_feature=True)
        bg = Recorder(bg_app)
        bg_app.request_can_load_model(req(1), bg, pool)
        done = threading.Event()

        class Waiter(Recorder):
            def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
                super().on_can_load_model(request, status, listener)
                if status == ModelLoadStatus.CAN_LOAD_NOW:
                    done.set()

        fg_app = svc.manager(10001, uses_feature=True)
        wait_for(lambda: bg.names() == ["can_load"])
        fg = Waiter(fg_app)
        fg_app.request_can_load_model(req(2), fg, pool)
        assert done.wait(WAIT_S)
        assert fg.names() == ["can_load", "can_load"]
        assert [s for _, s in fg.calls] == [
            ModelLoadStatus.WAIT_FOR_UNLOAD,
            ModelLoadStatus.CAN_LOAD_NOW,
        ]
        assert all(name.startswith("app") for name in fg.threads | bg.threads)


def test_a_plain_callable_is_an_executor() -> None:
    ran: list[str] = []

    def executor(task: Any) -> None:
        ran.append("via executor")
        task()

    with service() as svc:
        app = svc.manager(10001, uses_feature=True)
        recorder = Recorder(app, load=False)
        app.request_can_load_model(req(1), recorder, executor)
        assert ran == ["via executor"]
        assert recorder.calls == [("can_load", ModelLoadStatus.CAN_LOAD_NOW)]


def test_platform_style_callback_without_a_reason_argument() -> None:
    class OldStyle(Recorder):
        def on_request_unload_model(self, request: ModelLoadRequest) -> None:  # type: ignore[override]
            self.calls.append(("unload", None))
            self.manager.listener.notify_model_unloaded(request)

    with service("turn_taking") as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        old_app = svc.manager(10002, uses_feature=True)
        old = OldStyle(old_app)
        old_app.request_can_load_model(req(1), old)
        fg_app = svc.manager(10001, uses_feature=True)
        fg_app.request_can_load_model(req(2), Recorder(fg_app))
        assert ("unload", None) in old.calls


# Priorities reach the driver ----------------------------------------------------------------


def test_importance_is_relayed_to_the_driver_as_scheduling_configs() -> None:
    with service(attribution_uids=[10005]) as svc:
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        svc.set_uid_importance(10002, 400)
        configs = svc.driver.scheduling_configs
        assert configs[10001].app_priority == 100
        assert configs[10002].app_priority == 400
        svc.set_uid_importance(0, Importance.CACHED)
        assert svc.driver.scheduling_configs[0].app_priority == 100, "root is pinned"
        svc.set_uid_importance(10005, Importance.SERVICE)
        assert svc.driver.scheduling_configs[10005].can_attribute_other_uid


def test_foreground_work_runs_before_background_work() -> None:
    with service() as svc:
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        svc.set_uid_importance(10002, Importance.CACHED)
        fg_app = svc.manager(10001, uses_feature=True)
        bg_app = svc.manager(10002, uses_feature=True)
        fg, bg = Recorder(fg_app), Recorder(bg_app)
        bg_app.request_can_load_model(req(1), bg)
        fg_app.request_can_load_model(req(2), fg)
        events: list[WorkEvent] = []
        svc.add_listener(events.extend)
        for _ in range(8):
            bg.models[0].submit(5_000_000)
        urgent = fg.models[0].submit(1_000_000)
        svc.run_until_idle()
        done = [
            e.id for e in events if e.kind == EventKind.ENDED and e.reason == EndReason.COMPLETED
        ]
        assert done[0] == urgent, "100 + 0 beats 400 + 0: it preempts and finishes first"


def test_attribution_needs_permission() -> None:
    with service(attribution_uids=[10005]) as svc:
        app = svc.manager(10001, uses_feature=True)
        recorder = Recorder(app)
        app.request_can_load_model(req(1), recorder)
        with pytest.raises(NpuPermissionError, match="may not attribute work to uid 10009"):
            recorder.models[0].submit(1000, original_uid=10009)


# Leases ----------------------------------------------------------------------------------------


def test_lease_waits_for_can_load_now_and_reports_unloaded_on_exit() -> None:
    with service("turn_taking") as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        bg_app = svc.manager(10002, uses_feature=True)
        bg = Recorder(bg_app)
        bg_app.request_can_load_model(req(1), bg)
        fg_app = svc.manager(10001, uses_feature=True)
        with fg_app.reserve(req(2)) as lease:
            assert lease.status == ModelLoadStatus.CAN_LOAD_NOW
            model = lease.load_model(GIB)
            assert svc.state_of(fg_app, req(2)) == RequestState.LOADED
            model.submit(1000)
            assert not lease.unload_requested
        assert bg.calls[-1] == ("complete", ModelLoadRequestStatus.COMPLETE)
        with pytest.raises(UnknownRequestError):
            svc.state_of(fg_app, req(2))


def test_lease_exposes_an_unload_request_and_its_reason() -> None:
    with service("turn_taking") as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        bg_app = svc.manager(10002, uses_feature=True)
        fg_app = svc.manager(10001, uses_feature=True)
        with bg_app.reserve(req(1)) as lease:
            lease.load_model(GIB)
            fg_app.request_can_load_model(req(2), Recorder(fg_app))
            assert lease.unload_requested
            assert lease.unload_reason == UnloadReason.HIGHER_PRIORITY_REQUEST


def test_a_virtual_lease_that_nothing_can_grant_fails_instead_of_hanging() -> None:
    with service("turn_taking") as svc:
        holder = svc.manager(10001, uses_feature=True)
        holder.request_can_load_model(req(1), Recorder(holder))
        other = svc.manager(10002, uses_feature=True)
        with (
            pytest.raises(TimeoutError, match="nothing in virtual time can grant it"),
            other.reserve(req(2)),
        ):
            pass
        with pytest.raises(UnknownRequestError):
            svc.state_of(other, req(2))


def test_lease_times_out_and_cancels() -> None:
    with service("turn_taking") as svc:
        holder = svc.manager(10001, uses_feature=True)
        busy = Recorder(holder)
        holder.request_can_load_model(req(1), busy)
        busy.models[0].submit(10**12)
        other = svc.manager(10002, uses_feature=True)
        with (
            pytest.raises(TimeoutError, match="not granted within 0.5 s"),
            other.reserve(req(2), timeout_s=0.5),
        ):
            pass
        with pytest.raises(UnknownRequestError):
            svc.state_of(other, req(2))


def test_lease_ends_when_the_request_is_cancelled_first() -> None:
    with service("turn_taking") as svc:
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        svc.set_uid_importance(10002, Importance.CACHED)
        bg_app = svc.manager(10002, uses_feature=True)
        fg_app = svc.manager(10001, uses_feature=True)
        bg_lease = bg_app.reserve(req(1))
        bg_lease._start()
        fg_app.request_can_load_model(req(2), Recorder(fg_app))
        with pytest.raises(LeaseEndedError, match="ended .CANCELLED. before it was granted"):
            bg_lease._result()


def test_async_lease() -> None:
    async def scenario(svc: Service) -> ModelLoadStatus | None:
        app = svc.manager(10001, uses_feature=True)
        async with app.reserve_async(req(7)) as lease:
            lease.load_model(GIB)
            return lease.status

    with service() as svc:
        assert asyncio.run(scenario(svc)) == ModelLoadStatus.CAN_LOAD_NOW


# The feature declaration ------------------------------------------------------------------------


def test_undeclared_clients_get_a_warning_once() -> None:
    with service() as svc:
        app = svc.manager(10001)
        with pytest.warns(FeatureWarning, match="without declaring the feature"):
            app.request_can_load_model(req(1), Recorder(app, load=False))
        app.request_can_load_model(req(2), Recorder(app, load=False))


def test_a_blocking_service_refuses_undeclared_clients() -> None:
    with service(feature_mode="block") as svc:
        app = svc.manager(10001)
        with pytest.raises(FeatureNotDeclaredError, match="declare_feature"):
            app.request_can_load_model(req(1), Recorder(app))
        app.declare_feature()
        recorder = Recorder(app, load=False)
        app.request_can_load_model(req(1), recorder)
        assert recorder.calls == [("can_load", ModelLoadStatus.CAN_LOAD_NOW)]


# Bad input ------------------------------------------------------------------------------------


def test_unknown_policy_or_driver_names_what_exists() -> None:
    with pytest.raises(UnknownPluginError, match="unknown policy 'nope'; available: budget"):
        Service("reference", "nope", clock="virtual")
    with pytest.raises(UnknownPluginError, match="unknown driver 'nope'"):
        Service("nope", clock="virtual")
    with pytest.raises(IllegalArgumentError, match="cannot run a real clock"):
        Service("reference", clock="real")


@pytest.mark.parametrize(
    ("policy", "params", "message"),
    [
        ("budget", {"max_budget": 0}, "max_budget"),
        ("budget", {"weights": [1, 2]}, "weights"),
        ("budget", {"surprise": 1}, "surprise"),
        ("turn_taking", {"max_budget": 2}, "takes no parameters"),
    ],
)
def test_bad_policy_params_are_refused(policy: str, params: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyParamsError, match=message):
        service(policy, policy_params=params)
    with service() as svc:
        with pytest.raises(PolicyParamsError, match=message):
            svc.set_policy(policy, params)
        assert svc.policy_name == "status_quo"


def test_request_id_reused_while_live_is_refused_and_nothing_changes() -> None:
    with service() as svc:
        app = svc.manager(10001, uses_feature=True)
        first = Recorder(app, load=False)
        app.request_can_load_model(req(1), first)
        second = Recorder(app, load=False)
        with pytest.raises(DuplicateRequestError, match="request id 1 is already live"):
            app.request_can_load_model(req(1), second)
        assert second.calls == []
        app.cancel_model_load(req(1))
        assert first.calls[-1] == ("complete", ModelLoadRequestStatus.CANCELLED)
        app.request_can_load_model(req(1), second)
        assert second.calls == [("can_load", ModelLoadStatus.CAN_LOAD_NOW)]


@pytest.mark.parametrize("weight_bytes", [0, -1, "1", 2**63])
def test_a_bad_weight_is_refused_and_nothing_is_left(weight_bytes: Any) -> None:
    with service() as svc:
        app = svc.manager(10001, uses_feature=True)
        recorder = Recorder(app, load=False)
        with pytest.raises(IllegalArgumentError, match="weight_bytes"):
            app.request_can_load_model(req(1), recorder, weight_bytes=weight_bytes)
        assert recorder.calls == []
        with pytest.raises(UnknownRequestError):
            svc.state_of(app, req(1))
        app.request_can_load_model(req(1), recorder, weight_bytes=1 << 20)
        assert recorder.calls == [("can_load", ModelLoadStatus.CAN_LOAD_NOW)]


def test_notify_before_grant_and_cancel_of_someone_elses_request_are_refused() -> None:
    with service("turn_taking") as svc:
        holder = svc.manager(10001, uses_feature=True)
        holder.request_can_load_model(req(1), Recorder(holder))
        other = svc.manager(10002, uses_feature=True)
        refused = Recorder(other)
        other.request_can_load_model(req(2), refused)
        with pytest.raises(RequestStateError):
            other.listener.notify_model_loaded(req(2))
        with pytest.raises(RequestStateError, match="only after CAN_LOAD_NOW"):
            other.load_model(req(2), weight_bytes=1)
        with pytest.raises(UnknownRequestError):
            other.cancel_model_load(req(1))
        assert svc.state_of(holder, req(1)) == RequestState.LOADED
        assert svc.state_of(other, req(2)) == RequestState.NOT_PRIORITIZED


def test_bad_arguments_to_the_client_api() -> None:
    with service() as svc:
        app = svc.manager(10001, uses_feature=True)
        with pytest.raises(TypeError, match="request must be a ModelLoadRequest"):
            app.request_can_load_model(42, Recorder(app))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="callback must implement on_can_load_model"):
            app.request_can_load_model(req(1), object())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="executor must be"):
            app.request_can_load_model(req(1), Recorder(app), executor=5)  # type: ignore[arg-type]
        with pytest.raises(IllegalArgumentError, match="importance must be within 0..1000"):
            svc.set_uid_importance(10001, 5000)
        with pytest.raises(IllegalArgumentError, match="uid must be within"):
            svc.manager(-1)


def test_close_completes_every_live_request() -> None:
    svc = service()
    app = svc.manager(10001, uses_feature=True)
    recorder = Recorder(app)
    app.request_can_load_model(req(1), recorder)
    svc.close()
    assert recorder.calls[-1][0] == "complete"
    with pytest.raises(IllegalArgumentError, match="closed"):
        app.request_can_load_model(req(2), Recorder(app))


# Real time -------------------------------------------------------------------------------------


def wait_for(predicate: Any, timeout: float = WAIT_S) -> bool:
    deadline = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return True
        deadline.wait(0.005)
    return bool(predicate())


def test_real_time_service_runs_the_flow_on_its_own_threads() -> None:
    with Service("vnpu", "turn_taking", clock="real", unload_grace_ms=150) as svc:
        svc.set_uid_importance(10002, Importance.CACHED)
        svc.set_uid_importance(10001, Importance.FOREGROUND)
        bg_app = svc.manager(10002, uses_feature=True)
        bg = Recorder(bg_app, obey=False)
        bg_app.request_can_load_model(req(1), bg)
        # The callback loads and then reports loaded; a foreground request before the report
        # would cancel the still-granted request instead of asking it to unload.
        assert wait_for(lambda: svc.state_of(bg_app, req(1)) == RequestState.LOADED)
        assert bg.names() == ["can_load"]
        assert bg.threads == {"npu-dispatch_0"}
        work = bg.models[0].submit(10**15)
        events: list[WorkEvent] = []
        svc.add_listener(events.extend)
        fg_app = svc.manager(10001, uses_feature=True)
        fg = Recorder(fg_app)
        fg_app.request_can_load_model(req(2), fg)
        # The background app ignores the unload request: the service thread revokes it.
        assert wait_for(lambda: fg.calls[-1:] == [("can_load", ModelLoadStatus.CAN_LOAD_NOW)])
        assert [name for name, _ in fg.calls] == ["can_load", "can_load"]
        assert bg.calls[-1] == ("complete", ModelLoadRequestStatus.COMPLETE)
        assert wait_for(
            lambda: any(e.id == work and e.reason == EndReason.CANCELLED_SYSTEM for e in events)
        )
