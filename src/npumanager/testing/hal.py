"""The HAL's own rules: scheduling configs (by what is held and by behaviour), the
callback, and what one inference reports (`RunInference*`, clamping)."""

# ruff: noqa: N802 - the test names are the platform's, in its spelling

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import DriverCapability, EndReason, SchedulingConfig, StartReason, WorkInfo
from npumanager.testing.base import (
    NO_FLOOR,
    ONE_CHANNEL,
    Driver,
    Recorder,
    SuiteBase,
    completion_order,
    final_reason,
    lifecycle,
)


class HalRules(SuiteBase):
    """SetSchedulingConfigs, UpdateSchedulingConfigs, SetCallback, RunInference*."""

    # SetSchedulingConfigs and friends -------------------------------------------------

    def test_SetSchedulingConfigs(self, make: Callable[..., Driver]) -> None:
        driver = make()
        configs = [
            SchedulingConfig(uid=10, app_priority=100),
            SchedulingConfig(uid=20, app_priority=400, min_priority=0, max_priority=1000),
            SchedulingConfig(uid=30, app_priority=0, has_direct_access=False),
        ]
        driver.set_scheduling_configs(configs)
        assert driver.scheduling_configs == {c.uid: c for c in configs}, (
            "SetSchedulingConfigs: expected the valid configs held, one per uid; got "
            f"{driver.scheduling_configs}"
        )
        work = self.one_inference(driver, uid=20, job_priority=7)
        effective = {e.effective_priority for e in driver.take_events() if e.id == work}
        assert effective == {407}, (
            "SetSchedulingConfigs: work must be ranked by the configs set "
            f"(uid priority 400 + job 7 = 407); got {effective}"
        )

    def test_SetSchedulingConfigsInvalidPriority(self, make: Callable[..., Driver]) -> None:
        driver = make()
        good = SchedulingConfig(uid=1, app_priority=100)
        driver.set_scheduling_configs([good])
        for bad in (-1, 1001):
            for call in (driver.set_scheduling_configs, driver.update_scheduling_configs):
                with pytest.raises(IllegalArgumentError):
                    call([{"uid": 2, "appPriority": 5}, {"uid": 3, "appPriority": bad}])
                    pytest.fail(
                        f"SetSchedulingConfigsInvalidPriority: priority {bad} must be rejected "
                        "as an illegal argument"
                    )
        assert driver.scheduling_configs == {1: good}, (
            "SetSchedulingConfigsInvalidPriority: expected a rejected set to change nothing, "
            f"{ {1: good} }; got {driver.scheduling_configs}"
        )

    def test_SetSchedulingConfigsDuplicateUid(self, make: Callable[..., Driver]) -> None:
        driver = make()
        good = SchedulingConfig(uid=1, app_priority=100)
        driver.set_scheduling_configs([good])
        twice = [SchedulingConfig(uid=4, app_priority=1), SchedulingConfig(uid=4, app_priority=2)]
        for call in (driver.set_scheduling_configs, driver.update_scheduling_configs):
            with pytest.raises(IllegalArgumentError):
                call(twice)
                pytest.fail(
                    "SetSchedulingConfigsDuplicateUid: two configs for one uid must be "
                    "rejected as an illegal argument"
                )
        assert driver.scheduling_configs == {1: good}, (
            "SetSchedulingConfigsDuplicateUid: expected a rejected set to change nothing, "
            f"{ {1: good} }; got {driver.scheduling_configs}"
        )

    def test_UpdateSchedulingConfigs(self, make: Callable[..., Driver]) -> None:
        driver = make()
        driver.set_scheduling_configs([SchedulingConfig(uid=1, app_priority=100)])
        driver.update_scheduling_configs(
            [SchedulingConfig(uid=2, app_priority=200), SchedulingConfig(uid=1, app_priority=300)]
        )
        held = {uid: c.app_priority for uid, c in driver.scheduling_configs.items()}
        assert held == {1: 300, 2: 200}, (
            f"UpdateSchedulingConfigs: update must upsert per uid and keep the others; got {held}"
        )
        driver.set_scheduling_configs([SchedulingConfig(uid=3, app_priority=300)])
        assert sorted(driver.scheduling_configs) == [3], (
            f"UpdateSchedulingConfigs: expected set to replace the whole set, [3]; got "
            f"{sorted(driver.scheduling_configs)}"
        )
        driver.set_scheduling_configs([])
        assert driver.scheduling_configs == {}, (
            f"UpdateSchedulingConfigs: expected an empty set to clear every config; got "
            f"{driver.scheduling_configs}"
        )

    def effective_of(self, driver: Driver, uid: int, job_priority: int = 0) -> int:
        """The effective priority one inference of `uid` reports."""
        work = self.one_inference(driver, uid=uid, job_priority=job_priority)
        return int(next(e for e in driver.take_events() if e.id == work).effective_priority)

    def test_RejectedConfigsKeepScheduling(self, make: Callable[..., Driver]) -> None:
        driver = make()
        driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=100)])
        rejected = (
            [{"uid": 10, "appPriority": 900}, {"uid": 11, "appPriority": 1001}],
            [{"uid": 10, "appPriority": 900}, {"uid": 10, "appPriority": 800}],
        )
        for bad in rejected:
            for call in (driver.set_scheduling_configs, driver.update_scheduling_configs):
                with pytest.raises(IllegalArgumentError):
                    call(bad)
                    pytest.fail(f"RejectedConfigsKeepScheduling: expected {bad} rejected")
                got = self.effective_of(driver, 10)
                assert got == 100, (
                    "RejectedConfigsKeepScheduling: expected uid 10's work still ranked 100 "
                    f"after a rejected {call.__name__}({bad}); observed effective {got}"
                )

    def test_UpdateUpsertsByBehaviour(self, make: Callable[..., Driver]) -> None:
        driver = make()
        driver.set_scheduling_configs(
            [SchedulingConfig(uid=10, app_priority=100), SchedulingConfig(uid=11, app_priority=200)]
        )
        driver.update_scheduling_configs(
            [SchedulingConfig(uid=11, app_priority=300), SchedulingConfig(uid=12, app_priority=400)]
        )
        want = {10: 100, 11: 300, 12: 400}
        got = {uid: self.effective_of(driver, uid) for uid in want}
        assert got == want, (
            "UpdateUpsertsByBehaviour: after set {10: 100, 11: 200} and update {11: 300, 12: 400}"
            f", expected work ranked {want}; observed {got}"
        )

    def test_QueuedWorkReranked(self, make: Callable[..., Driver]) -> None:
        driver = make([NO_FLOOR])
        driver.set_scheduling_configs(
            [SchedulingConfig(uid=u, app_priority=p) for u, p in ((12, 0), (10, 500), (11, 500))]
        )
        model = self.model(driver)
        blocker = driver.submit(model, uid=12, **self.work(driver, model, 250))
        self.wait_ms(driver, 2)
        blocking = functools.partial(self.running, driver, blocker)
        self.wait_until(driver, blocking, "the blocker's start")  # the others then queue
        first = driver.submit(model, uid=10, **self.work(driver, model, 2))
        second = driver.submit(model, uid=11, **self.work(driver, model, 2))
        driver.update_scheduling_configs([SchedulingConfig(uid=11, app_priority=100)])
        self.settle(driver)
        events = driver.take_events()
        order = completion_order(events)
        assert order == [blocker, second, first], (
            "QueuedWorkReranked: expected queued work of uid 11 to run first once its priority "
            f"rose to 100, order {[blocker, second, first]}; observed {order}"
        )
        started = [
            e.effective_priority for e in events if e.id == second and e.kind == EventKind.STARTED
        ]
        assert started == [100], (
            f"QueuedWorkReranked: expected the re-ranked work to start at 100; observed {started}"
        )

    # SetCallback -----------------------------------------------------------------------

    def test_SetCallback(self, make: Callable[..., Driver]) -> None:
        driver = make()
        first, second = Recorder(), Recorder()
        driver.set_callback(first, debounce_duration_ms=0)
        work = self.one_inference(driver, uid=10)
        assert [c for c, _ in first.of(work)] == ["requested", "started", "ended"], (
            f"SetCallback: the callback set must get the work's events; got {first.of(work)}"
        )
        assert all(isinstance(info, WorkInfo) for _, info, _ in first.calls), (
            "SetCallback: expected WorkInfo records; got "
            f"{[type(i).__name__ for _, i, _ in first.calls]}"
        )
        driver.set_callback(second, debounce_duration_ms=0)
        calls = len(first.calls)
        later = self.one_inference(driver, uid=10)
        assert len(first.calls) == calls, (
            f"SetCallback: expected the replaced callback to get nothing more; got "
            f"{first.calls[calls:]}"
        )
        assert [c for c, _ in second.of(later)] == ["requested", "started", "ended"], (
            f"SetCallback: expected the new callback to get the events; got {second.of(later)}"
        )

    def test_SetCallbackNull(self, make: Callable[..., Driver]) -> None:
        driver = make()
        recorder = Recorder()
        driver.set_callback(recorder, debounce_duration_ms=0)
        driver.set_callback(None)
        work = self.one_inference(driver, uid=10)
        assert recorder.calls == [], (
            f"SetCallbackNull: expected no call after set_callback(None); got {recorder.calls}"
        )
        assert lifecycle(driver.take_events(), work) == [
            ("REQUESTED", ""),
            ("STARTED", "INITIAL"),
            ("ENDED", "COMPLETED"),
        ], "SetCallbackNull: the driver must keep working (and keep events) with no callback"

    # RunInference* --------------------------------------------------------------------

    def test_RunInferenceStatusCallbacks(self, make: Callable[..., Driver]) -> None:
        driver = make()
        driver.set_scheduling_configs(
            [SchedulingConfig(uid=10 + i, app_priority=100 * (i + 1)) for i in range(3)]
        )
        recorder = Recorder()
        driver.set_callback(recorder, debounce_duration_ms=0)
        works = [self.one_inference(driver, uid=10 + i, job_priority=250) for i in range(3)]
        for i, work in enumerate(works):
            calls = [
                (name, info, reason) for name, info, reason in recorder.calls if info.id == work
            ]
            names = [(name, reason) for name, _, reason in calls]
            assert names == [
                ("requested", None),
                ("started", StartReason.INITIAL),
                ("ended", EndReason.COMPLETED),
            ], (
                "RunInferenceStatusCallbacks: one inference must give exactly Requested, "
                f"Started(INITIAL), Ended(COMPLETED) in that order; got {names}"
            )
            for _, info, _ in calls:
                assert info.job_priority == 250, (
                    "RunInferenceStatusCallbacks: jobPriority must be as submitted (250); "
                    f"got {info.job_priority}"
                )
                assert info.effective_priority >= 100 * (i + 1), (
                    "RunInferenceStatusCallbacks: effectivePriority must be >= the uid's "
                    f"priority {100 * (i + 1)}; got {info.effective_priority}"
                )
                assert info.uid == 10 + i, (
                    f"RunInferenceStatusCallbacks: expected uid {10 + i}; got {info.uid}"
                )
        stamps = [info.timestamp_ms for _, info, _ in recorder.calls]
        assert stamps == sorted(stamps), (
            f"RunInferenceStatusCallbacks: timestamps must never decrease; got {stamps}"
        )
        assert works == sorted(set(works)), (
            f"RunInferenceStatusCallbacks: work ids must strictly increase; got {works}"
        )

    def test_RunInferenceEffectivePriority(self, make: Callable[..., Driver]) -> None:
        driver = make()
        driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=200)])
        effective = {}
        for job in (0, 100, 250, 900):
            work = self.one_inference(driver, uid=10, job_priority=job)
            effective[job] = next(
                e for e in driver.take_events() if e.id == work
            ).effective_priority
        values = [effective[job] for job in sorted(effective)]
        assert values == sorted(set(values)), (
            "RunInferenceEffectivePriority: a higher job priority number must give a higher "
            f"effective priority; got {effective}"
        )
        assert effective == {job: 200 + job for job in effective}, (
            "RunInferenceEffectivePriority: effectivePriority must be the uid's priority plus "
            f"the (clamped) job priority; got {effective}"
        )

    def test_ClampJobPriority(self, make: Callable[..., Driver]) -> None:
        driver = make()
        driver.set_scheduling_configs(
            [SchedulingConfig(uid=10, app_priority=200, min_priority=100, max_priority=300)]
        )
        got = {job: self.effective_of(driver, 10, job) for job in (0, 50, 100, 250, 300, 900)}
        want = {job: 200 + min(max(job, 100), 300) for job in got}
        assert got == want, (
            "ClampJobPriority: with appPriority 200 and job priorities clamped to [100, 300] "
            f"before adding, expected {want}; observed {got}"
        )

    def test_RunInferencesPrioritized(self, make: Callable[..., Driver]) -> None:
        preemption = DriverCapability.PREEMPTION in self._caps
        # With preemption, one channel makes the test need it; without, the device's own
        # channels must let the later job run.
        driver = make([ONE_CHANNEL]) if preemption else make()
        driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=100)])
        model = self.model(driver)
        slow_ms = 300
        for _ in range(3):
            slow = driver.submit(
                model, uid=10, **self.work(driver, model, slow_ms), job_priority=500
            )
            self.wait_ms(driver, 50)
            fast = driver.submit(model, uid=10, **self.work(driver, model, 20), job_priority=250)
            self.settle(driver)
            events = driver.take_events()
            if not _ended_before_requested(events, slow, fast):
                break
            # A real device ran the slow job faster than asked: it was over before the fast
            # one came, so nothing was tested. Again, with a longer job.
            slow_ms *= 3
        order = completion_order(events)
        if not preemption and _started_before_ended(events, fast, slow):
            # Without preemption the driver's part is to start the urgent job on a free
            # channel at once; how fast two inferences run side by side is the runtime's.
            return
        assert order == [fast, slow], (
            "RunInferencesPrioritized: the priority-250 job submitted 50 ms after a running "
            f"priority-500 job must finish before it; completion order {order} "
            f"(fast={fast}, slow={slow})"
        )

    def test_RunInferenceFailsWithoutDirectAccess(self, make: Callable[..., Driver]) -> None:
        driver = make()
        driver.set_scheduling_configs(
            [SchedulingConfig(uid=10, app_priority=100, has_direct_access=False)]
        )
        work = self.one_inference(driver, uid=10)
        got = lifecycle(driver.take_events(), work)
        assert got == [("REQUESTED", ""), ("ENDED", "FAILED")], (
            "RunInferenceFailsWithoutDirectAccess: work of a uid without direct access must "
            f"be requested and end FAILED without starting; got {got}"
        )

    def test_RunInferenceFailsWithoutAttributeOtherUid(self, make: Callable[..., Driver]) -> None:
        driver = make()
        driver.set_scheduling_configs(
            [
                SchedulingConfig(uid=10, app_priority=900),
                SchedulingConfig(uid=20, app_priority=900, can_attribute_other_uid=True),
                SchedulingConfig(uid=30, app_priority=100),
            ]
        )
        model = self.model(driver)
        cost = self.work(driver, model, 1)
        denied = driver.submit(model, uid=10, original_uid=30, **cost)
        allowed = driver.submit(model, uid=20, original_uid=30, **cost)
        self.settle(driver)
        events = driver.take_events()
        assert lifecycle(events, denied) == [("REQUESTED", ""), ("ENDED", "FAILED")], (
            "RunInferenceFailsWithoutAttributeOtherUid: work attributed to another uid without "
            f"canAttributeOtherUid must fail; got {lifecycle(events, denied)}"
        )
        assert final_reason(events, allowed) == EndReason.COMPLETED, (
            "RunInferenceFailsWithoutAttributeOtherUid: with canAttributeOtherUid the "
            "attributed work must run"
        )
        info = next(e for e in events if e.id == allowed)
        assert (info.uid, info.original_uid) == (20, 30), (
            "RunInferenceFailsWithoutAttributeOtherUid: expected uid and originalUid (20, 30) as "
            f"submitted; got {(info.uid, info.original_uid)}"
        )


def _ended_before_requested(events: list[WorkEvent], first: int, second: int) -> bool:
    """True if `first` ended (finally) before `second` was requested."""
    ended = [e.time_us for e in events if e.id == first and e.kind == EventKind.ENDED]
    requested = [e.time_us for e in events if e.id == second and e.kind == EventKind.REQUESTED]
    return bool(ended and requested) and max(ended) < min(requested)


def _started_before_ended(events: list[WorkEvent], first: int, second: int) -> bool:
    """True if `first` started before `second` ended (finally)."""
    started = [e.time_us for e in events if e.id == first and e.kind == EventKind.STARTED]
    ended = [e.time_us for e in events if e.id == second and e.kind == EventKind.ENDED]
    return bool(started and ended) and min(started) < max(ended)
