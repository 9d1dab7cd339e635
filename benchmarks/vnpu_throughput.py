"""How fast the virtual NPU schedules: vnpu (C) against the reference (Python), same workload.

Ways in:

* bulk: the workload is handed over as periodic generators; vnpu runs it in C and
  events come back as raw record batches (counted, not converted); on the default (fair)
  device and, as the baseline in the same run, on a `scheduler="strict"` one;
* single: Python submits one job at a time, advances, and reads every event back as a
  light `WorkEvent` record;
* c_floor: the same one-at-a-time loop driven from C alone;
* reference: the bulk workload on the plain-Python device.

A real-time run measures the preemption reaction: a more important job arrives while a
less important one holds the only channel; the time until it starts (the other paused at
its slice boundary) is read from the events' device timestamps.

Targets: issue 3's (bulk at least 5 million items a second, single at least 500 thousand,
vnpu at least 50x the reference, the preemption reaction's p99 within a slice plus
100 us) and issue 14's (the fair scheduler's bulk throughput at least 0.9 of the strict
one's, the baseline in this run).

Usage: python benchmarks/vnpu_throughput.py [--json] [--quick] [--items N] [--repeats R]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from _report import Progress, Target, print_report  # beside this script

from npumanager.core.driver.events import EventKind
from npumanager.core.driver.job import Job
from npumanager.schemas.device import DeviceSpec, Scheduler
from npumanager.vendor_drivers.reference import ReferenceDriver
from npumanager.vendor_drivers.vnpu import VnpuDriver
from npumanager.vendor_drivers.vnpu._vnpu import ffi, lib

GENERATORS = 4
PRIORITIES = (0, 300, 600, 900)
COST_CYCLES = 3_000
"""3 us at the default 1000 MHz: four channels, one arrival a microsecond, 75 % busy."""
PERIOD_US = GENERATORS
BATCH = 65_536
QUICK = {"items": 100_000, "reference_items": 2_000, "single_items": 5_000, "samples": 20}
"""`--quick`: every figure from small runs, one repeat (seconds; noisy figures)."""


def targets(slice_us: int) -> list[Target]:
    """Issue 3's and issue 14's targets; the reaction's bound depends on the slice."""
    return [
        Target("vnpu_items_per_s", ">=", 5_000_000, why="issue 3: bulk"),
        Target("vnpu_single_items_per_s", ">=", 500_000, why="issue 3: single"),
        Target("ratio", ">=", 50, why="issue 3: vnpu bulk over the reference"),
        Target("preempt_reaction_p99_us", "<=", slice_us + 100, why="issue 3: a slice + 100 us"),
        Target("fair_over_strict", ">=", 0.9, why="issue 14: bands cost at most 10 %"),
    ]


def periodic_workload(driver: Any, items: int) -> int:
    """Load one model and hand over `items` jobs as generators; returns the last arrival time."""
    model = driver.load_model(0, weight_bytes=1)
    per = items // GENERATORS
    for index, priority in enumerate(PRIORITIES):
        driver.add_periodic(
            model,
            Job(uid=10000 + index, job_priority=priority),
            cost_cycles=COST_CYCLES,
            period_us=PERIOD_US,
            count=per,
            start_us=index,
        )
    return per * PERIOD_US + 1_000


def bulk_vnpu(items: int, scheduler: Scheduler = Scheduler.FAIR) -> tuple[float, int]:
    """Items per second and events produced, all in C, events drained as raw batches."""
    driver = VnpuDriver([DeviceSpec(scheduler=scheduler)], max_live_work=1 << 20)
    end = periodic_workload(driver, items)
    handle = driver.engine.handle  # type: ignore[attr-defined]
    buf = ffi.new("vnpu_event[]", BATCH)
    count = ffi.new("int32_t *")
    idle = ffi.new("int32_t *")
    events = 0
    start = time.perf_counter()
    while not idle[0]:
        rc = lib.vnpu_advance_to(handle, end)
        while True:
            lib.vnpu_drain(handle, buf, BATCH, count)
            events += count[0]
            if count[0] < BATCH:
                break
        assert rc in (lib.VNPU_OK, lib.VNPU_E_AGAIN), rc
        if rc == lib.VNPU_OK:
            lib.vnpu_idle(handle, idle)
            end += 1_000
    elapsed = time.perf_counter() - start
    driver.close()
    return items / elapsed, events


def bulk_reference(items: int) -> tuple[float, int]:
    """Items per second of the same workload on the plain-Python device."""
    driver = ReferenceDriver(1, max_live_work=1 << 20)
    end = periodic_workload(driver, items)
    start = time.perf_counter()
    driver.advance(end)
    driver.run_until_idle()
    events = len(driver.take_events())
    elapsed = time.perf_counter() - start
    return items / elapsed, events


