"""`core.scheduler.DeviceScheduler` driven on its own, as a real-runtime driver would,
against the reference engine: the same starts, pauses and completions at the same times."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumanager.core.driver.events import EventKind
from npumanager.core.driver.job import Job
from npumanager.core.driver.scheduler import NEVER, DeviceScheduler, ScheduledJob
from npumanager.schemas import EndReason, SchedulingConfig, StartReason
from npumanager.schemas.device import DeviceSpec, Scheduler, ThermalSpec
from npumanager.vendor_drivers.reference import ReferenceDriver

APPS = {10: 100, 11: 100, 12: 400, 13: 1000}
"""Each uid's app priority: two in `focus`, one in `normal`, one in `idle`."""

Trace = list[tuple[str, int, int]]


@dataclass(frozen=True)
class Arrival:
    at_us: int
    uid: int
    job_priority: int
    cost_us: int


def run_scheduler(spec: DeviceSpec, arrivals: list[Arrival]) -> Trace:
    """A minimal dispatch loop around the scheduler, on a device doing a cycle a us."""
    sched: DeviceScheduler[ScheduledJob] = DeviceScheduler(spec)
    left: dict[int, int] = {}
    since: dict[int, int] = {}
    trace: Trace = []
    pending = list(enumerate(arrivals, start=1))
    t, again = 0, False
    while True:
        due = [since[j.id] + left[j.id] for j in sched.running if j is not None]
        soon = [*due, sched.next_pause_us(t), *(a.at_us for _, a in pending[:1])]
        t = t if again else min(soon)
        if t >= NEVER:
            return trace
        # As on the device, work that arrives at an event point brings another at once.
        again = bool(pending) and pending[0][1].at_us == t
        for job in list(sched.running):
            if job is not None and since[job.id] + left[job.id] == t:
                sched.stop(job, t, requeue=False)
                trace.append(("completed", job.id, t))
        while pending and pending[0][1].at_us == t:
            work, a = pending.pop(0)
            left[work] = a.cost_us
            sched.enqueue(ScheduledJob(work, a.uid, APPS[a.uid] + a.job_priority), t)
        for job in sched.victims(t):
            left[job.id] -= t - since[job.id]
            sched.stop(job, t, requeue=True)
            trace.append(("paused", job.id, t))
        for channel, occupant in enumerate(sched.running):
            job = sched.pick(t) if occupant is None else None
            if job is not None:
                sched.start(job, channel, t)
                since[job.id] = t
                trace.append(("started", job.id, t))


def run_reference(spec: DeviceSpec, arrivals: list[Arrival]) -> Trace:
    """The same arrivals on the reference device (one-shot generators, so they arrive
    inside an event point like the loop's)."""
    driver = ReferenceDriver([spec])
    driver.set_scheduling_configs(
        [SchedulingConfig(uid=u, app_priority=p) for u, p in APPS.items()]
    )
    model = driver.load_model(0, weight_bytes=1)
    for a in arrivals:
        driver.add_periodic(
            model,
            Job(uid=a.uid, job_priority=a.job_priority),
            cost_cycles=a.cost_us,
            period_us=1,
            start_us=a.at_us,
            count=1,
        )
    driver.run_until_idle()
    trace: Trace = []
    for e in driver.take_events():
        if e.kind == EventKind.STARTED:
            trace.append(("started", e.id, e.time_us))
        elif e.kind == EventKind.ENDED and e.reason == EndReason.PAUSED:
            trace.append(("paused", e.id, e.time_us))
        elif e.kind == EventKind.ENDED:
            trace.append(("completed", e.id, e.time_us))
    assert StartReason.RESUMED == 1
    return trace


specs = st.builds(
    DeviceSpec,
    channels=st.integers(1, 3),
    clock_mhz=st.just(1),
    slice_us=st.sampled_from([50, 100, 7]),
    scheduler=st.sampled_from([Scheduler.FAIR, Scheduler.FAIR, Scheduler.STRICT]),
    floor_percent=st.sampled_from([10, 0, 50]),
    floor_window_us=st.sampled_from([100_000, 300]),
    thermal=st.just(ThermalSpec(heat_per_busy_channel_mc=0)),
)
arrivals = st.lists(
    st.builds(
        Arrival,
        at_us=st.integers(0, 2_000),
        uid=st.sampled_from(sorted(APPS)),
        job_priority=st.sampled_from([0, 0, 50, 300]),
        cost_us=st.integers(1, 1_500),
    ),
    max_size=14,
).map(lambda xs: sorted(xs, key=lambda a: a.at_us))


@settings(max_examples=300, deadline=None)
@given(specs, arrivals)
def test_the_scheduler_on_its_own_matches_the_reference_device(
    spec: DeviceSpec, jobs: list[Arrival]
) -> None:
    assert run_scheduler(spec, jobs) == run_reference(spec, jobs)


