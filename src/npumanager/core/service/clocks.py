"""What moves a service through time: the virtual-time loop, or the real-time service thread.

Both drive the service the same way: under its lock, move the driver (advance it, or pump
what arrived) and let the service carry out what follows (`after_step`); then, outside the
lock, flush the callbacks that were queued. The real-time thread reads the arbiter's next
deadline under the lock too: nothing here touches the arbiter any other way. The clocks
are the service owner's own (`state.ServiceState`), the one other place its lock is taken.
"""

from __future__ import annotations

import select
import threading
from contextlib import AbstractContextManager
from typing import Any, Protocol

from npumanager.checks import check_int
from npumanager.core.driver.contract import Driver, RealClock, VirtualTimeDriver
from npumanager.schemas.limits import SIMULATION_HORIZON_US

VIRTUAL_STEP_US = 1000
"""In virtual time the service looks at device health and deadlines every millisecond."""
POLL_S = 0.05
"""The real-time thread looks at the driver at least this often."""
_MAX_MS = SIMULATION_HORIZON_US // 1000


class Stepper(Protocol):
    """The service as its clock sees it."""

    def locked(self) -> AbstractContextManager[Any]:
        """The service lock."""

    @property
    def closed(self) -> bool:
        """True once the service is closed."""

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds."""

    def check_open(self) -> None:
        """`IllegalArgumentError` if the service is closed (lock held)."""

    def after_step(self) -> None:
        """The driver moved: carry out what follows (lock held)."""

    def flush(self) -> None:
        """Schedule the queued callbacks (lock not held)."""

    def next_deadline_ms(self) -> int | None:
        """When the arbiter next has something to do (lock held)."""


class VirtualTime:
    """Virtual time: nothing moves until `advance` or `run_until_idle`."""

    def __init__(self, service: Stepper, driver: VirtualTimeDriver) -> None:
        self._service = service
        self._driver = driver

    def advance(self, ms: int) -> None:
        """Run the driver and the policy forward by `ms` milliseconds, a step at a time."""
        service, driver = self._service, self._driver
        target_us = (service.now_ms + check_int("ms", ms, 0, _MAX_MS)) * 1000
        while True:
            with service.locked():
                service.check_open()
                now_us = driver.now_us
                if now_us >= target_us:
                    break
                step = min(target_us, (now_us // VIRTUAL_STEP_US + 1) * VIRTUAL_STEP_US)
                driver.advance(step - now_us)
                service.after_step()
            service.flush()
        service.flush()

    def quiescent(self) -> bool:
        """True when no work runs and no decision is due, so nothing will change."""
        with self._service.locked():
            return self._driver.idle() and self._service.next_deadline_ms() is None

    def run_until_idle(self, max_ms: int) -> None:
        """Advance until the driver is idle and no decision is due (at most `max_ms`)."""
        deadline = self._service.now_ms + check_int("max_ms", max_ms, 0, _MAX_MS)
        while self._service.now_ms < deadline and not self.quiescent():
            self.advance(1)


class RealTime:
    """Real time: a service thread pumps the driver and meets the arbiter's deadlines."""

    def __init__(self, service: Stepper, driver: Driver) -> None:
        self._service = service
        self._driver = driver
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="npu-service", daemon=True)

    def start(self) -> None:
        """Start the service thread."""
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        """Stop the service thread and wait (at most `timeout_s`) for it to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def _serve(self) -> None:
        service, driver = self._service, self._driver
        fd = driver.fileno() if isinstance(driver, RealClock) else None
        while not self._stop.is_set():
            with service.locked():
                if service.closed:
                    return
                due = service.next_deadline_ms()
                now = service.now_ms
            timeout = POLL_S if due is None else max(0.0, min(POLL_S, (due - now) / 1000))
            if fd is not None:
                select.select([fd], [], [], timeout)
            else:
                self._stop.wait(timeout)
            with service.locked():
                if service.closed:
                    return
                driver.pump()
                service.after_step()
            service.flush()
