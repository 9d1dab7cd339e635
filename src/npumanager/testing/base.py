"""The suite's base: fixtures a driver package may override, and helpers the rules share.

The rules themselves are in `hal`, `ordering` and `resources`; `suite.DriverSuite` joins
them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar

import pytest

from npumanager.core.driver.contract import TimedWork
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.schemas import (
    DriverCapability,
    DriverRecord,
    EndReason,
    StartReason,
    WorkInfo,
)
from npumanager.schemas.device import DeviceSpec
from npumanager.schemas.limits import VTS_SEED

Driver = Any
"""A driver: a `core.driver.Driver`, plus the capability protocols it claims (so the suite
may call `advance` or `add_heat` on it after checking the claim)."""
Factory = Callable[..., Driver]
_F = TypeVar("_F", bound=Callable[..., Any])

MS = 1000
ONE_CHANNEL = DeviceSpec(channels=1, slice_us=1000)
NO_FLOOR = DeviceSpec(channels=1, slice_us=1000, floor_percent=0)
"""One channel, no floor for lower bands: only priorities decide the order."""
TWO_CHANNELS = DeviceSpec(channels=2, slice_us=1000, floor_percent=0)


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


def first_start_us(events: list[WorkEvent], work: int) -> int | None:
    """When one work id first got a channel, if it did."""
    return next((e.time_us for e in events if e.id == work and e.kind == EventKind.STARTED), None)


def channel_time_us(events: list[WorkEvent], work: int, until_us: int) -> int:
    """How long one work id held a channel before `until_us`: its runs, from each STARTED to
    the ENDED after it, cut at `until_us`."""
    held, since = 0, None
    for e in events:
        if e.id != work:
            continue
        if e.kind == EventKind.STARTED:
            since = e.time_us
        elif e.kind == EventKind.ENDED and since is not None:
            held += max(0, min(e.time_us, until_us) - since)
            since = None
    if since is not None:
        held += max(0, until_us - since)
    return held


class SuiteBase:
    """Fixtures and helpers of `DriverSuite`; no tests."""

    driver_name: ClassVar[str | None] = None
    driver_options: ClassVar[dict[str, Any]] = {}
    thread_safe: ClassVar[bool] = False
    real_time_timeout_s: ClassVar[float] = 120.0
    """How long a real-time wait lasts before the rule is taken as hung: only a hang outlasts
    it, however busy the machine."""
    real_time_tries: ClassVar[int] = 5
    """How often a real-time rule whose setup needs its submissions within milliseconds of
    one another tries again when the machine was too busy for that (its premise did not
    hold, so it could not judge the driver); a rule in virtual time tries once."""

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
        from npumanager.core.plugins.registry import load_plugins

        return load_plugins().driver(name)

    @pytest.fixture
    def driver_factory(self, request: pytest.FixtureRequest) -> Factory:
        """Builds a fresh driver: `factory()` or `factory(devices=...)`."""
        record: DriverRecord = request.getfixturevalue("driver_record")
        given = request.config.getoption("npu_driver_options", None) or {}
        options = {**self.driver_options, **given}  # the runner's (vts --driver-option) last

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

    def tries(self) -> range:
        """The attempts of a rule whose premise a busy machine can spoil (`real_time_tries`):
        it judges the driver on the first attempt whose premise held, or on the last."""
        return range(1 if self.virtual else self.real_time_tries)

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
    def running(driver: Driver, work: int, device: int = 0) -> bool:
        """The work runs on the device now."""
        return work in driver.device_state(device).running

    def wait_until(self, driver: Driver, done: Callable[[], bool], what: str) -> None:
        """Let time pass in 1 ms steps (advancing, or pumping and sleeping) until `done()`."""
        deadline = time.monotonic() + self.real_time_timeout_s
        while not done():
            assert time.monotonic() < deadline, (
                f"real-time wait: {what} did not happen within {self.real_time_timeout_s} s"
            )
            self.wait_ms(driver, 1)
            driver.pump()

    @pytest.fixture
    def npu_seed(self, request: pytest.FixtureRequest) -> int:
        """The seed of the suite's random choices (`--npu-seed`, else `VTS_SEED`)."""
        seed = request.config.getoption("npu_seed", None)
        return VTS_SEED if seed is None else int(seed)

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
        """`submit` arguments for about `ms` of work: a real driver's inputs, else cycles."""
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
