"""The timeline picture of one or more runs (extra `plot`: matplotlib, Agg backend).

Per run, top to bottom: the channels over time, each stretch of execution coloured by its
app (a colour chosen from the app's name, so the same app looks the same in every run and
scenario, never the red or blue of the curves), with unload requests (a mark for each
reason), loads that did not fit (direct) and camera deadline misses marked, and a legend
of the marks above; below it the
temperature and the weight memory in use against the labelled capacity, throttled
stretches shaded. PNG, JPEG, SVG or PDF, by the file's suffix.
"""

from __future__ import annotations

import importlib.util
import zlib
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from npumanager.errors import NpuManagerError
from npumanager.simulation.runner import MS_US, RunResult
from npumanager.simulation.scenario import Scenario
from npumanager.telemetry.slices import SliceBuilder

PLOT_EXTRA_HINT = "pip install 'npu-manager[plot]'"
_GIB = 1 << 30
_TITLES = {"direct": "direct: every app on the driver, no arbiter", "managed": "managed"}
FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".svg": "svg", ".pdf": "pdf"}
"""The picture formats `--plot` writes, by file suffix."""
_APP_PALETTE = tuple(index for index in range(20) if index not in (0, 1, 6, 7))
"""tab20 without its blues and reds, which the memory and temperature curves use."""


class MissingExtraError(NpuManagerError):
    """Drawing needs matplotlib, which the `plot` extra installs."""


def require_matplotlib() -> None:
    """Raise `MissingExtraError` (one line naming the extra) unless matplotlib is importable."""
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtraError(f"--plot needs the 'plot' extra (matplotlib): {PLOT_EXTRA_HINT}")


def picture_format(path: str | Path) -> str:
    """The format a picture at `path` is written in, or a one-line error naming the suffixes."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        allowed = ", ".join(FORMATS)
        raise NpuManagerError(f"--plot {path}: write a picture ending in {allowed}")
    return FORMATS[suffix]


def draw_timeline(results: Sequence[RunResult], scenario: Scenario, path: str | Path) -> None:
    """Draw every run of `results`, one above the other, into a picture at `path`."""
    figure = build_figure(results, scenario)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, format=picture_format(target))


def build_figure(results: Sequence[RunResult], scenario: Scenario) -> Any:
    """The matplotlib figure of every run of `results`, one above the other."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 4.2 * len(results)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2 * len(results), 1, height_ratios=[3, 2] * len(results))
    colours = _colours(scenario)
    names = {app.uid: app.name for app in scenario.apps}
    first: Any = None
    for index, result in enumerate(results):
        lanes = figure.add_subplot(grid[2 * index], sharex=first)
        first = first or lanes
        health = figure.add_subplot(grid[2 * index + 1], sharex=first)
        title = _TITLES.get(result.mode, result.mode)
        if result.mode == "managed":
            title = f"managed: the {scenario.policy!r} policy arbitrates"
        lanes.set_title(f"{scenario.name}, {title}", loc="left", fontsize=11)
        _draw_lanes(lanes, result, scenario, colours, names)
        _draw_health(health, result)
    first.set_xlim(0, scenario.duration_ms)
    handles = [_patch(colour, name) for name, colour in colours.items()]
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles) + 2)
    return figure


def app_colour_index(name: str, taken: Collection[int] = ()) -> int:
    """The tab20 colour of an app: from a hash of its name, the next free one on a clash."""
    start = zlib.crc32(name.encode()) % len(_APP_PALETTE)
    for step in range(len(_APP_PALETTE)):
        index = _APP_PALETTE[(start + step) % len(_APP_PALETTE)]
        if index not in taken:
            return index
    return _APP_PALETTE[start]


def _colours(scenario: Scenario) -> dict[str, Any]:
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    taken: set[int] = set()
    chosen = {}
    for name in sorted(app.name for app in scenario.apps):
        index = app_colour_index(name, taken)
        taken.add(index)
        chosen[name] = index
    return {app.name: palette(chosen[app.name]) for app in scenario.apps}


def _patch(colour: Any, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, label=label)


