"""The device's scheduling policy as a small object: a queue, the next job for a free
channel, the running jobs to pause. Time is passed in; it does no I/O and reads no clock.

At each event point a driver stops what completed, enqueues what arrived, pauses
`victims(t)`, then fills free channels with `pick(t)`; the simulated device follows an
event point that brought new work with another at the same time, and wakes for
`next_pause_us` (tests/test_scheduler.py drives it this way).

The simulated devices use it (`reference`) or implement it identically (`vnpu.c`); a
real-runtime driver can dispatch with it. The rules, under `DeviceSpec.scheduler`:

* strict: the queue is ordered by (effective priority, id). Marking: the waiting jobs best
  first, less as many as there are free channels, pair with the running jobs least
  important first; while the waiting one's effective priority is strictly lower, the
  running one is marked, and it is paused at its next slice boundary (`run_start + k *
  slice_us`, the smallest k >= 1 not before now).
* fair: a job's band is the last of `spec.bands` whose first priority it reaches. Work
  is queued per flow, one flow per (band, uid), in (effective priority, id) order. A flow
  has a virtual runtime: each running job adds `FAIR_WEIGHT_BASE + (effective priority -
  band's first priority)` per microsecond; a new flow starts at the least virtual runtime
  of its band's flows (0 if none). A band with live work has a floor credit, moving per
  microsecond by `floor * (channels running more important bands) - (100 - floor) *
  (channels running this band)`, kept within `[-(100 - floor) * window, floor * window]`
  and reset to 0 when the band has no live work; a band whose credit is > 0 is *owed*.
  The next job: the most important owed band with queued work, else the most important
  band with queued work; in it the flow with the least (virtual runtime, best job's
  effective priority, its id); that flow's best job.
  A running job may be paused only when a positive multiple of `slice_us` has passed
  since it started. Then (waiting jobs in pick order, less as many as there are free
  channels) pair with (running jobs least important first: band, virtual runtime,
  effective priority descending, then nearest slice boundary, then channel); while the
  waiting job beats the running one (a more important band; an owed less important
  band; the same flow and a lower (priority, id); another flow of the band with less
  virtual runtime) the running one is marked, and the marked ones at a boundary pause.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from npumanager.schemas.device import FAIR_WEIGHT_BASE, DeviceSpec, Scheduler
from npumanager.schemas.limits import SIMULATION_HORIZON_US

NEVER = SIMULATION_HORIZON_US


@dataclass(eq=False, slots=True)
class ScheduledJob:
    """What the scheduler knows of one job; a driver's own work record may extend it."""

    id: int
    uid: int
    effective_priority: int
    channel: int = -1
    run_start_us: int = 0
    band: int = 0
    acct_us: int = 0

    @property
    def key(self) -> tuple[int, int]:
        """The order inside a flow (and, under strict, everywhere): lower runs first."""
        return (self.effective_priority, self.id)


J = TypeVar("J", bound=ScheduledJob)


@dataclass(eq=False, slots=True)
class Flow(Generic[J]):
    """One uid's work in one band: its queued jobs in order and its virtual runtime."""

    vruntime: int
    queue: list[tuple[int, int, J]] = field(default_factory=list)
    running: int = 0