def single_vnpu(items: int) -> float:
    """Items per second submitting from Python one at a time, reading every event back."""
    driver = VnpuDriver(1)
    model = driver.load_model(0, weight_bytes=1)
    submit, advance, take = driver.submit, driver.advance, driver.take_events
    seen = 0
    start = time.perf_counter()
    for _ in range(items):
        submit(model, uid=10_000, cost_cycles=COST_CYCLES)
        advance(3)
        seen += len(take())
    elapsed = time.perf_counter() - start
    driver.close()
    assert seen >= 2 * items
    return items / elapsed


def c_floor(items: int) -> float:
    """Items per second of the one-at-a-time loop run entirely in C."""
    driver = VnpuDriver(1)
    model = driver.load_model(0, weight_bytes=1)
    start = time.perf_counter()
    driver.engine.bench_single(model, items, 10_000, COST_CYCLES, 0)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - start
    driver.close()
    return items / elapsed


def preempt_reaction(samples: int, slice_us: int) -> list[float]:
    """Microseconds from a more important arrival until it starts, on a busy 1-channel device."""
    spec = DeviceSpec(channels=1, slice_us=slice_us)
    driver = VnpuDriver([spec], clock="real")
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=20_000, cost_cycles=10**15, job_priority=1000)
    rng = random.Random(7)
    reactions: list[float] = []
    try:
        for _ in range(samples):
            time.sleep(rng.uniform(0.0005, 0.003))
            urgent = driver.submit(model, uid=20_001, cost_cycles=100, job_priority=0)
            requested = started = None
            deadline = time.monotonic() + 2
            while started is None and time.monotonic() < deadline:
                time.sleep(0.0002)
                for event in driver.take_events():
                    if event.id != urgent:
                        continue
                    if event.kind == EventKind.REQUESTED:
                        requested = event.time_us
                    elif event.kind == EventKind.STARTED:
                        started = event.time_us
            if requested is not None and started is not None:
                reactions.append(started - requested)
            while driver.take_events():
                time.sleep(0.0002)
    finally:
        driver.close()
    return reactions


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99 + 0.5) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--items", type=int, default=2_000_000, help="bulk items for vnpu")
    parser.add_argument("--reference-items", type=int, default=40_000)
    parser.add_argument("--single-items", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; medians")
    parser.add_argument("--samples", type=int, default=300, help="preemption samples")
    parser.add_argument("--slice-us", type=int, default=1000)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small runs of every figure, one repeat (seconds; noisy): "
        + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()),
    )
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK, repeats=1)

    # Rough seconds of each step, for the progress estimate.
    costs = {
        "bulk": args.items / 2.5e6,
        "reference": args.reference_items / 3e4,
        "single": args.single_items / 1e5,
        "floor": args.single_items / 1e6,
    }
    weights = [costs["bulk"]] * 2 * args.repeats
    weights += [costs[k] for k in ("reference", "single", "floor") for _ in range(args.repeats)]
    progress = Progress("vnpu throughput", [*weights, args.samples * 0.003])
    bulk, strict = [], []
    for index in range(args.repeats):  # alternating, so both see the same neighbours
        progress.step(f"bulk, fair, {args.items:,} items, run {index + 1}")
        bulk.append(bulk_vnpu(args.items))
        progress.step(f"bulk, strict, {args.items:,} items, run {index + 1}")
        strict.append(bulk_vnpu(args.items, Scheduler.STRICT)[0])
    ref, single, floor = [], [], []
    for index in range(args.repeats):
        progress.step(f"reference, {args.reference_items:,} items, run {index + 1}")
        ref.append(bulk_reference(args.reference_items))
    for index in range(args.repeats):
        progress.step(f"single, {args.single_items:,} items, run {index + 1}")
        single.append(single_vnpu(args.single_items))
    for index in range(args.repeats):
        progress.step(f"C floor, {args.single_items * 5:,} items, run {index + 1}")
        floor.append(c_floor(args.single_items * 5))
    progress.step(f"preemption reaction, {args.samples} samples in real time")
    reactions = preempt_reaction(args.samples, args.slice_us)
    progress.done()
    vnpu_rate = statistics.median(r for r, _ in bulk)
    ref_rate = statistics.median(r for r, _ in ref)
    result = {
        "vnpu_items_per_s": round(vnpu_rate),
        "vnpu_strict_items_per_s": round(statistics.median(strict)),
        "fair_over_strict": round(vnpu_rate / statistics.median(strict), 3),
        "vnpu_single_items_per_s": round(statistics.median(single)),
        "reference_items_per_s": round(ref_rate),
        "ratio": round(vnpu_rate / ref_rate, 1),
        "c_floor_items_per_s": round(statistics.median(floor)),
        "events_per_item": round(bulk[0][1] / args.items, 2),
        "preempt_reaction_p50_us": round(statistics.median(reactions), 1) if reactions else None,
        "preempt_reaction_p99_us": round(p99(reactions), 1) if reactions else None,
        "preempt_samples": len(reactions),
        "slice_us": args.slice_us,
        "items": {
            "bulk": args.items,
            "reference": args.reference_items,
            "single": args.single_items,
        },
        "repeats": args.repeats,
    }
    print_report(result, targets(args.slice_us), as_json=args.json)


if __name__ == "__main__":
    main()
