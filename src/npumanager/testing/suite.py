"""`DriverSuite`: the HAL conformance tests every vendor driver runs on itself.

See the package docstring for what a driver package sets and which driver calls the
suite makes. Test names follow the platform's `VtsHalNpuSchedulingTargetTest`.
"""

# ruff: noqa: N802 - the test names are the platform's, in its spelling

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar

import pytest

from npumanager.core.driver import TimedWork
from npumanager.core.events import EventKind, WorkEvent
from npumanager.errors import CapacityError, IllegalArgumentError
from npumanager.schemas import (
    DriverCapability,
    DriverRecord,
    EndReason,
    SchedulingConfig,
    StartReason,
    WorkInfo,
)
from npumanager.schemas.device import DeviceSpec

Driver = Any
"""A driver: a `core.driver.Driver`, plus the capability protocols it claims (so the suite
may call `advance` or `add_heat` on it after checking the claim)."""
Factory = Callable[..., Driver]
_F = TypeVar("_F", bound=Callable[..., Any])

MS = 1000
ONE_CHANNEL = DeviceSpec(channels=1, slice_us=1000)


def requires(*capabilities: DriverCapability) -> Callable[[_F], _F]:
    """Mark a test as needing capabilities; it is skipped on a driver that lacks one."""

    def mark(test: _F) -> _F:
        test._npu_requires = capabilities  # type: ignore[attr-defined]
        return test

    return mark


class Recorder:
    """A `SchedulingCallback` that records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, WorkInfo, StartReason | EndReason | None]] = []

    def on_work_requested(self, info: WorkInfo) -> None:
        self.calls.append(("requested", info, None))

    def on_work_started(self, info: WorkInfo, reason: StartReason) -> None:
        self.calls.append(("started", info, reason))

    def on_work_ended(self, info: WorkInfo, reason: EndReason) -> None:
        self.calls.append(("ended", info, reason))

    def of(self, work: int) -> list[tuple[str, str]]:
        """(call, reason name) of one work id, in order."""
        return [
            (name, r.name if r is not None else "") for name, i, r in self.calls if i.id == work
        ]


def lifecycle(events: list[WorkEvent], work: int) -> list[tuple[str, str]]:
    """(kind, reason name) of one work id's raw events, in order."""
    out = []
    for e in events:
        if e.id != work:
            continue
        if e.kind == EventKind.REQUESTED:
            out.append(("REQUESTED", ""))
        elif e.kind == EventKind.STARTED:
            out.append(("STARTED", StartReason(e.reason).name))
        else:
            out.append(("ENDED", EndReason(e.reason).name))
    return out


def final_reason(events: list[WorkEvent], work: int) -> EndReason | None:
    """How one work id ended, if it did."""
    ended = [e for e in events if e.id == work and e.kind == EventKind.ENDED]
    return EndReason(ended[-1].reason) if ended else None


def completion_order(events: list[WorkEvent]) -> list[int]:
    """Work ids in the order they completed."""
    return [e.id for e in events if e.kind == EventKind.ENDED and e.reason == EndReason.COMPLETED]


