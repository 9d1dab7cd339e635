"""Deliberately broken drivers: each one realistic bug, on the reference device, through the
public API as a vendor would build it; each registered on a virtual and on a real clock.

`tests/test_mutants.py` runs the suite's relevant rules on every one and fails if one
survives. The real clock is `WallClock`: the same engine, stepped to wall time on every
call, claiming `real_time` instead of `virtual_time`. The engine bugs are in
`mutant_engines`; the driver bugs (configs, debounce, callback) are here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from helpers.mutant_engines import (
    AllOnDeviceZeroEngine,
    AllowsEveryoneEngine,
    CancelQueuedAsSystemEngine,
    CapacityOffByOneEngine,
    ClampAfterAddEngine,
    DeviceClockSkewEngine,
    EndedAtArrivalEngine,
    FloorNeverOwedScheduler,
    Ids16BitEngine,
    IgnoresAttributionEngine,
    LifoScheduler,
    NeverPreemptsEngine,
    NoClampEngine,
    NoRerankEngine,
    PageRoundingEngine,
    PausesChannelZeroScheduler,
    PausesMostImportantScheduler,
    ReportsUidPriorityEngine,
    ResumeAtBackScheduler,
    ResumedAsInitialEngine,
    SramCheckLateEngine,
    UnloadAsUserEngine,
    UnloadFreesLastEngine,
    on_scheduler,
)
from npumanager import (
    DriverCapability,
    DriverRecord,
    Engine,
    EngineDriver,
    EventKind,
    IllegalArgumentError,
    ReferenceEngine,
    SchedulingConfig,
    hookimpl,
)
from npumanager.core.driver.contract import validate_configs
from npumanager.core.driver.debounce import Debouncer
from npumanager.vendor_drivers.reference import CAPABILITIES as REFERENCE

REAL_WAIT_LIMIT_US = 30_000_000
"""How long the wall-clock driver's run_until_idle waits when given no limit."""


class MutantDriver(EngineDriver):
    """A driver on a (possibly broken) reference engine; `engine_class` says which."""

    engine_class: type[ReferenceEngine] = ReferenceEngine

    def _make_engine(self) -> Engine:
        return self.engine_class(self.specs, self.max_live_work, self.max_models)


