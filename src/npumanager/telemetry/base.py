"""A base for sinks that take events one kind at a time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, ParamSpec, TypeVar

from npumanager.core.driver.events import WorkEvent
from npumanager.telemetry.events import (
    DeviceSample,
    ModelLoadRequested,
    ModelLoadStateChanged,
    TelemetryEvent,
)

if TYPE_CHECKING:
    from npumanager.apps.device_users import DeviceUser

P = ParamSpec("P")
R = TypeVar("R")


class LateBound(Generic[P, R]):
    """A callable the service supplies once it knows it (a daemon names each HAL uid by its
    app's id; it finds the device's other users); until then, and in process, `fallback`."""

    def __init__(self, fallback: Callable[P, R]) -> None:
        self._call = fallback

    def set(self, call: Callable[P, R]) -> None:
        """Answer with `call` from now on (it may be called from any thread)."""
        self._call = call

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._call(*args, **kwargs)


def no_name(uid: int, /) -> str | None:
    """No name for any uid: in process, uids are the callers' own."""
    return None


def no_users() -> Sequence[DeviceUser]:
    """No users outside the manager: in process, none are looked for."""
    return ()


class EventSink:
    """``handle(batch)`` calls the method for each event's kind; override those you need.

    A sink with a ``uid_names`` attribute is given the service's names for uids (a callable
    from uid to a name or None) when it is added, to label its events by app; one with a
    ``device_users`` attribute, a callable giving the device's users outside the manager.
    """

    def handle(self, batch: Sequence[TelemetryEvent]) -> None:
        """Dispatch every event of the batch, in order."""
        for event in batch:
            kind = type(event)
            if kind is WorkEvent:
                self.on_work(event)  # type: ignore[arg-type]
            elif kind is DeviceSample:
                self.on_device_sample(event)  # type: ignore[arg-type]
            elif kind is ModelLoadStateChanged:
                self.on_model_load_state_changed(event)  # type: ignore[arg-type]
            else:
                self.on_model_load_requested(event)  # type: ignore[arg-type]

    def on_work(self, event: WorkEvent) -> None:
        """A work-lifecycle event."""

    def on_device_sample(self, sample: DeviceSample) -> None:
        """A reading of a device's health."""

    def on_model_load_requested(self, event: ModelLoadRequested) -> None:
        """A client asked to load a model."""

    def on_model_load_state_changed(self, event: ModelLoadStateChanged) -> None:
        """A model-load request moved on."""
