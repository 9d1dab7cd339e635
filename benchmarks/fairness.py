"""How the device shares itself: the fair scheduler against strict FIFO, in virtual time.

The workloads of the Linux "fair" DRM scheduler series and a REEF-style real-time test, on
one channel of the default `DeviceSpec` (1 GHz, 100 us slices, four bands, 10 % floor),
each run under `scheduler="fair"` and `scheduler="strict"` in the same process on the
vnpu engine (virtual clock, so the figures are exact and the machine's load does not
matter). Closed-loop clients resubmit at the very microsecond a job of theirs completes.

Targets (issue 14) are the fair scheduler's; the strict runs are the baseline beside them.

Usage: python benchmarks/fairness.py [--json] [--quick] [--seconds S]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from _report import Progress, Target, print_report  # beside this script

from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.driver.job import Arrivals, Job
from npumanager.schemas import EndReason, SchedulingConfig
from npumanager.schemas.device import DeviceSpec, Scheduler
from npumanager.vendor_drivers.vnpu import VnpuDriver

MS = 1000
CYCLES_PER_US = DeviceSpec().clock_mhz
FOREGROUND, BACKGROUND = 100, 400
"""App priorities: a foreground app (the focus band) and a cached one (the normal band)."""


@dataclass
class Client:
    """One app: a uid, its app priority, and either periodic frames or a closed loop."""

    uid: int
    app_priority: int
    cost_us: int
    period_us: int = 0
    """Periodic: one job every period_us (0: a closed loop)."""
    depth: int = 0
    """Closed loop: jobs kept queued or running."""


@dataclass
class Run:
    """What one run measured, per uid."""

    seconds: float
    busy_us: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    latencies: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    waits: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    """The longest stretch a uid had work waiting and none running."""
    requested: dict[int, int] = field(default_factory=dict)
    started: dict[int, tuple[int, int]] = field(default_factory=dict)
    queued: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    running: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    starved_since: dict[int, int] = field(default_factory=dict)

    def account(self, e: WorkEvent) -> bool:
        """Take one event in; True when it completed a job."""
        uid, t = e.uid, e.time_us
        done = False
        if e.kind == EventKind.REQUESTED:
            self.requested[e.id] = t
            self.queued[uid] += 1
        elif e.kind == EventKind.STARTED:
            self.started[e.id] = (uid, t)
            self.queued[uid] -= 1
            self.running[uid] += 1
        else:
            self.busy_us[uid] += t - self.started.pop(e.id)[1]
            self.running[uid] -= 1
            if e.reason == EndReason.PAUSED:
                self.queued[uid] += 1
            else:
                self.latencies[uid].append(t - self.requested.pop(e.id))
                done = e.reason == EndReason.COMPLETED
        self.track(uid, t)
        return done

    def track(self, uid: int, t: int, *, closing: bool = False) -> None:
        """Open or close the uid's stretch of waiting with nothing running."""
        starved = self.queued[uid] > 0 and self.running[uid] == 0 and not closing
        since = self.starved_since.get(uid)
        if starved and since is None:
            self.starved_since[uid] = t
        elif not starved and since is not None:
            self.waits[uid] = max(self.waits[uid], t - since)
            del self.starved_since[uid]

    def close(self, end: int) -> None:
        """Count what still runs or waits at the end of the run."""
        for uid, since in self.started.values():
            self.busy_us[uid] += end - since
        for uid in list(self.starved_since):
            self.track(uid, end, closing=True)