class WallClock(MutantDriver):
    """The same device on the real clock: the engine is stepped to wall time at each call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._t0 = time.monotonic_ns() // 1000
        super().__init__(*args, **kwargs)

    def _wall(self) -> int:
        return time.monotonic_ns() // 1000 - self._t0

    def _catch_up(self) -> None:
        target = self._wall()
        if target > self.engine.now_us():
            self.engine.advance_to(target)

    def _open(self) -> None:
        super()._open()
        self._catch_up()

    @property
    def now_us(self) -> int:
        if not self._closed:
            self._catch_up()
        return self.engine.now_us()

    def pump(self) -> None:
        if not self._closed:
            self._catch_up()
        super().pump()

    def advance(self, us: int) -> None:
        raise RuntimeError("advance() is for the virtual clock; this driver runs on wall time")

    def run_until_idle(self, max_us: int | None = None) -> int:
        deadline = self._wall() + (REAL_WAIT_LIMIT_US if max_us is None else max_us)
        while True:
            self.pump()
            due = self._next_debounce_due_us()
            now = self._wall()
            if (self.engine.idle() and due is None) or now >= deadline:
                return self.now_us
            wake = min(self.engine.next_event_us(), deadline, now + 2000)
            if due is not None:
                wake = min(wake, due)
            time.sleep(max(0, wake - now) / 1e6)


# Driver bugs --------------------------------------------------------------------------


class AppliesBeforeValidating(MutantDriver):
    """Applies each config to the device as it reads it, then finds the bad one."""

    def _apply_as_read(self, items: list[Any], base: Mapping[int, SchedulingConfig]) -> None:
        good = dict(base)
        for item in items:
            try:
                config = validate_configs([item])[0]
            except IllegalArgumentError:
                return
            good[config.uid] = config
            self._apply_configs(good)

    def set_scheduling_configs(self, configs: Iterable[Any]) -> None:
        items = list(configs)
        self._apply_as_read(items, {})
        super().set_scheduling_configs(items)

    def update_scheduling_configs(self, configs: Iterable[Any]) -> None:
        items = list(configs)
        self._apply_as_read(items, self._configs)
        super().update_scheduling_configs(items)


class UpdateSendsOnlyNew(MutantDriver):
    """Update stores the merged set but sends the device only the configs named."""

    def update_scheduling_configs(self, configs: Iterable[Any]) -> None:
        valid = validate_configs(configs)
        given = {c.uid: c for c in valid}
        self._apply_configs(given)
        self._configs = {**self._configs, **given}


class _FastDebouncer(Debouncer):
    def __init__(self, window_ms: int) -> None:
        super().__init__(window_ms)
        self._window_us = window_ms * 100  # a units slip: 100 us per "ms"


class DebounceUnits(MutantDriver):
    """Holds Ended for a tenth of the window."""

    def set_callback(self, callback: Any, debounce_duration_ms: int = 50) -> None:
        super().set_callback(callback, debounce_duration_ms)
        self._debouncer = _FastDebouncer(debounce_duration_ms)


class _LeakyDebouncer(Debouncer):
    def feed(self, events: Iterable[Any]) -> list[Any]:
        events = list(events)
        out = super().feed(events)
        passed = {(e.kind, e.id) for e in out}
        leaked = [e for e in events if e.kind != EventKind.ENDED and (e.kind, e.id) not in passed]
        return sorted(out + leaked, key=lambda e: (e.time_us, e.id))


class DebounceNoSuppress(MutantDriver):
    """Holds Ended but passes every Requested and Started."""

    def set_callback(self, callback: Any, debounce_duration_ms: int = 50) -> None:
        super().set_callback(callback, debounce_duration_ms)
        self._debouncer = _LeakyDebouncer(debounce_duration_ms)


class NullCallbackIgnored(MutantDriver):
    """set_callback(None) keeps the old callback."""

    def set_callback(self, callback: Any, debounce_duration_ms: int = 50) -> None:
        if callback is not None:
            super().set_callback(callback, debounce_duration_ms)


@dataclass(frozen=True)
class Mutant:
    """One broken driver: its bug, its class, and the rules that must catch it."""

    name: str
    driver: type[MutantDriver]
    rules: tuple[str, ...]


def engine(cls: type[ReferenceEngine]) -> type[MutantDriver]:
    """The driver on a broken engine."""
    return type(cls.__name__.replace("Engine", "Driver"), (MutantDriver,), {"engine_class": cls})


MUTANTS: tuple[Mutant, ...] = (
    Mutant("no-clamp", engine(NoClampEngine), ("test_ClampJobPriority",)),
    Mutant("clamp-after-add", engine(ClampAfterAddEngine), ("test_ClampJobPriority",)),
    Mutant("ids-16-bit", engine(Ids16BitEngine), ("test_WorkIdsPast65536",)),
    Mutant("ended-at-arrival", engine(EndedAtArrivalEngine), ("test_TimestampsNeverDecrease",)),
    Mutant("device-clock-skew", engine(DeviceClockSkewEngine), ("test_TimestampsNeverDecrease",)),
    Mutant("lifo", engine(on_scheduler(LifoScheduler)), ("test_FifoWithinUid",)),
    Mutant("resume-at-back", engine(on_scheduler(ResumeAtBackScheduler)), ("test_FifoAfterPause",)),
    Mutant(
        "pauses-most-important",
        engine(on_scheduler(PausesMostImportantScheduler)),
        ("test_PausesLeastImportant",),
    ),
    Mutant(
        "pauses-channel-zero",
        engine(on_scheduler(PausesChannelZeroScheduler)),
        ("test_PausesLeastImportant",),
    ),
    Mutant(
        "floor-never-owed",
        engine(on_scheduler(FloorNeverOwedScheduler)),
        ("test_FloorForLowerBands",),
    ),
    Mutant("no-rerank", engine(NoRerankEngine), ("test_QueuedWorkReranked",)),
    Mutant("unload-frees-last", engine(UnloadFreesLastEngine), ("test_UnloadFreesItsBytes",)),
    Mutant("page-rounding", engine(PageRoundingEngine), ("test_MemoryAccounting",)),
    Mutant(
        "sram-check-late", engine(SramCheckLateEngine), ("test_CapacityErrorLeavesNothingLoaded",)
    ),
    Mutant("capacity-off-by-one", engine(CapacityOffByOneEngine), ("test_UnloadFreesItsBytes",)),
    Mutant("unload-as-user", engine(UnloadAsUserEngine), ("test_UnloadCancelsItsWork",)),
    Mutant(
        "cancel-queued-as-system", engine(CancelQueuedAsSystemEngine), ("test_CancelSemantics",)
    ),
    Mutant(
        "allows-everyone",
        engine(AllowsEveryoneEngine),
        ("test_RunInferenceFailsWithoutDirectAccess",),
    ),
    Mutant(
        "ignores-attribution",
        engine(IgnoresAttributionEngine),
        ("test_RunInferenceFailsWithoutAttributeOtherUid",),
    ),
    Mutant("never-preempts", engine(NeverPreemptsEngine), ("test_RunInferencesPrioritized",)),
    Mutant("resumed-as-initial", engine(ResumedAsInitialEngine), ("test_PausedResumedPairing",)),
    Mutant(
        "all-on-device-zero", engine(AllOnDeviceZeroEngine), ("test_DeviceNumberingMultiDevice",)
    ),
    Mutant(
        "reports-uid-priority",
        engine(ReportsUidPriorityEngine),
        ("test_RunInferenceEffectivePriority",),
    ),
    Mutant(
        "applies-before-validating",
        AppliesBeforeValidating,
        ("test_RejectedConfigsKeepScheduling",),
    ),
    Mutant("update-sends-only-new", UpdateSendsOnlyNew, ("test_UpdateUpsertsByBehaviour",)),
    Mutant("debounce-units", DebounceUnits, ("test_DebounceHoldsEnded",)),
    Mutant("debounce-no-suppress", DebounceNoSuppress, ("test_DebounceSuppressesWithinWindow",)),
    Mutant("null-callback-ignored", NullCallbackIgnored, ("test_SetCallbackNull",)),
)
"""Every mutant; `rules` are the tests run on it (the suite's others may catch it too)."""

VIRTUAL = REFERENCE
REAL = (REFERENCE - {DriverCapability.VIRTUAL_TIME}) | {DriverCapability.REAL_TIME}


def on_wall_clock(driver: type[MutantDriver]) -> type[MutantDriver]:
    """The same driver on the real clock."""
    return type(driver.__name__ + "OnWallClock", (WallClock, driver), {})


def records() -> list[DriverRecord]:
    """Each mutant registered twice: `mutant-<name>-virtual` and `mutant-<name>-real`."""
    out = []
    for m in MUTANTS:
        for clock, factory, caps in (
            ("virtual", m.driver, VIRTUAL),
            ("real", on_wall_clock(m.driver), REAL),
        ):
            out.append(
                DriverRecord(
                    name=f"mutant-{m.name}-{clock}",
                    factory=factory,
                    capabilities=caps,
                    description=(m.driver.__doc__ or m.name).strip().splitlines()[0],
                )
            )
    return out


@hookimpl
def npumanager_register_drivers() -> list[DriverRecord]:
    """The mutants, as a vendor's plugin module registers its drivers."""
    return records()
