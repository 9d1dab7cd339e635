"""The `vnpu` driver: the simulated NPU in C behind cffi, on a virtual or a real clock.

On the virtual clock it behaves event for event like the `reference` driver. On the real
clock (`clock="real"`) time is CLOCK_MONOTONIC and one C thread per device performs the
event points as they fall due; events wait in C until `pump()` (or an attached asyncio
loop, woken through `fileno()`) moves them to the callback.
"""

from __future__ import annotations

import asyncio
import select
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from npumanager.checks import check_int
from npumanager.core.plugins.hookspecs import hookimpl
from npumanager.errors import IllegalArgumentError, NpuManagerError
from npumanager.schemas import DriverCapability, DriverRecord
from npumanager.schemas.device import DeviceSpec
from npumanager.schemas.limits import (
    DEFAULT_EVENT_RING,
    DEFAULT_MAX_LIVE_WORK,
    DEFAULT_MAX_MODELS,
)
from npumanager.vendor_drivers.simulated import Engine, EngineDriver
from npumanager.vendor_drivers.vnpu._vnpu import lib
from npumanager.vendor_drivers.vnpu.engine import VnpuEngine

CLOCKS = ("virtual", "real")
"""The clocks a vnpu driver can run on."""
_US = 1_000_000


class ClockError(NpuManagerError, RuntimeError):
    """A call that belongs to the other clock (e.g. `advance()` on the real clock)."""


class VnpuDriver(EngineDriver):
    """The simulated NPU in C: virtual time (like `reference`) or real time with threads."""

    def __init__(
        self,
        devices: int | Sequence[DeviceSpec | Mapping[str, Any]] = 1,
        *,
        max_live_work: int = DEFAULT_MAX_LIVE_WORK,
        max_models: int = DEFAULT_MAX_MODELS,
        clock: str = "virtual",
        event_capacity: int = DEFAULT_EVENT_RING,
    ) -> None:
        if clock not in CLOCKS:
            raise IllegalArgumentError(f"clock must be one of {', '.join(CLOCKS)}; got {clock!r}")
        self.clock = clock
        self.event_capacity = check_int(
            "event_capacity", event_capacity, 1, lib.VNPU_MAX_EVENT_CAPACITY
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader_fd = -1
        self._timer: asyncio.TimerHandle | None = None
        super().__init__(devices, max_live_work=max_live_work, max_models=max_models)

    def _make_engine(self) -> Engine:
        self.vnpu = VnpuEngine(
            self.specs,
            self.max_live_work,
            self.max_models,
            real_time=self.real_time,
            event_capacity=self.event_capacity,
        )
        return self.vnpu

    @property
    def real_time(self) -> bool:
        """True on the real clock."""
        return self.clock == "real"

    def _require_real(self, what: str) -> None:
        self._open()
        if not self.real_time:
            raise ClockError(f"{what} is for the real clock; this vnpu driver runs virtual time")

    # Virtual time -------------------------------------------------------------------------

    def advance(self, us: int) -> None:
        """Run the devices for `us` microseconds of virtual time, then deliver events."""
        if self.real_time:
            self._open()
            raise ClockError(
                "advance() runs virtual time; this vnpu driver is on the real clock, where "
                "time passes by itself: use wait_idle(), pump() or attach(loop)"
            )
        super().advance(us)

    def run_until_idle(self, max_us: int | None = None) -> int:
        """Run until idle; on the real clock, wait (at most `max_us` of wall time) for it."""
        if not self.real_time:
            return super().run_until_idle(max_us)
        self._open()
        limit = None if max_us is None else check_int("max_us", max_us, 0, lib.VNPU_MAX_SPAN_US)
        self.wait_idle(None if limit is None else limit / _US)
        return self.now_us

    # Real time ----------------------------------------------------------------------------

    def fileno(self) -> int:
        """A file descriptor that is readable while events wait to be pumped."""
        self._require_real("fileno()")
        return self.vnpu.fileno()

    @property
    def stalls(self) -> int:
        """How often a worker thread waited because the event queue was full."""
        self._open()
        return self.vnpu.stats()["stalls"]

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Pump events until the driver is idle and the debouncer holds nothing more.

        Returns False if `timeout_s` seconds passed first.
        """
        self._require_real("wait_idle()")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        fd = self.vnpu.fileno()
        while True:
            self.pump()
            if self.engine.idle():
                # Idle is set together with the last events; pump what came since.
                self.pump()
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            select.select([fd], [], [], left)
        while (due := self._next_debounce_due_us()) is not None:
            wait = max(0.0, (due - self.now_us) / _US)
            if deadline is not None and time.monotonic() + wait > deadline:
                return False
            time.sleep(wait)
            self.pump()
        return True

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver events from `loop`: pump when the fd is readable and when a held
        (debounced) event falls due."""
        self._require_real("attach()")
        self.detach()
        self._loop = loop
        self._reader_fd = self.vnpu.fileno()
        loop.add_reader(self._reader_fd, self._ready)
        self._arm_timer()

    def detach(self) -> None:
        """Stop delivering from the attached loop, if any."""
        loop, self._loop = self._loop, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if loop is not None and self._reader_fd >= 0:
            loop.remove_reader(self._reader_fd)
            self._reader_fd = -1

    def pump(self) -> None:
        """Deliver the engine's new events (and, when attached, re-arm the debounce timer)."""
        super().pump()
        if self._loop is not None:
            self._arm_timer()

    def _ready(self) -> None:
        if not self._closed:
            self.pump()

    def _arm_timer(self) -> None:
        loop = self._loop
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self._next_debounce_due_us()
        if loop is None or due is None:
            return
        delay = max(0.0, (due - self.now_us) / _US)
        self._timer = loop.call_at(loop.time() + delay, self._ready)

    def close(self) -> None:
        """Stop the worker threads, close the fd and free the C handle; idempotent."""
        self.detach()
        super().close()


CAPABILITIES = frozenset(
    {
        DriverCapability.PREEMPTION,
        DriverCapability.THERMAL_MODEL,
        DriverCapability.VIRTUAL_TIME,
        DriverCapability.REAL_TIME,
        DriverCapability.MULTI_DEVICE,
        DriverCapability.FAIR_SHARE,
    }
)


@hookimpl
def npumanager_register_drivers() -> Iterable[DriverRecord]:
    """Register the vnpu driver."""
    return [
        DriverRecord(
            name="vnpu",
            factory=VnpuDriver,
            capabilities=CAPABILITIES,
            description="the simulated NPU in C, on a virtual or a real clock",
        )
    ]