def simulate(clients: list[Client], scheduler: Scheduler, seconds: float, slice_us: int = 0) -> Run:
    """Run the clients on one channel for `seconds` of device time."""
    spec = DeviceSpec(channels=1, scheduler=scheduler, slice_us=slice_us or DeviceSpec().slice_us)
    driver = VnpuDriver([spec], max_live_work=1 << 16)
    engine = driver.engine
    engine.configure(
        {c.uid: SchedulingConfig(uid=c.uid, app_priority=c.app_priority) for c in clients}
    )
    model = engine.load_model(0, 1, 0)
    end = int(seconds * 1_000_000)
    for c in clients:
        if c.period_us:
            arrivals = Arrivals(c.period_us, 0, end // c.period_us, 1)
            engine.add_periodic(model, Job(c.uid, 0, c.uid), c.cost_us * CYCLES_PER_US, arrivals)
        for _ in range(c.depth):
            engine.submit(model, c.uid, c.uid, 0, c.cost_us * CYCLES_PER_US, None, None, 0)
    loops = {c.uid: c for c in clients if c.period_us == 0}
    run = Run(seconds)
    t = 0
    while t < end:
        t = min(engine.next_event_us(), end)
        engine.advance_to(t)
        for e in engine.take_events():
            if run.account(e) and e.uid in loops:
                c = loops[e.uid]
                engine.submit(model, c.uid, c.uid, 0, c.cost_us * CYCLES_PER_US, None, None, 0)
    run.close(end)
    driver.close()
    return run


def p99(values: list[int]) -> int:
    """The 99th percentile (nearest rank); 0 for no values."""
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99 + 0.5) - 1)] if ordered else 0


def share(run: Run, uid: int) -> float:
    """The device share of one uid, in percent of the run."""
    return round(100 * run.busy_us[uid] / (run.seconds * 1_000_000), 1)


def fps(run: Run, uid: int, period_us: int) -> float:
    """Frames a second that finished within their period."""
    return round(sum(1 for lat in run.latencies[uid] if lat <= period_us) / run.seconds, 1)


INTERACTIVE = Client(uid=10_001, app_priority=FOREGROUND, cost_us=2 * MS, period_us=16_667)
CAMERA = Client(uid=10_005, app_priority=FOREGROUND, cost_us=5 * MS, period_us=33_333)


def deep_queues(scheduler: Scheduler, seconds: float) -> dict[str, Any]:
    """Two equal-priority clients, each with a whole run's worth of 8 ms jobs queued."""
    depth = int(seconds * 1_000_000) // (8 * MS) + 1
    a = Client(uid=10_001, app_priority=FOREGROUND, cost_us=8 * MS, depth=depth)
    b = Client(uid=10_002, app_priority=FOREGROUND, cost_us=8 * MS, depth=depth)
    run = simulate([a, b], scheduler, seconds)
    return {
        "share_a_percent": share(run, a.uid),
        "share_b_percent": share(run, b.uid),
        "longest_wait_ms": max(run.waits.values()) / MS,
    }


def interactive(heavy: Client, scheduler: Scheduler, seconds: float) -> dict[str, Any]:
    """The interactive client (2 ms every 16.7 ms) against a heavy one of equal priority."""
    solo = simulate([INTERACTIVE], scheduler, seconds)
    run = simulate([INTERACTIVE, heavy], scheduler, seconds)
    solo_fps = fps(solo, INTERACTIVE.uid, INTERACTIVE.period_us)
    got_fps = fps(run, INTERACTIVE.uid, INTERACTIVE.period_us)
    tail = p99(run.latencies[INTERACTIVE.uid]) / MS
    return {
        "fps": got_fps,
        "solo_fps": solo_fps,
        "fps_of_solo_percent": round(100 * got_fps / solo_fps, 1),
        "p99_ms": tail,
        "solo_p99_ms": p99(solo.latencies[INTERACTIVE.uid]) / MS,
        "heavy_share_percent": share(run, heavy.uid),
        "longest_wait_ms": max(run.waits.values()) / MS,
    }


def background_floor(scheduler: Scheduler, seconds: float) -> dict[str, Any]:
    """A background closed loop while the foreground keeps the device 100 % busy."""
    fg = Client(uid=10_001, app_priority=FOREGROUND, cost_us=8 * MS, depth=4)
    bg = Client(uid=10_009, app_priority=BACKGROUND, cost_us=8 * MS, depth=1)
    run = simulate([fg, bg], scheduler, seconds)
    return {
        "background_share_percent": share(run, bg.uid),
        "foreground_share_percent": share(run, fg.uid),
        "longest_wait_ms": max(run.waits.values()) / MS,
    }