def test_a_free_channel_takes_the_least_served_uid_and_the_victim_is_returned() -> None:
    sched: DeviceScheduler[ScheduledJob] = DeviceScheduler(DeviceSpec(channels=1, slice_us=100))
    first, second, third = (
        ScheduledJob(1, 10, 100),
        ScheduledJob(2, 10, 100),
        ScheduledJob(3, 11, 100),
    )
    for job in (first, second, third):
        sched.enqueue(job, 0)
    assert sched.pick(0) is first
    sched.start(first, 0, 0)
    assert sched.next_pause_us(0) == 100
    assert sched.victims(50) == []
    assert sched.victims(100) == [first]  # uid 11 has used nothing yet
    sched.stop(first, 100, requeue=True)
    assert sched.pick(100) is third
    assert sched.depth == 2


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from([Scheduler.FAIR, Scheduler.STRICT]),
    st.lists(st.tuples(st.integers(1, 3), st.integers(0, 1200)), min_size=1, max_size=12),
)
def test_peek_names_the_job_pick_takes_and_takes_nothing(
    scheduler: Scheduler, jobs: list[tuple[int, int]]
) -> None:
    sched: DeviceScheduler[ScheduledJob] = DeviceScheduler(
        DeviceSpec(channels=1, scheduler=scheduler)
    )
    for n, (uid, priority) in enumerate(jobs, start=1):
        sched.enqueue(ScheduledJob(id=n, uid=uid, effective_priority=priority), n)
    t = len(jobs) + 1
    while sched.depth:
        depth = sched.depth
        seen = sched.peek(t)
        assert sched.depth == depth
        assert sched.pick(t) is seen
    assert sched.peek(t) is None


def _state(sched: DeviceScheduler[ScheduledJob]) -> object:
    flows = {k: (f.vruntime, f.running, [e[:2] for e in f.queue]) for k, f in sched.flows.items()}
    running = [None if j is None else (j.id, j.band, j.run_start_us) for j in sched.running]
    return flows, running, sched.live, sched.busy, sched.credit, sched.queued


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([Scheduler.FAIR, Scheduler.STRICT]),
    st.lists(st.tuples(st.sampled_from(sorted(APPS)), st.integers(1, 500)), max_size=16),
)
def test_admit_is_enqueue_pick_and_start_when_nothing_waits(
    scheduler: Scheduler, steps: list[tuple[int, int]]
) -> None:
    spec = DeviceSpec(channels=2, scheduler=scheduler, floor_window_us=300)
    admitted: DeviceScheduler[ScheduledJob] = DeviceScheduler(spec)
    queued: DeviceScheduler[ScheduledJob] = DeviceScheduler(spec)
    t = 0
    for n, (uid, dt) in enumerate(steps, start=1):
        t += dt
        free = [c for c, j in enumerate(admitted.running) if j is None]
        if not free:  # the oldest running job ends on both
            old = min((j for j in admitted.running if j is not None), key=lambda j: j.id)
            twin = next(j for j in queued.running if j is not None and j.id == old.id)
            admitted.stop(old, t, requeue=False)
            queued.stop(twin, t, requeue=False)
            free = [c for c, j in enumerate(admitted.running) if j is None]
        admitted.admit(ScheduledJob(n, uid, APPS[uid]), free[0], t)
        job = ScheduledJob(n, uid, APPS[uid])
        queued.enqueue(job, t)
        assert queued.pick(t) is job
        queued.start(job, free[0], t)
        assert _state(admitted) == _state(queued)


def test_admit_refuses_when_a_job_waits() -> None:
    sched: DeviceScheduler[ScheduledJob] = DeviceScheduler(DeviceSpec(channels=1))
    sched.enqueue(ScheduledJob(1, 10, 100), 0)
    with pytest.raises(ValueError, match="admit only when no job waits"):
        sched.admit(ScheduledJob(2, 10, 100), 0, 0)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([Scheduler.FAIR, Scheduler.STRICT]),
    st.lists(st.tuples(st.integers(1, 3), st.integers(0, 1200)), min_size=1, max_size=12),
    st.sampled_from([100, 300, 1000]),
)
def test_pick_below_takes_the_first_in_pick_order_of_the_bands_above(
    scheduler: Scheduler, jobs: list[tuple[int, int]], below: int
) -> None:
    spec = DeviceSpec(channels=1, scheduler=scheduler)
    every: DeviceScheduler[ScheduledJob] = DeviceScheduler(spec)
    some: DeviceScheduler[ScheduledJob] = DeviceScheduler(spec)
    for n, (uid, priority) in enumerate(jobs, start=1):
        for sched in (every, some):
            sched.enqueue(ScheduledJob(id=n, uid=uid, effective_priority=priority), n)
    t = len(jobs) + 1
    order = []
    while every.depth:
        job = every.pick(t)
        assert job is not None
        order.append(job)
    under = [j.id for j in order if j.effective_priority < below]
    if scheduler == Scheduler.STRICT:  # the head only: strict has no bands to look past
        under = under[:1] if order[0].effective_priority < below else []
    got = some.peek(t, below)
    taken = some.pick(t, below)
    assert (got.id if got else None) == (taken.id if taken else None)
    assert (taken.id if taken else None) == (under[0] if under else None)
    assert some.depth == len(jobs) - (taken is not None)


def test_time_passed_in_never_goes_back() -> None:
    sched: DeviceScheduler[ScheduledJob] = DeviceScheduler(DeviceSpec(channels=1))
    sched.enqueue(ScheduledJob(1, 10, 100), 10)
    with pytest.raises(AssertionError, match="time went back: 5 after 10"):
        sched.peek(5)