class DeviceScheduler(Generic[J]):
    """Queue and channel bookkeeping of one device under one `DeviceSpec`."""

    def __init__(self, spec: DeviceSpec) -> None:
        self.spec = spec
        self.fair = spec.scheduler == Scheduler.FAIR
        self.running: list[J | None] = [None] * spec.channels
        self.heap: list[tuple[int, int, J]] = []
        self.flows: dict[tuple[int, int], Flow[J]] = {}
        nbands = len(spec.bands)
        self._firsts = [band.first_priority for band in spec.bands]
        floor, window = spec.floor_percent, spec.floor_window_us
        self._shares = (floor, 100 - floor)
        """The floor and the rest, in percent: how a band's credit moves (`_fold`)."""
        self._credit_bounds = (-(100 - floor) * window, floor * window)
        self.live = [0] * nbands
        self.busy = [0] * nbands
        self.credit = [0] * nbands
        self.folded_us = 0
        self.checked_us = -1
        self.queued = 0

    # Queue --------------------------------------------------------------------------

    def enqueue(self, job: J, t: int) -> None:
        """A new job waits from `t`."""
        self._fold(t)
        if self.fair:
            job.band = self._band_of(job.effective_priority)
            self.live[job.band] += 1
        self._push(job)

    def admit(self, job: J, channel: int, t: int) -> None:
        """A new job runs on free `channel` from `t` without queueing; only when nothing
        waits, where it is what `enqueue`, `pick` and `start` at `t` would do, in one step."""
        if self.queued:
            raise ValueError("admit only when no job waits: enqueue it, then pick")
        self._fold(t)
        job.channel, job.run_start_us, job.acct_us = channel, t, t  # `start`, folded already
        self.running[channel] = job
        if self.fair:
            band = job.band = self._band_of(job.effective_priority)
            self.live[band] += 1
            self._flow(band, job.uid, self.flows).running += 1
            self.busy[band] += 1

    def remove(self, job: J, t: int) -> None:
        """A waiting job leaves the queue for good (cancelled, failed, revoked)."""
        self._fold(t)
        self.queued -= 1
        if not self.fair:
            self.heap = [entry for entry in self.heap if entry[2] is not job]
            heapq.heapify(self.heap)
            return
        flow = self.flows[(job.band, job.uid)]
        flow.queue = [entry for entry in flow.queue if entry[2] is not job]
        self._left(job, flow)

    def start(self, job: J, channel: int, t: int) -> None:
        """A job picked at `t` runs on `channel`."""
        self._fold(t)
        job.channel, job.run_start_us, job.acct_us = channel, t, t
        self.running[channel] = job
        if self.fair:
            band = job.band
            self.flows[(band, job.uid)].running += 1
            self.busy[band] += 1

    def stop(self, job: J, t: int, *, requeue: bool) -> None:
        """A running job leaves its channel at `t`: paused (`requeue`) or ended."""
        self._fold(t)
        self.running[job.channel] = None
        job.channel = -1
        if self.fair:
            band = job.band
            flow = self.flows[(band, job.uid)]
            flow.running -= 1
            self.busy[band] -= 1
            if not requeue:
                self._left(job, flow)
        if requeue:
            self._push(job)

    def rerank(self, t: int, effective_of: Callable[[J], int]) -> None:
        """Priorities changed: every job takes `effective_of(job)`; flows are rebuilt, and
        a flow that is new takes the least virtual runtime its band had before."""
        self._fold(t)
        queued, running = self.waiting(), self._run()
        for job in queued + running:
            job.effective_priority = effective_of(job)
        if not self.fair:
            self.heap = [(j.effective_priority, j.id, j) for j in queued]
            heapq.heapify(self.heap)
            return
        old = self.flows
        self.flows = {}
        self.live = [0] * len(self.live)
        self.busy = [0] * len(self.busy)
        for job in sorted(queued + running, key=lambda j: j.id):
            job.band = self._band_of(job.effective_priority)
            flow = self._flow(job.band, job.uid, old)
            self.live[job.band] += 1
            if job.channel >= 0:
                flow.running += 1
                self.busy[job.band] += 1
            else:
                insort(flow.queue, (job.effective_priority, job.id, job))
        self.credit = [c if self.live[b] else 0 for b, c in enumerate(self.credit)]

    @property
    def depth(self) -> int:
        """How many jobs wait."""
        return self.queued

    def waiting(self) -> list[J]:
        """The waiting jobs, in no particular order."""
        return [e[2] for e in self.heap] + [e[2] for f in self.flows.values() for e in f.queue]

    # Decisions ----------------------------------------------------------------------

    def peek(self, t: int, below: int | None = None) -> J | None:
        """The job `pick(t, below)` would take, without taking it (a driver may hold it
        back). `below`: only among jobs of effective priority under it (under fair, it is
        meant to be a band's first priority: the bands before it)."""
        if not self.queued:
            return None
        self._fold(t)
        if not self.fair:
            head = self.heap[0][2]
            return head if below is None or head.effective_priority < below else None
        ranked = self._ranked(1, below)
        return ranked[0] if ranked else None

    def pick(self, t: int, below: int | None = None) -> J | None:
        """Take the job that a free channel runs next at `t` (among those under `below`, as
        `peek`), if any waits."""
        job = self.peek(t, below)
        if job is None:
            return None
        if not self.fair:
            heapq.heappop(self.heap)
        else:
            self.flows[(job.band, job.uid)].queue.pop(0)
        self.queued -= 1
        return job

    def victims(self, t: int) -> list[J]:
        """The running jobs to pause at `t`, by channel (call once per event point)."""
        self._fold(t)
        self.checked_us = t
        if not self.fair:
            return [w for w in self._marked_strict() if self._boundary(w, t) == t]
        due = [w for w in self._run() if self._due(w, t)]
        if not due or not self.queued:
            return []
        marked = self._marked_fair(t)
        return sorted((w for w in marked if self._due(w, t)), key=lambda w: w.channel)

    def next_pause_us(self, now: int) -> int:
        """The earliest time at which `victims` may pause something (NEVER if none)."""
        if not self.fair:
            return min((self._boundary(w, now) for w in self._marked_strict()), default=NEVER)
        if not self.queued:
            return NEVER
        after = max(now, self.checked_us + 1)
        return min((self._boundary(w, after) for w in self._run()), default=NEVER)

    # Internals ----------------------------------------------------------------------

    def _run(self) -> list[J]:
        return [job for job in self.running if job is not None]

    def _push(self, job: J) -> None:
        self.queued += 1
        entry = (job.effective_priority, job.id, job)
        if not self.fair:
            heapq.heappush(self.heap, entry)
            return
        insort(self._flow(job.band, job.uid, self.flows).queue, entry)

    def _band_of(self, effective_priority: int) -> int:
        """`spec.band_of`, by bisection of the bands' first priorities (0 is the first)."""
        band = bisect_right(self._firsts, effective_priority) - 1
        return band if band > 0 else 0

    def _flow(self, band: int, uid: int, old: dict[tuple[int, int], Flow[J]]) -> Flow[J]:
        key = (band, uid)
        flow = self.flows.get(key)
        if flow is None:
            kept = old.get(key)
            if kept is not None:
                flow = Flow(kept.vruntime)
            elif not old:
                flow = Flow(0)
            else:
                same = [f.vruntime for (b, _), f in old.items() if b == band]
                flow = Flow(min(same, default=0))
            self.flows[key] = flow
        return flow

    def _left(self, job: J, flow: Flow[J]) -> None:
        band = job.band
        self.live[band] -= 1
        if self.live[band] == 0:
            self.credit[band] = 0
        if not flow.queue and not flow.running:
            del self.flows[(band, job.uid)]

    def _fold(self, t: int) -> None:
        """Bring virtual runtimes and floor credits up to `t` (rates are constant since)."""
        folded = self.folded_us
        if t == folded:
            return
        assert t > folded, f"time went back: {t} after {folded}"
        self.folded_us = t
        if not self.fair:
            return
        busy = self.busy
        if not any(busy):  # nothing runs: no virtual runtime accrues, no credit moves
            return
        firsts, flows = self._firsts, self.flows
        for job in self.running:
            if job is not None:
                band = job.band
                weight = FAIR_WEIGHT_BASE + job.effective_priority - firsts[band]
                flows[(band, job.uid)].vruntime += (t - job.acct_us) * weight
                job.acct_us = t
        dt, credits = t - folded, self.credit
        (floor, rest), (low, high) = self._shares, self._credit_bounds
        above = 0
        for band, live in enumerate(self.live):
            if live:
                rate = floor * above - rest * busy[band]
                if rate:  # credits stay within the bounds: no change needs no clamp
                    credit = credits[band] + dt * rate
                    credits[band] = low if credit < low else high if credit > high else credit
            above += busy[band]

    def _ranked(self, n: int, below: int | None = None) -> list[J]:
        """The next `n` jobs `pick` would take, in order, without taking them (only from
        bands that start under `below`, if given)."""
        taken: dict[tuple[int, int], int] = {}
        out: list[J] = []
        bands = self.spec.bands
        for _ in range(n):
            best: tuple[tuple[int, int, int, int, int], tuple[int, int]] | None = None
            for name, flow in self.flows.items():
                if below is not None and bands[name[0]].first_priority >= below:
                    continue
                at = taken.get(name, 0)
                if at < len(flow.queue):
                    band, head = name[0], flow.queue[at]
                    owed = 0 if self.credit[band] > 0 else 1
                    rank = (owed, band, flow.vruntime, head[0], head[1])
                    if best is None or rank < best[0]:
                        best = (rank, name)
            if best is None:
                break
            name = best[1]
            out.append(self.flows[name].queue[taken.get(name, 0)][2])
            taken[name] = taken.get(name, 0) + 1
        return out

    def _beats(self, waiting: J, running: J) -> bool:
        if waiting.band != running.band:
            return waiting.band < running.band or self.credit[waiting.band] > 0
        if waiting.uid == running.uid:
            return waiting.key < running.key
        mine = self.flows[(waiting.band, waiting.uid)].vruntime
        return mine < self.flows[(running.band, running.uid)].vruntime

    def _marked_fair(self, t: int) -> list[J]:
        running = self._run()
        free = len(self.running) - len(running)
        waiting = self._ranked(free + len(running))[free:]
        worst_first = sorted(
            running,
            key=lambda w: (
                -w.band,
                -self.flows[(w.band, w.uid)].vruntime,
                -w.effective_priority,
                self._boundary(w, t),
                w.channel,
            ),
        )
        marked = []
        for job, victim in zip(waiting, worst_first, strict=False):
            if not self._beats(job, victim):
                break
            marked.append(victim)
        return marked

    def _due(self, job: J, t: int) -> bool:
        elapsed = t - job.run_start_us
        return elapsed > 0 and elapsed % self.spec.slice_us == 0

    def _boundary(self, job: J, now: int) -> int:
        slice_us = self.spec.slice_us
        elapsed = now - job.run_start_us
        k = max(1, -(-elapsed // slice_us))
        return job.run_start_us + k * slice_us

    def _marked_strict(self) -> list[J]:
        running = self._run()
        if not self.heap or not running:
            return []
        worst_first = sorted(running, key=lambda w: w.key, reverse=True)
        if self.heap[0][0] >= worst_first[0].effective_priority:
            return []
        free = len(self.running) - len(running)
        best_first = [w for _, _, w in heapq.nsmallest(len(running) + free, self.heap)][free:]
        marked = []
        for waiting, victim in zip(best_first, worst_first, strict=False):
            if waiting.effective_priority >= victim.effective_priority:
                break
            marked.append(victim)
        return sorted(marked, key=lambda w: w.channel)