def _draw_lanes(
    ax: Any,
    result: RunResult,
    scenario: Scenario,
    colours: dict[str, Any],
    names: dict[int, str],
) -> None:
    channels = [device.channels for device in scenario.devices]
    offsets = [sum(channels[:n]) for n in range(len(channels))]
    bars: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for piece in SliceBuilder().feed_all(result.events):
        row = offsets[piece.device] + piece.lane
        name = names.get(piece.start.uid, f"uid {piece.start.uid}")
        bars[name, row].append((piece.start.time_us / MS_US, piece.duration_us / MS_US))
    for (name, row), spans in bars.items():
        colour = colours.get(name, "grey")
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colour, edgecolors="none")
    rows = sum(channels)
    labels = [
        f"npu{device} ch{lane}" if len(channels) > 1 else f"ch {lane}"
        for device, count in enumerate(channels)
        for lane in range(count)
    ]
    ax.set_yticks(range(rows), labels)
    ax.set_ylim(rows - 0.4, -1.4)
    reasons = sorted({reason for _, _, reason in result.unloads})
    marker = {reason: _REASON_MARKERS[i % len(_REASON_MARKERS)] for i, reason in enumerate(reasons)}
    for t_ms, app, reason in result.unloads:
        ax.axvline(t_ms, color=colours.get(app, "black"), linestyle="--", linewidth=1)
        ax.plot([t_ms], [-0.9], marker=marker[reason], color=colours.get(app, "black"),
                markersize=8, linestyle="none")  # fmt: skip
    missed = [t_ms for t_ms, _ in result.deadline_misses]
    if missed:
        ax.plot(missed, [-1.2] * len(missed), "|", color="black", markersize=6)
    for t_ms, app in result.load_failures:
        ax.plot([t_ms], [-0.9], marker="x", color=colours.get(app, "red"), markersize=8)
    # What the marks mean, each once in a legend above the lanes: a label per mark at its
    # time would overlap its neighbours wherever unloads come close together.
    keys = [
        _mark(marker[reason], f"unload asked: {reason.lower()} ({count})")
        for reason, count in Counter(reason for _, _, reason in result.unloads).most_common()
    ]
    if missed:
        misses = result.metrics.camera_deadline_misses
        keys.append(_mark("|", f"a camera deadline missed ({misses})"))
    if result.load_failures:
        failures = len(result.load_failures)
        keys.append(_mark("x", f"a load did not fit, the LMK would strike ({failures})"))
    if keys:
        ax.legend(handles=keys, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=len(keys),
                  fontsize=8, frameon=False, borderaxespad=0.2, handletextpad=0.3,
                  columnspacing=1.2)  # fmt: skip
    ax.tick_params(labelbottom=False)


_REASON_MARKERS = ("v", "D", "s", "P", "*", "^", "p", "h")
"""The mark of each unload reason on the lanes (coloured by the app asked)."""


def _mark(symbol: str, label: str) -> Any:
    """A legend key: `symbol` in black, then `label`."""
    from matplotlib.lines import Line2D

    return Line2D([], [], marker=symbol, color="black", linestyle="none", label=label)


def throttled_stretches(result: RunResult) -> list[tuple[int, int]]:
    """(start ms, end ms) of every stretch with the device's thermal severity above NONE."""
    stretches: list[tuple[int, int]] = []
    start: int | None = None
    for sample in result.samples:
        if sample.severity > 0 and start is None:
            start = sample.t_ms
        elif sample.severity == 0 and start is not None:
            stretches.append((start, sample.t_ms))
            start = None
    if start is not None:
        stretches.append((start, result.samples[-1].t_ms + 1))
    return stretches


def _draw_health(ax: Any, result: RunResult) -> None:
    times = [sample.t_ms for sample in result.samples]
    temperature = [sample.temperature_mc / 1000 for sample in result.samples]
    memory = [sample.weight_memory_used_bytes / _GIB for sample in result.samples]
    ax.plot(times, temperature, color="tab:red", linewidth=1.2, label="temperature (C)")
    for start, end in throttled_stretches(result):
        ax.axvspan(start, end, color="tab:orange", alpha=0.15, linewidth=0)
    if result.metrics.throttled_ms:
        ax.text(0.0, 1.02, "shaded: throttled", transform=ax.transAxes, fontsize=8)
    ax.set_ylabel("temperature (C)", color="tab:red")
    memory_ax = ax.twinx()
    memory_ax.plot(times, memory, color="tab:blue", linewidth=1.2, label="weight memory (GiB)")
    capacity = result.metrics.weight_memory_capacity_bytes / _GIB
    memory_ax.axhline(capacity, color="tab:blue", linestyle=":", linewidth=1)
    memory_ax.annotate(f"capacity {capacity:.2f} GiB", (0, capacity), xytext=(2, 2),
                       textcoords="offset points", fontsize=8, color="tab:blue")  # fmt: skip
    memory_ax.set_ylim(0, capacity * 1.15)
    memory_ax.set_ylabel("weight memory (GiB)", color="tab:blue")
    ax.set_xlabel("virtual time (ms)")