def camera_vs_flood(scheduler: Scheduler, seconds: float) -> dict[str, Any]:
    """A foreground camera (5 ms every 33 ms) against a background flood of 20 ms jobs."""
    flood = Client(uid=10_009, app_priority=BACKGROUND, cost_us=20 * MS, depth=8)
    solo = simulate([CAMERA], scheduler, seconds)
    run = simulate([CAMERA, flood], scheduler, seconds)
    alone, shared = p99(solo.latencies[CAMERA.uid]), p99(run.latencies[CAMERA.uid])
    overhead = round(100 * (shared - alone) / alone, 1)
    old = simulate([CAMERA, flood], scheduler, seconds, slice_us=1000)
    return {
        "p99_overhead_at_1ms_slice_percent": round(
            100 * (p99(old.latencies[CAMERA.uid]) - alone) / alone, 1
        ),
        "p99_ms": shared / MS,
        "solo_p99_ms": alone / MS,
        "p99_overhead_percent": overhead,
        "flood_share_percent": share(run, flood.uid),
        "longest_wait_ms": max(run.waits.values()) / MS,
    }


WORKLOADS = {
    "deep_queues": deep_queues,
    "interactive_vs_75pct_busy": lambda s, sec: interactive(
        Client(uid=10_002, app_priority=FOREGROUND, cost_us=25 * MS, period_us=33_333), s, sec
    ),
    "interactive_vs_4x50ms_queued": lambda s, sec: interactive(
        Client(uid=10_002, app_priority=FOREGROUND, cost_us=50 * MS, depth=4), s, sec
    ),
    "background_floor": background_floor,
    "camera_vs_flood": camera_vs_flood,
}


QUICK_SECONDS = 1.0
"""`--quick`: device time per run (exact figures still; shorter runs, fewer frames)."""
INTERACTIVE_WORKLOADS = ("interactive_vs_75pct_busy", "interactive_vs_4x50ms_queued")


def targets() -> list[Target]:
    """Issue 14's targets, on the fair scheduler's figures."""
    fair = f"workloads.{{}}.{Scheduler.FAIR}.{{}}"
    found = [
        Target(fair.format("deep_queues", f"share_{x}_percent"), "within", 45, 55, "issue 14")
        for x in ("a", "b")
    ]
    for name in INTERACTIVE_WORKLOADS:
        found.append(Target(fair.format(name, "fps_of_solo_percent"), ">=", 90, why="issue 14"))
        found.append(Target(fair.format(name, "p99_ms"), "<", 10, why="issue 14"))
    found.append(
        Target(fair.format("background_floor", "background_share_percent"), ">=", 5, why="issue 14")
    )
    found.append(
        Target(fair.format("camera_vs_flood", "p99_overhead_percent"), "<=", 5, why="issue 14")
    )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seconds", type=float, default=10.0, help="device time per run")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_SECONDS:g} s of device time per run"
    )
    args = parser.parse_args()
    if args.quick:
        args.seconds = QUICK_SECONDS
    schedulers = (Scheduler.FAIR, Scheduler.STRICT)
    progress = Progress("device sharing, virtual time", len(WORKLOADS) * len(schedulers))
    result: dict[str, Any] = {"seconds": args.seconds, "channels": 1, "workloads": {}}
    for name, workload in WORKLOADS.items():
        result["workloads"][name] = {}
        for scheduler in schedulers:
            progress.step(f"{name}, {scheduler} scheduler")
            result["workloads"][name][str(scheduler)] = workload(scheduler, args.seconds)
    progress.done()
    print_report(result, targets(), as_json=args.json)


if __name__ == "__main__":
    main()
