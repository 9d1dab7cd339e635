"""A base for sinks that take events one kind at a time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from npumanager.core.driver.events import WorkEvent
from npumanager.telemetry.events import (
    DeviceSample,
    ModelLoadRequested,
    ModelLoadStateChanged,
    TelemetryEvent,
)

if TYPE_CHECKING:
    from npumanager.apps.device_users import DeviceUser


class UidNames:
    """Names for the uids events carry: a daemon names each HAL uid by its app's id; in
    process, or for a uid no app has, there is none (None)."""

    def __init__(self) -> None:
        self._resolve: Callable[[int], str | None] | None = None

    def set(self, resolve: Callable[[int], str | None]) -> None:
        """Name uids with `resolve` from now on."""
        self._resolve = resolve

    def __call__(self, uid: int) -> str | None:
        resolve = self._resolve
        return None if resolve is None else resolve(uid)


class DeviceUsersFeed:
    """The processes using the accelerator without the manager, as the service last found
    them (a daemon scans for them); in process there are none."""

    def __init__(self) -> None:
        self._provide: Callable[[], Sequence[DeviceUser]] | None = None

    def set(self, provide: Callable[[], Sequence[DeviceUser]]) -> None:
        """Ask `provide` for the users from now on (it may be called from any thread)."""
        self._provide = provide

    def __call__(self) -> Sequence[DeviceUser]:
        provide = self._provide
        return () if provide is None else provide()


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
