"""`npu-manager demo` and `npu-manager simulate`: play a scenario, show it, trace it, draw it.

Both play a scenario direct (no arbiter) and managed (through the service), print the
runs side by side (or as JSON), and on request write one Perfetto trace of the runs
(`--trace`, the runs told apart by process-name prefixes) and a timeline picture
(`--plot`, extra `plot`). A run longer than a second of wall time shows a progress bar
on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from npumanager.core.plugins.registry import PluginRegistry
from npumanager.errors import ConfigError, NpuManagerError
from npumanager.schemas import DriverCapability, DriverRecord
from npumanager.schemas.limits import (
    MAX_REAL_DEMO_MIN_JOBS,
    MAX_REAL_DEMO_SECONDS,
    REAL_DEMO_SECONDS,
)
from npumanager.simulation.devices import on_devices
from npumanager.simulation.managed import check_policy
from npumanager.simulation.progress import ProgressBar
from npumanager.simulation.runner import RunResult, run_direct, run_managed
from npumanager.simulation.scenario import (
    Scenario,
    find_scenario,
    load_scenario,
    shipped_scenarios,
)

Table = Callable[[Sequence[Sequence[str]], Sequence[str]], str]
MODES = ("direct", "managed")
ALWAYS_SHOWN = frozenset({"overcommit_events", "unload_requests"})
"""Rows shown even when every run has nothing there (others are left out then)."""
PROGRESS_CHOICES = ("auto", "always", "never")
DEFAULT_DRIVER = "vnpu"
ROLE_PREFIXED = ("camera", "background", "assistant", "indexer")
"""Roles whose metrics (`camera_frames`, ...) are reported only when some app has the role."""

ROWS: list[tuple[str, str]] = [
    ("camera_frames", "camera frames"),
    ("camera_deadline_misses", "camera deadline misses"),
    ("camera_p99_ms", "camera p99 latency (ms)"),
    ("background_jobs_done", "background jobs done"),
    ("assistant_jobs_done", "assistant jobs done"),
    ("indexer_jobs_done", "indexer jobs done"),
    ("overcommit_events", "over-commit events (LMK)"),
    ("peak_weight_memory_bytes", "peak weight memory (GiB)"),
    ("weight_memory_capacity_bytes", "weight memory capacity (GiB)"),
    ("peak_temperature_c", "peak temperature (C)"),
    ("throttled_ms", "throttled (ms)"),
    ("unload_requests", "unload requests"),
    ("jobs_done", "jobs done by app"),
]


_LABELS = dict(ROWS)
LMK_NOTE = (
    "(LMK: the kernel's low-memory killer; an over-commit event is a load that did not fit "
    "in the device's weight memory, which on a phone would wake it to kill an app)"
)


class Context(Protocol):
    """What a command gets from the command line: its arguments, the plugins, the streams."""

    args: argparse.Namespace
    out: TextIO
    err: TextIO

    @property
    def registry(self) -> PluginRegistry: ...


def add_play_arguments(parser: argparse.ArgumentParser) -> None:
    """The options demo and simulate share."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--driver",
        help="the driver to run on (default: vnpu; with demo --real, openvino or onnxruntime); "
        "a simulation runs on the scenario's [[devices]] in place of the driver's own device, "
        "or on the driver's own when the scenario has none",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        metavar="FILE",
        help="write a Perfetto trace of the runs (open it at ui.perfetto.dev)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="draw the runs' timeline into a picture: .png, .jpg, .svg or .pdf (needs the "
        "'plot' extra)",
    )
    parser.add_argument(
        "--progress",
        choices=PROGRESS_CHOICES,
        default="auto",
        help="a progress bar on stderr once a run takes over a second (auto: on a terminal)",
    )


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of simulate."""
    parser.add_argument(
        "scenario",
        nargs="?",
        metavar="FILE|NAME",
        help="a scenario file, or the name of a shipped one (see --list)",
    )
    parser.add_argument("--list", action="store_true", help="list the shipped scenarios")
    parser.add_argument(
        "--mode",
        choices=(*MODES, "both"),
        default="both",
        help="play direct, managed or both (default: both)",
    )
    add_play_arguments(parser)


def demo(ctx: Context, table: Table, default: Path) -> int:
    """Play the demo scenario (or `--scenario FILE`) direct and managed; `--real`: its
    apps as real models on this machine, on the wall clock."""
    if ctx.args.real:
        return _play_real(ctx, table, default)
    if ctx.args.seconds is not None:
        raise NpuManagerError(
            "--seconds applies to demo --real only (wall time per run); the simulated demo "
            "plays the scenario's duration_ms of virtual time"
        )
    if ctx.args.min_jobs is not None:
        raise NpuManagerError(
            "--min-jobs applies to demo --real only (inferences per app); the simulated demo "
            "plays the scenario's duration_ms of virtual time"
        )
    path = ctx.args.scenario or default
    return _play(ctx, table, load_scenario(path), MODES, str(path))


def simulate(ctx: Context, table: Table) -> int:
    """Play a scenario file or a shipped scenario, or list the shipped ones."""
    if ctx.args.list:
        return _list(ctx, table)
    if ctx.args.scenario is None:
        raise NpuManagerError("give a scenario file or a shipped scenario's name, or --list")
    path = find_scenario(ctx.args.scenario)
    modes = MODES if ctx.args.mode == "both" else (ctx.args.mode,)
    return _play(ctx, table, load_scenario(path), modes, str(path))


def _list(ctx: Context, table: Table) -> int:
    rows = []
    for name, path in shipped_scenarios().items():
        scenario = load_scenario(path)
        rows.append(
            [name, scenario.policy, f"{scenario.duration_ms / 1000:g} s", scenario.description]
        )
    if ctx.args.json:
        keys = ("name", "policy", "duration", "description")
        json.dump([dict(zip(keys, row, strict=True)) for row in rows], ctx.out, indent=2)
        ctx.out.write("\n")
    else:
        print(table(rows, ["NAME", "POLICY", "DURATION", "DESCRIPTION"]), file=ctx.out)
    return 0


def _check_driver(registry: PluginRegistry, name: str) -> None:
    """A driver that cannot step virtual time is refused, naming the drivers that can."""
    record = registry.driver(name)  # an unknown name is a one-line error listing the known ones
    if DriverCapability.VIRTUAL_TIME in record.capabilities:
        return
    fit = sorted(
        reg.name
        for reg in registry.registrations()
        if isinstance(reg.record, DriverRecord)
        and DriverCapability.VIRTUAL_TIME in reg.record.capabilities
    )
    raise NpuManagerError(
        f"driver {name!r} cannot play a scenario: a simulation steps virtual time a millisecond "
        f"at a time, and {name!r} runs on the wall clock (no {DriverCapability.VIRTUAL_TIME} "
        f"capability); drivers that can: {', '.join(fit) or 'none installed'}"
    )


def _play(ctx: Context, table: Table, scenario: Scenario, modes: Sequence[str], origin: str) -> int:
    args = ctx.args
    args.driver = args.driver or DEFAULT_DRIVER
    _check_driver(ctx.registry, args.driver)
    scenario, devices = on_devices(scenario, ctx.registry, args.driver, origin)
    if "managed" in modes:
        with _blamed(origin):
            check_policy(scenario, ctx.registry)
    if args.plot is not None:
        from npumanager.simulation.plot import picture_format, require_matplotlib

        require_matplotlib()
        picture_format(args.plot)
    for path in (args.trace, args.plot):
        if path is not None:
            _check_writable(path)
    with _blamed(origin):
        results = _run(ctx, scenario, modes)
    written = []
    if args.trace is not None:
        from npumanager.telemetry.perfetto import write_trace

        with _writing(args.trace):
            write_trace(args.trace, [sink for _, sink in results.values() if sink is not None])
        written.append(f"trace: {args.trace} (open it at ui.perfetto.dev)")
    if args.plot is not None:
        from npumanager.simulation.plot import draw_timeline

        with _writing(args.plot):
            draw_timeline([result for result, _ in results.values()], scenario, args.plot)
        written.append(f"timeline: {args.plot}")
    roles: set[str] = {app.role for app in scenario.apps}
    metrics = {mode: _reported(result, roles) for mode, (result, _) in results.items()}
    if args.json:
        json.dump(metrics, ctx.out, indent=2)
        ctx.out.write("\n")
        return 0
    print(f"{scenario.name}: {scenario.description}", file=ctx.out)
    print(
        f"{scenario.duration_ms / 1000:g} s of virtual time on {args.driver}, {devices}; "
        f"managed runs the {scenario.policy!r} policy\n",
        file=ctx.out,
    )
    body = [
        [label, *(_cell(key, metrics[mode][key]) for mode in modes)]
        for key, label in ROWS
        if key in metrics[modes[0]]
        and (key in ALWAYS_SHOWN or any(metrics[mode][key] for mode in modes))
    ]
    print(table(body, ["", *(mode.upper() for mode in modes)]), file=ctx.out)
    if any(row[0] == _LABELS["overcommit_events"] for row in body):
        print(LMK_NOTE, file=ctx.out)
    for line in written:
        print(line, file=ctx.out)
    return 0


def _play_real(ctx: Context, table: Table, default: Path) -> int:
    from npumanager.simulation import real_demo

    for option in ("plot", "trace"):
        if getattr(ctx.args, option) is not None:
            raise NpuManagerError(
                f"--{option} draws the simulated runs; demo --real does not take it"
            )
    seconds = REAL_DEMO_SECONDS if ctx.args.seconds is None else ctx.args.seconds
    if not 0 < seconds <= MAX_REAL_DEMO_SECONDS:
        raise NpuManagerError(
            f"--seconds must be more than 0 and at most {MAX_REAL_DEMO_SECONDS:g} (wall time "
            f"per run); got {seconds:g}"
        )
    min_jobs = 0 if ctx.args.min_jobs is None else ctx.args.min_jobs
    if not 0 <= min_jobs <= MAX_REAL_DEMO_MIN_JOBS:
        raise NpuManagerError(
            f"--min-jobs must be within 0..{MAX_REAL_DEMO_MIN_JOBS} (inferences per app); "
            f"got {min_jobs}"
        )
    driver = real_demo.pick_driver(ctx.registry, ctx.args.driver)
    scenario = load_scenario(ctx.args.scenario or default)
    plan = real_demo.Plan(ctx.registry, driver, scenario, seconds, min_jobs=min_jobs)
    metrics = {
        "direct": real_demo.run_direct(plan),
        "managed": real_demo.run_managed(plan, ctx.registry),
    }
    if ctx.args.json:
        json.dump(metrics, ctx.out, indent=2)
        ctx.out.write("\n")
        return 0
    apps = ", ".join(_importances(plan, app) for app in scenario.apps)
    print(f"demo --real: {scenario.name}'s apps {apps}", file=ctx.out)
    print(
        f"real models on {driver}, {seconds:g} s of wall time per run{_overtime(min_jobs)}; "
        f"managed runs the {scenario.policy!r} policy\n",
        file=ctx.out,
    )
    body = [
        [label, *(_cell(key, metrics[mode][key]) for mode in MODES)]
        for key, label in ROWS
        if key in metrics["managed"]
    ]
    print(table(body, ["", *(mode.upper() for mode in MODES)]), file=ctx.out)
    for mode in MODES:
        idle = metrics[mode].get("no_work", {})
        for name, why in idle.items():
            print(f"{mode}: {name} did no work: {why}", file=ctx.out)
        for name, why in metrics[mode].get("apps_stopped", {}).items():
            if name not in idle:
                print(f"{mode}: {name} stopped early: {why}", file=ctx.out)
    return 0


def _importances(plan: Any, app: Any) -> str:
    """`assistant (cached; foreground at 1.33 s)`: an app's importance at its start and the
    scenario's changes of it within the run, at their scaled times (the managed run's)."""
    changes = [
        f"{event.importance.name.lower()} at {plan.at(event.at_ms):.2f} s"
        for event in sorted(plan.scenario.events, key=lambda e: e.at_ms)
        if event.kind == "importance"
        and event.app == app.name
        and event.importance is not None
        and plan.at(event.at_ms) < plan.seconds
    ]
    return f"{app.name} ({'; '.join([app.importance.name.lower(), *changes])})"


def _overtime(min_jobs: int) -> str:
    """What `--min-jobs` adds to the header: the runs may last longer."""
    if not min_jobs:
        return ""
    return f" (longer where an app had not finished {min_jobs} inference{'s' * (min_jobs > 1)})"


def _run(
    ctx: Context, scenario: Scenario, modes: Sequence[str]
) -> dict[str, tuple[RunResult, Any]]:
    """Each mode's result and, with --trace, its Perfetto sink."""
    from npumanager.telemetry.perfetto import PIDS_PER_SINK, PerfettoSink

    registry = ctx.registry
    names = {app.uid: app.name for app in scenario.apps}
    bar = ProgressBar(scenario.duration_ms * len(modes), ctx.err)
    show = ctx.args.progress == "always" or (ctx.args.progress == "auto" and ctx.err.isatty())
    results: dict[str, tuple[RunResult, Any]] = {}
    try:
        for index, mode in enumerate(modes):
            sink = None
            if ctx.args.trace is not None:
                sink = PerfettoSink(label=mode, pid_base=index * PIDS_PER_SINK, names=names)
            run = run_direct if mode == "direct" else run_managed
            progress = bar.stage(mode, index * scenario.duration_ms) if show else None
            sinks = [sink] if sink is not None else []
            result = run(scenario, ctx.args.driver, registry, sinks=sinks, progress=progress)
            results[mode] = (result, sink)
    finally:
        bar.finish()
    return results


@contextlib.contextmanager
def _blamed(origin: str) -> Iterator[None]:
    """An error while a scenario runs is one line starting with its file (`s.toml: app ...`)."""
    try:
        yield
    except NpuManagerError as exc:
        raise ConfigError(f"{origin}: {exc}") from None


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """A failed write of `path` (a full disk) is one line naming the file."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be written: {exc.strerror}") from None


def _reported(result: RunResult, roles: set[str]) -> dict[str, Any]:
    """A run's metrics without the figures of roles no app plays (no camera: no camera zeros)."""
    metrics = result.metrics.as_dict()
    absent = {role for role in ROLE_PREFIXED if role not in roles}
    return {k: v for k, v in metrics.items() if k.split("_", 1)[0] not in absent}


def _check_writable(path: Path) -> None:
    """A one-line error now, before the runs, if `path` cannot be written."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; give a file name")
    if not folder.is_dir():
        raise ConfigError(f"{path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"{path}: folder {folder} is not writable")


def _cell(key: str, value: Any) -> str:
    if key.endswith("_bytes"):
        return f"{value / (1 << 30):.2f}"
    if isinstance(value, dict):
        return ", ".join(f"{k.lower()} {v}" for k, v in value.items() if v) or "none"
    return str(value)
