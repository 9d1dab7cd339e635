"""What telemetry costs: events per second into a sink, and the demo with every sink on.

* throughput: a bulk workload on vnpu (periodic generators in C); its events come back as
  `WorkEvent` batches through the driver, into a `TelemetryHub` and, through each sink's
  own `Debouncer`, into a sink that counts batches. Measured raw (window 0) and with the
  platform's 50 ms window; events per second count every raw event the driver produced.
* demo: the demo scenario's two runs (direct and managed, virtual time) without sinks,
  with each built-in sink alone and with all of them (jsonl, perfetto writing its file,
  prometheus, memory), interleaved in one process; the ratios of the medians against the
  run without sinks are the cost of telemetry.

Both run in virtual time on one thread, so they are timed in CPU seconds of this process
(`time.process_time`): on a shared machine, wall time mostly measures the neighbours.

Targets (issue 7): at least 1 million events a second into the sink, raw and with the
50 ms window, and the demo with every sink on at most 10 % slower than with none.

Usage: python benchmarks/telemetry.py [--json] [--quick] [--items N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from _report import Progress, Target, print_report  # beside this script

from npumanager.core.driver.events import WorkEvent
from npumanager.core.driver.job import Job
from npumanager.core.plugins.registry import PluginRegistry, load_plugins
from npumanager.simulation.runner import run_direct, run_managed
from npumanager.simulation.scenario import load_scenario
from npumanager.telemetry import TelemetryHub
from npumanager.vendor_drivers.vnpu import VnpuDriver

GENERATORS = 4
COST_CYCLES = 3_000
"""3 us at 1000 MHz; four generators, one arrival a microsecond: the channels stay busy."""
STEP_US = 20_000
QUEUE = 1 << 20
QUICK_ITEMS = 20_000
"""`--quick`: jobs in the bulk workload, one repeat (seconds; noisy figures)."""
TARGETS = [
    Target("raw_events_per_s", ">=", 1_000_000, why="issue 7"),
    Target("debounced_50ms_events_per_s", ">=", 1_000_000, why="issue 7"),
    Target("demo_ratio", "<=", 1.10, why="issue 7: all sinks against none"),
]
ITEM_COST_S = 3.5e-6
DEMO_COST_S = 0.25
"""Rough CPU seconds of one bulk job and of one demo pair: the progress estimate's weights."""


class CountingSink:
    """A batch sink that only counts."""

    def __init__(self) -> None:
        self.events = 0
        self.batches = 0

    def handle(self, batch: Sequence[object]) -> None:
        self.events += len(batch)
        self.batches += 1


class _HubCallback:
    def __init__(self, hub: TelemetryHub) -> None:
        self.hub = hub
        self.raw = 0

    def on_work_events(self, events: Sequence[WorkEvent]) -> None:
        self.raw += len(events)
        self.hub.publish_work(events)


def throughput(items: int, window_ms: int) -> tuple[float, int, int]:
    """Raw events per CPU second through the hub, raw events, events the sink received."""
    driver = VnpuDriver(1, max_live_work=1 << 20)
    model = driver.load_model(0, weight_bytes=1)
    per = items // GENERATORS
    for index in range(GENERATORS):
        driver.add_periodic(
            model,
            Job(uid=10000 + index, job_priority=index * 300),
            cost_cycles=COST_CYCLES,
            period_us=GENERATORS,
            count=per,
            start_us=index,
        )
    hub = TelemetryHub(threaded=False, close_timeout_s=5)
    sink = CountingSink()
    hub.add(sink, name="count", debounce_duration_ms=window_ms, queue_size=QUEUE)
    callback = _HubCallback(hub)
    driver.set_callback(callback, debounce_duration_ms=0)
    end = per * GENERATORS + 1_000
    start = time.process_time()
    while driver.now_us < end or not driver.engine.idle():
        driver.advance(STEP_US)
        hub.step(driver.now_us)
        hub.drain()
    hub.close()
    elapsed = time.process_time() - start
    driver.close()
    return callback.raw / elapsed, callback.raw, sink.events


SINKS = ("jsonl", "perfetto", "prometheus", "memory")


def make_sinks(registry: PluginRegistry, names: Sequence[str], folder: Path, run: int) -> list[Any]:
    """Fresh sinks of these names for one run; the file sinks write into `folder`."""
    options: dict[str, dict[str, Any]] = {
        "jsonl": {"path": folder / f"events-{run}.jsonl"},
        "perfetto": {"path": folder / f"trace-{run}.json"},
    }
    return [registry.sink(name).factory(**options.get(name, {})) for name in names]


def demo_once(names: Sequence[str], folder: Path, run: int) -> float:
    """CPU seconds for the demo's direct and managed runs with these sinks on."""
    scenario = load_scenario(Path(str(resources.files("npumanager") / "scenarios" / "demo.toml")))
    registry = load_plugins()
    start = time.process_time()
    run_direct(scenario, "vnpu", registry, sinks=make_sinks(registry, names, folder, 2 * run))
    run_managed(scenario, "vnpu", registry, sinks=make_sinks(registry, names, folder, 2 * run + 1))
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--items", type=int, default=500_000, help="jobs in the bulk workload")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure; medians")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_ITEMS:,} jobs, one repeat (seconds; noisy)"
    )
    args = parser.parse_args()
    if args.quick:
        args.items, args.repeats = QUICK_ITEMS, 1

    configs: dict[str, tuple[str, ...]] = {"none": (), **{n: (n,) for n in SINKS}, "all": SINKS}
    bulk = [args.items * ITEM_COST_S] * (2 * args.repeats)
    progress = Progress("telemetry cost", bulk + [DEMO_COST_S] * (1 + args.repeats * len(configs)))
    raw, debounced = [], []
    for window, runs in ((0, raw), (50, debounced)):
        for index in range(args.repeats):
            progress.step(f"{args.items:,} jobs into a sink, {window} ms window, run {index + 1}")
            runs.append(throughput(args.items, window))
    times: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        progress.step("the demo, warming up")
        demo_once(SINKS, Path(tmp), 0)  # warm up: imports, caches
        for run in range(args.repeats):
            for name, names in configs.items():
                progress.step(f"the demo with sinks: {name}, run {run + 1}")
                times[name].append(demo_once(names, Path(tmp), run))
    progress.done()
    medians = {name: statistics.median(values) for name, values in times.items()}
    bare_s, full_s = medians["none"], medians["all"]
    result = {
        "raw_events_per_s": round(statistics.median(r for r, _, _ in raw)),
        "debounced_50ms_events_per_s": round(statistics.median(r for r, _, _ in debounced)),
        "events_per_run": raw[0][1],
        "delivered_raw": raw[0][2],
        "delivered_debounced_50ms": debounced[0][2],
        "demo_no_sinks_s": round(bare_s, 4),
        "demo_all_sinks_s": round(full_s, 4),
        "demo_ratio": round(full_s / bare_s, 3),
        "demo_ratio_by_sink": {n: round(medians[n] / bare_s, 3) for n in SINKS},
        "demo_runs_s": {name: [round(x, 4) for x in values] for name, values in times.items()},
        "items": args.items,
        "repeats": args.repeats,
    }
    print_report(result, TARGETS, as_json=args.json)


if __name__ == "__main__":
    main()
