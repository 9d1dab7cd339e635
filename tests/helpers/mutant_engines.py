"""The engine bugs of the mutants: the reference device's firmware, each with one fault.

Each class is a `ReferenceEngine` (or a `DeviceScheduler` put on one) that a vendor's
firmware could plausibly get wrong; `mutant_drivers` puts each behind a driver.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Mapping
from typing import Any

from npumanager import CapacityError, EventKind, ReferenceEngine, SchedulingConfig
from npumanager.core.driver.scheduler import DeviceScheduler
from npumanager.schemas import EndReason, StartReason


class NoClampEngine(ReferenceEngine):
    """Adds the job priority unclamped (the firmware ignores min/max)."""

    def _effective(self, uid: int, original_uid: int, job_priority: int) -> int:
        config = self.configs.get(uid) or SchedulingConfig(uid=uid, app_priority=1000)
        return config.app_priority + job_priority


class ClampAfterAddEngine(ReferenceEngine):
    """Clamps the sum instead of the job priority."""

    def _effective(self, uid: int, original_uid: int, job_priority: int) -> int:
        config = self.configs.get(uid) or SchedulingConfig(uid=uid, app_priority=1000)
        return config.clamp_job_priority(config.app_priority + job_priority)


class Ids16BitEngine(ReferenceEngine):
    """A 16-bit work-id register that wraps."""

    def _event(self, kind: EventKind, reason: int, work: Any, t: int) -> None:
        super()._event(kind, reason, work, t)
        if kind == EventKind.REQUESTED and self.next_work_id > 0xFFFF:
            self.next_work_id = 1


class EndedAtArrivalEngine(ReferenceEngine):
    """Stamps a completion with the time the job was queued (the descriptor's timestamp)."""

    def _event(self, kind: EventKind, reason: int, work: Any, t: int) -> None:
        if kind == EventKind.REQUESTED:
            work.queued_at = t
        if kind == EventKind.ENDED and reason == EndReason.COMPLETED:
            t = getattr(work, "queued_at", t)
        super()._event(kind, reason, work, t)


class DeviceClockSkewEngine(ReferenceEngine):
    """Each device stamps with its own clock; device 1's lags by 3 ms."""

    def _event(self, kind: EventKind, reason: int, work: Any, t: int) -> None:
        super()._event(kind, reason, work, max(0, t - 3000 * work.device))


class LifoScheduler(DeviceScheduler[Any]):
    """Equal priorities of one flow served newest first (a stack, not a queue)."""

    def _push(self, job: Any) -> None:
        self.queued += 1
        entry = (job.effective_priority, -job.id, job)
        if not self.fair:
            heapq.heappush(self.heap, entry)
            return
        insort(self._flow(job.band, job.uid, self.flows).queue, entry)


class ResumeAtBackScheduler(DeviceScheduler[Any]):
    """A paused job is requeued behind the jobs of its priority that arrived after it."""

    def stop(self, job: Any, t: int, *, requeue: bool) -> None:
        if requeue:
            job.id += 1_000_000  # the queue key only: ordered as if submitted now
            super().stop(job, t, requeue=True)
            job.id -= 1_000_000
        else:
            super().stop(job, t, requeue=False)


class PausesMostImportantScheduler(DeviceScheduler[Any]):
    """Pauses the most important running job instead of the least."""

    def victims(self, t: int) -> list[Any]:
        chosen = super().victims(t)
        best_first = sorted(self._run(), key=lambda w: (w.effective_priority, w.id))
        return sorted(best_first[: len(chosen)], key=lambda w: w.channel)


class PausesChannelZeroScheduler(DeviceScheduler[Any]):
    """Pauses the lowest-numbered channels, whatever runs there."""

    def victims(self, t: int) -> list[Any]:
        chosen = super().victims(t)
        return sorted(self._run(), key=lambda w: w.channel)[: len(chosen)]


class FloorNeverOwedScheduler(DeviceScheduler[Any]):
    """The floor credit clamped at 0 from above (a sign slip in its bounds): a lower band
    is never owed, and waits while a more important band keeps the device busy."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self._credit_bounds = (self._credit_bounds[0], 0)


def on_scheduler(scheduler: type[DeviceScheduler[Any]]) -> type[ReferenceEngine]:
    """A reference engine whose devices schedule with `scheduler`."""

    class OnScheduler(ReferenceEngine):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            for dev in self.devices:
                dev.sched = scheduler(dev.spec)

    OnScheduler.__name__ = scheduler.__name__.replace("Scheduler", "Engine")
    return OnScheduler


class NoRerankEngine(ReferenceEngine):
    """Takes new configs for new work only; queued work keeps its old rank."""

    def configure(self, configs: Mapping[int, SchedulingConfig]) -> None:
        self.configs = dict(configs)
        for dev in self.devices:
            dev.dirty = True


class UnloadFreesLastEngine(ReferenceEngine):
    """Unload frees the size of the most recently loaded model."""

    def unload_model(self, model: int) -> None:
        last = self.models[max(self.models)].weight_bytes if self.models else 0
        found = self._model(model)
        self.devices[found.device].weight_used += found.weight_bytes - last
        super().unload_model(model)


class PageRoundingEngine(ReferenceEngine):
    """Accounts loads rounded up to 64-byte pages but frees the exact size."""

    def load_model(self, device: int, weight_bytes: int, sram_bytes: int) -> int:
        handle = super().load_model(device, weight_bytes, sram_bytes)
        self.devices[device].weight_used += -weight_bytes % 64
        return handle


class SramCheckLateEngine(ReferenceEngine):
    """Checks SRAM after accounting the weights, and forgets to undo them."""

    def load_model(self, device: int, weight_bytes: int, sram_bytes: int) -> int:
        dev = self._device(device)
        if sram_bytes > dev.spec.sram_bytes and weight_bytes <= dev.spec.weight_memory_bytes:
            dev.weight_used += weight_bytes
        return super().load_model(device, weight_bytes, sram_bytes)


class CapacityOffByOneEngine(ReferenceEngine):
    """Refuses a model that exactly fills the free memory."""

    def load_model(self, device: int, weight_bytes: int, sram_bytes: int) -> int:
        dev = self._device(device)
        if weight_bytes and weight_bytes == dev.spec.weight_memory_bytes - dev.weight_used:
            raise CapacityError("no room")
        return super().load_model(device, weight_bytes, sram_bytes)


class UnloadAsUserEngine(ReferenceEngine):
    """Ends an unloaded model's work CANCELLED_USER."""

    def _end(self, work: Any, reason: EndReason, t: int) -> None:
        if reason == EndReason.CANCELLED_SYSTEM:
            reason = EndReason.CANCELLED_USER
        super()._end(work, reason, t)


class CancelQueuedAsSystemEngine(ReferenceEngine):
    """A cancel of queued work reports CANCELLED_SYSTEM."""

    def end_work(self, work_id: int, reason: EndReason) -> None:
        work = self.work.get(work_id)
        if work is not None and work.channel < 0 and reason == EndReason.CANCELLED_USER:
            reason = EndReason.CANCELLED_SYSTEM
        super().end_work(work_id, reason)


class AllowsEveryoneEngine(ReferenceEngine):
    """Never checks direct access or attribution."""

    def _permitted(self, uid: int, original_uid: int) -> bool:
        return True


class IgnoresAttributionEngine(ReferenceEngine):
    """Checks direct access but lets any uid attribute another."""

    def _permitted(self, uid: int, original_uid: int) -> bool:
        return super()._permitted(uid, uid)


class NeverPreemptsEngine(ReferenceEngine):
    """The running job keeps its channel."""

    def _marked(self, dev: Any) -> list[Any]:
        return []


class ResumedAsInitialEngine(ReferenceEngine):
    """Reports a resume as an initial start."""

    def _event(self, kind: EventKind, reason: int, work: Any, t: int) -> None:
        if kind == EventKind.STARTED and reason == StartReason.RESUMED:
            reason = StartReason.INITIAL
        super()._event(kind, reason, work, t)


class AllOnDeviceZeroEngine(ReferenceEngine):
    """Reports every event as on device 0."""

    def _event(self, kind: EventKind, reason: int, work: Any, t: int) -> None:
        device, work.device = work.device, 0
        super()._event(kind, reason, work, t)
        work.device = device


class ReportsUidPriorityEngine(ReferenceEngine):
    """Schedules right but reports the uid's priority as the effective one."""

    def _event(self, kind: EventKind, reason: int, work: Any, t: int) -> None:
        saved = work.effective_priority
        work.effective_priority = saved - min(saved, work.job_priority)
        super()._event(kind, reason, work, t)
        work.effective_priority = saved