class DriverSuite:
    """The conformance tests; subclass with `__test__ = True` and a `driver_name`."""

    __test__: ClassVar[bool] = False
    driver_name: ClassVar[str | None] = None
    driver_options: ClassVar[dict[str, Any]] = {}
    thread_safe: ClassVar[bool] = False
    real_time_timeout_s: ClassVar[float] = 20.0

    _caps: frozenset[DriverCapability] = frozenset()

    # Fixtures a driver package may override -------------------------------------------

    @pytest.fixture
    def driver_record(self, request: pytest.FixtureRequest) -> DriverRecord:
        """The registered record of `driver_name`."""
        name = self.driver_name or request.config.getoption("npu_driver", None)
        if name is None:
            pytest.fail(
                f"{type(self).__name__} sets no driver_name and overrides no driver_factory "
                "(or run pytest with --npu-driver NAME)"
            )
        from npumanager.core.plugins import load_plugins

        return load_plugins().driver(name)

    @pytest.fixture
    def driver_factory(self, request: pytest.FixtureRequest) -> Factory:
        """Builds a fresh driver: `factory()` or `factory(devices=...)`."""
        record: DriverRecord = request.getfixturevalue("driver_record")
        options = dict(self.driver_options)

        def build(**kwargs: Any) -> Driver:
            return record.factory(**options, **kwargs)

        return build

    @pytest.fixture
    def driver_capabilities(self, request: pytest.FixtureRequest) -> frozenset[DriverCapability]:
        """What the driver claims (default: its registered record's capabilities)."""
        record: DriverRecord = request.getfixturevalue("driver_record")
        return frozenset(record.capabilities)

    # The suite's own fixtures --------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _npu_capability_gate(
        self, request: pytest.FixtureRequest, driver_capabilities: frozenset[DriverCapability]
    ) -> None:
        self._caps = frozenset(DriverCapability(c) for c in driver_capabilities)
        for cap in getattr(request.function, "_npu_requires", ()):
            if cap not in self._caps:
                pytest.skip(f"driver does not claim {cap}")

    @pytest.fixture
    def make(self, driver_factory: Factory) -> Iterator[Callable[..., Driver]]:
        """`make()` or `make(devices)`: a fresh driver, closed after the test."""
        made: list[Driver] = []

        def build(devices: Any = None) -> Driver:
            driver = driver_factory() if devices is None else driver_factory(devices=devices)
            made.append(driver)
            return driver

        yield build
        for driver in made:
            driver.close()

    # Helpers --------------------------------------------------------------------------

    @property
    def virtual(self) -> bool:
        return DriverCapability.VIRTUAL_TIME in self._caps

    def wait_ms(self, driver: Driver, ms: int) -> None:
        """Let `ms` of device time pass (virtual) or sleep that long (real time)."""
        if self.virtual:
            driver.advance(ms * MS)
        else:
            time.sleep(ms / 1000)

    def settle(self, driver: Driver) -> None:
        """Run until idle, with held (debounced) events delivered."""
        if self.virtual:
            driver.run_until_idle()
            return
        # Short waits, checking idleness between them: a driver whose wake-up can be lost
        # (vnpu's real clock) must not make every wait last the whole timeout.
        deadline = time.monotonic() + self.real_time_timeout_s
        while not self.idle(driver):
            assert time.monotonic() < deadline, (
                f"real-time wait: the driver did not go idle within {self.real_time_timeout_s} s"
            )
            driver.run_until_idle(max_us=20_000)
        driver.run_until_idle(max_us=int(self.real_time_timeout_s * 1_000_000))

    @staticmethod
    def idle(driver: Driver) -> bool:
        """No device has work queued or running."""
        for device in driver.describe_devices():
            state = driver.device_state(device.number)
            if state.queue_depth or any(work >= 0 for work in state.running):
                return False
        return True

    @staticmethod
    def cycles(driver: Driver, ms: float, device: int = 0) -> int:
        """Cycles that take `ms` on a device at its nominal clock."""
        return max(1, int(driver.describe_devices()[device].clock_mhz * 1000 * ms))

    @staticmethod
    def model(driver: Driver, device: int = 0) -> int:
        """A model to run work on: a real driver's timed model (`TimedWork`), else 1 KiB."""
        if isinstance(driver, TimedWork):
            handle: int = driver.load_timed_model(device)
            return handle
        loaded: int = driver.load_model(device, weight_bytes=1 << 10)
        return loaded

    def work(self, driver: Driver, model: int, ms: float) -> dict[str, Any]:
        """`submit` arguments for about `ms` of work: real inputs or cycles."""
        if isinstance(driver, TimedWork):
            return {"inputs": driver.timed_inputs(model, ms)}
        return {"cost_cycles": self.cycles(driver, ms)}

    def one_inference(self, driver: Driver, *, uid: int, job_priority: int = 0) -> int:
        model = self.model(driver)
        work: int = driver.submit(
            model, uid=uid, **self.work(driver, model, 2), job_priority=job_priority
        )
        self.settle(driver)
        return work

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
            "SetSchedulingConfigs: valid configs must be accepted and held, one per uid"
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
            "SetSchedulingConfigsInvalidPriority: a rejected set must change nothing"
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
            "SetSchedulingConfigsDuplicateUid: a rejected set must change nothing"
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
            "UpdateSchedulingConfigs: set must replace the whole set"
        )
        driver.set_scheduling_configs([])
        assert driver.scheduling_configs == {}, (
            "UpdateSchedulingConfigs: an empty set must clear every config"
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
            "SetCallback: the callback must get WorkInfo records"
        )
        driver.set_callback(second, debounce_duration_ms=0)
        calls = len(first.calls)
        later = self.one_inference(driver, uid=10)
        assert len(first.calls) == calls, (
            "SetCallback: the driver holds one callback; the replaced one must get nothing more"
        )
        assert [c for c, _ in second.of(later)] == ["requested", "started", "ended"], (
            "SetCallback: the new callback must get the events"
        )

    def test_SetCallbackNull(self, make: Callable[..., Driver]) -> None:
        driver = make()
        recorder = Recorder()
        driver.set_callback(recorder, debounce_duration_ms=0)
        driver.set_callback(None)
        work = self.one_inference(driver, uid=10)
        assert recorder.calls == [], (
            "SetCallbackNull: after set_callback(None) no callback may be called"
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
                assert info.uid == 10 + i, "RunInferenceStatusCallbacks: uid as submitted"
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

    def test_RunInferencesPrioritized(self, make: Callable[..., Driver]) -> None:
        preemption = DriverCapability.PREEMPTION in self._caps
        # With preemption, one channel makes the test need it; without, the device's own
        # channels must let the later job run.
        driver = make([ONE_CHANNEL]) if preemption else make()
        driver.set_scheduling_configs([SchedulingConfig(uid=10, app_priority=100)])
        model = self.model(driver)
        slow = driver.submit(model, uid=10, **self.work(driver, model, 300), job_priority=500)
        self.wait_ms(driver, 50)
        fast = driver.submit(model, uid=10, **self.work(driver, model, 20), job_priority=250)
        self.settle(driver)
        events = driver.take_events()
        order = completion_order(events)
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
            "RunInferenceFailsWithoutAttributeOtherUid: uid and originalUid as submitted"
        )

    # Ours: debounce ------------------------------------------------------------------

    def test_DebounceDefaultWindow(self, make: Callable[..., Driver]) -> None:
        driver = make()
        recorder = Recorder()
        driver.set_callback(recorder)
        assert driver.debounce_duration_ms == 50, (
            "Debounce: set_callback's default debounce_duration_ms must be 50"
        )
        model = self.model(driver)
        works = [driver.submit(model, uid=5, **self.work(driver, model, 40))]
        self.wait_ms(driver, 5)
        works += [driver.submit(model, uid=5, **self.work(driver, model, 2)) for _ in "ab"]
        if self.virtual:
            driver.advance(50 * MS)
            early = [name for name, _, _ in recorder.calls]
            assert "ended" not in early, (
                "Debounce: ENDED must be held until the uid has been idle for the window; "
                f"got {early} 15 ms after the last ended"
            )
        self.settle(driver)
        names = [name for name, _, _ in recorder.calls]
        assert names == ["requested", "started", "ended"], (
            "Debounce: back-to-back work of one uid must give one Requested, one Started and, "
            f"after the window, one Ended; got {names}"
        )
        assert recorder.calls[0][1].id == works[0], (
            "Debounce: the Requested sent must be the first work's"
        )
        driver.submit(model, uid=6, **self.work(driver, model, 2))
        self.settle(driver)
        assert [name for name, _, _ in recorder.calls][3:] == ["requested", "started", "ended"], (
            "Debounce: the window is per uid; another uid's work must be reported"
        )

    def test_DebounceZero(self, make: Callable[..., Driver]) -> None:
        driver = make()
        recorder = Recorder()
        driver.set_callback(recorder, debounce_duration_ms=0)
        assert driver.debounce_duration_ms == 0, "Debounce: a window of 0 must be held"
        model = self.model(driver)
        works = [driver.submit(model, uid=5, **self.work(driver, model, 2)) for _ in range(3)]
        self.settle(driver)
        for work in works:
            assert [c for c, _ in recorder.of(work)] == ["requested", "started", "ended"], (
                "Debounce: with a window of 0 every event must be delivered; "
                f"work {work} got {recorder.of(work)}"
            )
        with pytest.raises(IllegalArgumentError):
            driver.set_callback(recorder, debounce_duration_ms=-1)
            pytest.fail("Debounce: a negative window must be an illegal argument")

    # Ours: ids, capacity, cancel, pause, devices ----------------------------------------

    def test_ConcurrentSubmittersIdOrder(self, make: Callable[..., Driver]) -> None:
        driver = make()
        model = self.model(driver)
        cost = self.work(driver, model, 0.05)
        lock = threading.Lock()
        returned: list[int] = []
        errors: list[BaseException] = []

        def submitter(uid: int) -> None:
            try:
                for _ in range(25):
                    if self.thread_safe:
                        work = driver.submit(model, uid=uid, **cost)
                        with lock:
                            returned.append(work)
                    else:
                        with lock:  # serialized submits from several uids
                            returned.append(driver.submit(model, uid=uid, **cost))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=submitter, args=(100 + n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, f"ConcurrentSubmittersIdOrder: submit raised {errors[0]!r}"
        self.settle(driver)
        assert len(set(returned)) == len(returned) == 100, (
            "ConcurrentSubmittersIdOrder: every submit must get its own work id"
        )
        if not self.thread_safe:
            assert returned == sorted(returned), (
                "ConcurrentSubmittersIdOrder: ids must strictly increase in submission order"
            )
        events = driver.take_events()
        requested = [e.id for e in events if e.kind == EventKind.REQUESTED]
        assert requested == sorted(returned), (
            "ConcurrentSubmittersIdOrder: REQUESTED events must come in strictly increasing "
            "id order, one per submit"
        )
        assert all(final_reason(events, w) == EndReason.COMPLETED for w in returned), (
            "ConcurrentSubmittersIdOrder: all the work must complete"
        )

    def test_CapacityErrorLeavesNothingLoaded(self, make: Callable[..., Driver]) -> None:
        driver = make([DeviceSpec(weight_memory_bytes=1000, sram_bytes=64)])
        driver.load_model(0, weight_bytes=600)
        before = driver.device_state(0)
        with pytest.raises(CapacityError):
            driver.load_model(0, weight_bytes=500)
            pytest.fail("Capacity: a model bigger than the free weight memory must not load")
        with pytest.raises(CapacityError):
            driver.load_model(0, weight_bytes=1, sram_bytes=65)
            pytest.fail("Capacity: a model needing more SRAM than the device has must not load")
        after = driver.device_state(0)
        assert (after.weight_memory_used_bytes, after.models_loaded) == (
            before.weight_memory_used_bytes,
            before.models_loaded,
        ), "Capacity: a refused load must leave nothing half-loaded"
        driver.load_model(0, weight_bytes=400)
        assert driver.device_state(0).weight_memory_used_bytes == 1000, (
            "Capacity: exactly the free space must still fit after refused loads"
        )

    def test_CancelSemantics(self, make: Callable[..., Driver]) -> None:
        driver = make([ONE_CHANNEL])
        model = self.model(driver)
        running = driver.submit(model, uid=1, **self.work(driver, model, 500))
        queued = driver.submit(model, uid=1, **self.work(driver, model, 1))
        third = driver.submit(model, uid=1, **self.work(driver, model, 1))
        self.wait_ms(driver, 20)
        driver.cancel(queued)
        driver.cancel(running)
        self.settle(driver)
        events = driver.take_events()
        assert lifecycle(events, queued) == [("REQUESTED", ""), ("ENDED", "CANCELLED_USER")], (
            "Cancel: queued work must end CANCELLED_USER without starting; "
            f"got {lifecycle(events, queued)}"
        )
        assert lifecycle(events, running) == [
            ("REQUESTED", ""),
            ("STARTED", "INITIAL"),
            ("ENDED", "CANCELLED_USER"),
        ], f"Cancel: running work must end CANCELLED_USER; got {lifecycle(events, running)}"
        assert final_reason(events, third) == EndReason.COMPLETED, (
            "Cancel: the other work must still run"
        )
        for stale in (queued, 999_999):
            with pytest.raises(LookupError):
                driver.cancel(stale)
                pytest.fail(f"Cancel: cancelling work id {stale} that is not live is a LookupError")

    def test_ShareBetweenUids(self, make: Callable[..., Driver]) -> None:
        # Two uids of one priority, each with a backlog: shared under fair_share, one after
        # the other (strict FIFO across uids) otherwise; FIFO within each uid either way.
        driver = make([ONE_CHANNEL])
        driver.set_scheduling_configs(
            [SchedulingConfig(uid=uid, app_priority=100) for uid in (10, 11)]
        )
        model = self.model(driver)
        cost = self.work(driver, model, 10)
        first = [driver.submit(model, uid=10, **cost) for _ in range(4)]
        second = [driver.submit(model, uid=11, **cost) for _ in range(4)]
        self.settle(driver)
        order = completion_order(driver.take_events())
        for works in (first, second):
            assert [w for w in order if w in works] == works, (
                f"FifoWithinUid: one uid's work of one priority must complete in submission "
                f"order; completion order {order}, the uid's {works}"
            )
        if DriverCapability.FAIR_SHARE in self._caps:
            assert order.index(second[0]) < order.index(first[2]), (
                "FairShare: two uids of equal priority must share the device; the second "
                f"uid's first job must not wait for the first uid's backlog; order {order}"
            )
        else:
            assert order == first + second, (
                "StrictFifo: without fair_share, equal priorities run in submission order "
                f"across uids; completion order {order}, submitted {first + second}"
            )

    @requires(DriverCapability.FAIR_SHARE)
    def test_FloorForLowerBands(self, make: Callable[..., Driver]) -> None:
        driver = make([ONE_CHANNEL])
        driver.set_scheduling_configs(
            [SchedulingConfig(uid=20, app_priority=100), SchedulingConfig(uid=21, app_priority=400)]
        )
        model = self.model(driver)
        busy = [driver.submit(model, uid=20, **self.work(driver, model, 10)) for _ in range(20)]
        low = driver.submit(model, uid=21, **self.work(driver, model, 5))
        self.settle(driver)
        order = completion_order(driver.take_events())
        assert order.index(low) < order.index(busy[-1]), (
            "Floor: a lower band with waiting work must get its floor share while a more "
            f"important band keeps the device busy; completion order {order}, low={low}"
        )

    @requires(DriverCapability.PREEMPTION)
    def test_PausedResumedPairing(self, make: Callable[..., Driver]) -> None:
        driver = make([ONE_CHANNEL])
        model = self.model(driver)
        works = []
        for priority in (900, 600, 300, 0):
            works.append(
                driver.submit(model, uid=1, **self.work(driver, model, 30), job_priority=priority)
            )
            self.wait_ms(driver, 10)
        self.settle(driver)
        events = driver.take_events()
        paused = 0
        for work in works:
            got = lifecycle(events, work)
            assert got[:2] == [("REQUESTED", ""), ("STARTED", "INITIAL")], (
                f"PausedResumed: work must be requested, then start INITIAL; got {got}"
            )
            middle, last = got[2:-1], got[-1]
            assert last == ("ENDED", "COMPLETED"), (
                f"PausedResumed: paused work must finish; got {got}"
            )
            pairs = [tuple(middle[i : i + 2]) for i in range(0, len(middle), 2)]
            assert all(p == (("ENDED", "PAUSED"), ("STARTED", "RESUMED")) for p in pairs), (
                "PausedResumed: every Ended(PAUSED) must be followed by Started(RESUMED); "
                f"got {got}"
            )
            paused += len(pairs)
        assert paused > 0, "PausedResumed: more important work arriving must pause running work"

    def check_numbering(self, driver: Driver, count: int) -> None:
        numbers = [d.number for d in driver.describe_devices()]
        assert numbers == list(range(count)), (
            f"DeviceNumbering: devices must be numbered from 0; got {numbers}"
        )
        models = [self.model(driver, n) for n in range(count)]
        works = [driver.submit(m, uid=1, **self.work(driver, m, 1)) for m in models]
        self.settle(driver)
        events = driver.take_events()
        where = {e.id: e.device_number for e in events}
        assert where == dict(zip(works, range(count), strict=True)), (
            f"DeviceNumbering: deviceNumber must be the device the work ran on; got {where}"
        )
        with pytest.raises(LookupError):
            driver.load_model(count, weight_bytes=1)
            pytest.fail(f"DeviceNumbering: device {count} does not exist and must be refused")

    def test_DeviceNumbering(self, make: Callable[..., Driver]) -> None:
        self.check_numbering(make(), 1)

    @requires(DriverCapability.MULTI_DEVICE)
    def test_DeviceNumberingMultiDevice(self, make: Callable[..., Driver]) -> None:
        self.check_numbering(make([DeviceSpec(channels=1) for _ in range(3)]), 3)

    @requires(DriverCapability.THERMAL_MODEL)
    def test_ThermalModel(self, make: Callable[..., Driver]) -> None:
        driver = make()
        before = driver.device_state(0).temperature_mc
        driver.add_heat(0, 20_000)
        after = driver.device_state(0).temperature_mc
        assert after >= before + 15_000, (
            f"ThermalModel: add_heat must raise the device temperature; {before} -> {after}"
        )

    @requires(DriverCapability.VIRTUAL_TIME)
    def test_MatchesReferenceDevice(self, driver_factory: Factory) -> None:
        from npumanager.testing.stateful import check_against_reference

        check_against_reference(driver_factory)
