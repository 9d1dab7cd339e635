"""`with manager.reserve(request) as lease:` — the request/approval flow as a context.

Entering waits for CAN_LOAD_NOW (in virtual time it advances the service clock while it
waits); inside, `lease.load_model(...)` loads and reports loaded, `lease.unload_requested`
and `lease.unload_reason` say whether the service wants the model back; leaving reports
unloaded, which completes the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from npumanager.core.client.callbacks import ModelLoadRequestCallback, StatusListener
from npumanager.core.client.dispatch import ExecutorLike, run_inline
from npumanager.errors import NpuManagerError, UnknownRequestError
from npumanager.schemas import (
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    UnloadReason,
)

Model = TypeVar("Model")
"""What the manager's `load_model` returns (a `LoadedModel`)."""
Model_co = TypeVar("Model_co", covariant=True)


class TimeSource(Protocol):
    """What a lease reads of its manager's backend while it waits (every `Backend` has it)."""

    @property
    def clock(self) -> str:
        """'virtual' or 'real'."""

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds."""

    def quiescent(self) -> bool:
        """Virtual time: True when nothing will change by itself."""

    def advance(self, ms: int) -> None:
        """Virtual time: run forward by `ms` milliseconds."""


class Holder(Protocol[Model_co]):
    """What a lease uses of its `~npumanager.NpuManager` (typed here so the lease needs no
    import of it)."""

    @property
    def backend(self) -> TimeSource:
        """The service or daemon client the manager talks to."""

    @property
    def listener(self) -> StatusListener:
        """The token through which loads and unloads are reported."""

    def request_can_load_model(
        self,
        request: ModelLoadRequest,
        callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None = None,
        *,
        weight_bytes: int | None = None,
    ) -> None:
        """Ask whether the model may be loaded."""

    def cancel_model_load(self, request: ModelLoadRequest) -> None:
        """Withdraw the request."""

    def load_model(
        self,
        request: ModelLoadRequest,
        *,
        weight_bytes: int | None = None,
        sram_bytes: int = 0,
        model: Any = None,
        path: Any = None,
        threads: int | None = None,
        options: Mapping[str, str] | None = None,
    ) -> Model_co:
        """Put the granted request's model into driver memory."""


def asked_fields(threads: int | None, options: Mapping[str, str] | None) -> dict[str, Any]:
    """The ``threads`` and ``options`` a load was given, as keyword fields, left out when
    unset: for a holder that may take neither, and as the wire's `LoadRealModel` takes them."""
    asked: dict[str, Any] = {}
    if threads is not None:
        asked["threads"] = threads
    if options is not None:
        asked["options"] = options
    return asked


class LeaseEndedError(NpuManagerError):
    """The request completed (cancelled or revoked) before CAN_LOAD_NOW came."""


class _LeaseState(ModelLoadRequestCallback):
    """The callback a lease registers: records every decision and wakes the waiter."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.status: ModelLoadStatus | None = None
        self.statuses: list[ModelLoadStatus] = []
        self.unload_reason: UnloadReason | None = None
        self.unload_requested = False
        self.completion: ModelLoadRequestStatus | None = None
        self.wakers: list[object] = []

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()
        for waker in self.wakers:
            waker()  # type: ignore[operator]

    def on_can_load_model(
        self, request: ModelLoadRequest, status: ModelLoadStatus, listener: StatusListener
    ) -> None:
        self.status = status
        self.statuses.append(status)
        self._notify()

    def on_request_unload_model(
        self, request: ModelLoadRequest, reason: UnloadReason | None = None
    ) -> None:
        self.unload_requested = True
        self.unload_reason = reason
        self._notify()

    def on_model_load_request_complete(
        self, request: ModelLoadRequest, status: ModelLoadRequestStatus
    ) -> None:
        self.completion = status
        self._notify()

    @property
    def decided(self) -> bool:
        return self.status == ModelLoadStatus.CAN_LOAD_NOW or self.completion is not None


class _LeaseBase(Generic[Model]):
    def __init__(
        self,
        manager: Holder[Model],
        request: ModelLoadRequest,
        *,
        timeout_s: float | None,
        weight_bytes: int | None,
    ) -> None:
        self.manager = manager
        self.request = request
        self.timeout_s = timeout_s
        self.weight_bytes = weight_bytes
        self.models: list[Model] = []
        self._state = _LeaseState()
        self._stuck = False

    @property
    def status(self) -> ModelLoadStatus | None:
        """The latest `~npumanager.ModelLoadRequestCallback.on_can_load_model` status."""
        return self._state.status

    @property
    def unload_requested(self) -> bool:
        """True once the service asked for the model back."""
        return self._state.unload_requested

    @property
    def unload_reason(self) -> UnloadReason | None:
        """Why the service asked for the model back, if it did."""
        return self._state.unload_reason

    @property
    def completion(self) -> ModelLoadRequestStatus | None:
        """How the request ended, once it has (e.g. COMPLETE after a revoke)."""
        return self._state.completion

    def load_model(
        self,
        weight_bytes: int | None = None,
        *,
        sram_bytes: int = 0,
        model: Any = None,
        path: Any = None,
        threads: int | None = None,
        options: Mapping[str, str] | None = None,
    ) -> Model:
        """Load the model into driver memory and report it loaded: ``weight_bytes`` on a
        simulated driver, the model itself (``model=`` or ``path=``) on a real one, its runs
        on ``threads`` with runtime ``options`` (`~npumanager.NpuManager.load_model`)."""
        loaded = self.manager.load_model(
            self.request,
            weight_bytes=weight_bytes,
            sram_bytes=sram_bytes,
            model=model,
            path=path,
            **asked_fields(threads, options),
        )
        self.models.append(loaded)
        if len(self.models) == 1:
            self.manager.listener.notify_model_loaded(self.request)
        return loaded

    def _start(self) -> None:
        self.manager.request_can_load_model(
            self.request, self._state, run_inline, weight_bytes=self.weight_bytes
        )

    def _result(self) -> None:
        if self._state.status == ModelLoadStatus.CAN_LOAD_NOW and self._state.completion is None:
            return
        if self._state.completion is not None:
            raise LeaseEndedError(
                f"request {self.request.id} ended ({self._state.completion.name}) before it "
                "was granted"
            )
        self.manager.cancel_model_load(self.request)
        last = self._state.status.name if self._state.status is not None else "none"
        if self._stuck:
            raise TimeoutError(
                f"request {self.request.id} is {last} and nothing in virtual time can grant it "
                "(no work runs, no decision is due); it was cancelled"
            )
        raise TimeoutError(
            f"request {self.request.id} was not granted within {self.timeout_s} s "
            f"(last status: {last}); it was cancelled"
        )

    def _finish(self) -> None:
        if self._state.completion is not None:
            return
        with contextlib.suppress(UnknownRequestError):
            self.manager.listener.notify_model_unloaded(self.request)


class Lease(_LeaseBase[Model]):
    """A reservation held for the duration of a ``with`` block."""

    def __enter__(self) -> Lease[Model]:
        self._start()
        service = self.manager.backend
        if service.clock == "virtual":
            limit = None if self.timeout_s is None else service.now_ms + int(self.timeout_s * 1000)
            while not self._state.decided and (limit is None or service.now_ms < limit):
                if service.quiescent():
                    self._stuck = True
                    break
                service.advance(1)
        else:
            deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
            with self._state.changed:
                while not self._state.decided:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self._state.changed.wait(remaining)
        self._result()
        return self

    def __exit__(self, *exc: object) -> None:
        self._finish()


class AsyncLease(_LeaseBase[Model]):
    """A reservation held for the duration of an ``async with`` block."""

    async def __aenter__(self) -> AsyncLease[Model]:
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        self._state.wakers.append(lambda: loop.call_soon_threadsafe(woken.set))
        self._start()
        service = self.manager.backend
        if service.clock == "virtual":
            limit = None if self.timeout_s is None else service.now_ms + int(self.timeout_s * 1000)
            while not self._state.decided and (limit is None or service.now_ms < limit):
                if service.quiescent():
                    self._stuck = True
                    break
                service.advance(1)
                await asyncio.sleep(0)
        else:
            try:
                async with asyncio.timeout(self.timeout_s):
                    while not self._state.decided:
                        woken.clear()
                        await woken.wait()
            except TimeoutError:
                pass
        self._result()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._finish()
