"""`npu-manager health`: what the machine's health sources read now, and the severities and
memory level they map to; `--watch` prints every new reading until interrupted. Also the
`NAME[:KEY=VALUE,...]` spelling of a source that `serve --health` shares."""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from npumanager.cli.tables import format_table
from npumanager.core.plugins.health import (
    HealthBoard,
    HealthSource,
    SourceState,
    build_health_source,
)
from npumanager.core.service.health_monitor import HealthMonitor, describe_problem, read_once
from npumanager.errors import NpuManagerError
from npumanager.schemas import HealthSample

DEFAULT_SOURCE = "linux"
_LEVELS = ("none", "moderate", "critical")


def parse_source(flag: str, spec: str) -> tuple[str, dict[str, Any]]:
    """`NAME[:KEY=VALUE,...]` as a source name and its options (whole numbers become ints)."""
    name, _, rest = spec.partition(":")
    if not name:
        raise NpuManagerError(f"{flag} {spec!r}: name a health source first, e.g. linux:root=/")
    options: dict[str, Any] = {}
    for item in rest.split(",") if rest else ():
        match = _OPTION.fullmatch(item)
        if match is None:
            raise NpuManagerError(
                f"{flag} {spec!r}: options are KEY=VALUE separated by commas; got {item!r}"
            )
        key, value = match.groups()
        if key in options:
            raise NpuManagerError(f"{flag} {spec!r}: option {key!r} given twice")
        options[key] = int(value) if _WHOLE.fullmatch(value) else value
    return name, options


_OPTION = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")
_WHOLE = re.compile(r"-?[0-9]+")


def add_health(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Add `health` and its options to the CLI's parser."""
    health = add("health", cmd_health, "show what the machine's health sources read now")
    health.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="NAME[:KEY=VALUE,...]",
        help=f"a health source and its options (repeatable; default: {DEFAULT_SOURCE})",
    )
    health.add_argument("--json", action="store_true", help="print JSON instead of text")
    health.add_argument(
        "--watch", action="store_true", help="print every new reading until interrupted"
    )


def _devices(samples: list[HealthSample | None]) -> list[int]:
    found = {0}
    for sample in samples:
        if sample is not None:
            found |= {t.device for t in sample.thermal if t.device is not None}
            found |= {d.device for d in sample.devices}
    return sorted(found)


def document(board: HealthBoard) -> dict[str, Any]:
    """The readings of every source and what they combine to, as JSON-ready data."""
    return board.describe(_devices([s.sample for s in board.sources]))


def render(doc: dict[str, Any]) -> str:
    """The `health` document as text: each source's readings, then the combination."""
    lines: list[str] = []
    for source in doc["sources"]:
        lines.append(f"source {source['name']}:")
        if source["error"]:
            lines.append(f"  error: {source['error']}")
        for m in source.get("memory", []):
            shares = ", ".join(
                f"{key} avg10 {m[key + '_avg10']:.2f}%"
                for key in ("some", "full")
                if m[key + "_avg10"] is not None
            )
            armed = f", {m['triggers']} trigger(s) armed" if m["triggers"] else ", no triggers"
            fired = ", a trigger fired" if m["trigger"] else ""
            lines.append(
                f"  memory {m['name']}: {_LEVELS[m['level']]} ({m['level']})"
                f"{'; ' + shares if shares else ''}{armed}{fired}"
            )
        zones = [
            [
                t["name"],
                "all" if t["device"] is None else str(t["device"]),
                "-" if t["temperature_mc"] is None else f"{t['temperature_mc'] / 1000:.1f}",
                t["severity"],
            ]
            for t in source.get("thermal", [])
        ]
        if zones:
            table = format_table(zones, ["ZONE", "DEVICE", "TEMP C", "SEVERITY"])
            lines.extend("  " + row for row in table.splitlines())
        devices = [
            [str(d["device"]), d["name"]] + ["-" if d[k] is None else str(d[k]) for k in _COUNTERS]
            for d in source.get("devices", [])
        ]
        if devices:
            headers = ["DEVICE", "NAME", "BUSY US", "MEMORY B", "MHZ", "MAX MHZ"]
            lines.extend("  " + row for row in format_table(devices, headers).splitlines())
        if not (source["error"] or source.get("memory") or zones or devices):
            lines.append("  nothing readable")
    level = doc["memory_pressure"]
    lines.append(f"memory pressure: {_LEVELS[level]} ({level}); thermal: {_thermal(doc)}")
    return "\n".join(lines)


def _thermal(doc: dict[str, Any]) -> str:
    """Each device's combined severity; `unknown` where no source read a temperature."""
    severities = doc["severity"]
    if all(s is None for s in severities.values()):
        return "unknown (no source reads a temperature)"
    return ", ".join(f"device {d}: {s or 'unknown'}" for d, s in severities.items())


_COUNTERS = ("busy_time_us", "memory_used_bytes", "frequency_mhz", "max_frequency_mhz")


def _show(ctx: Any, board: HealthBoard, out: TextIO) -> None:
    doc = document(board)
    if ctx.args.json:
        out.write(json.dumps(doc, indent=None if ctx.args.watch else 2) + "\n")
    else:
        out.write(render(doc) + ("\n\n" if ctx.args.watch else "\n"))
    out.flush()


def cmd_health(ctx: Any) -> int:
    """Read every source once (or on, with --watch) and print the readings and severities."""
    specs = [parse_source("--source", s) for s in ctx.args.source] or [(DEFAULT_SOURCE, {})]
    built: list[tuple[SourceState, HealthSource]] = []
    board = HealthBoard()
    try:
        for spec in specs:
            name, source = build_health_source(ctx.registry, spec)
            built.append((board.add(name), source))
        if ctx.args.watch:
            return _watch(ctx, board, built)
        for state, source in built:
            try:
                state.sample = read_once(source)
            except Exception as exc:
                state.error = describe_problem(exc)
            state.read_at_ms = _now_ms()
        _show(ctx, board, ctx.out)
        return 1 if any(state.error for state, _ in built) else 0
    finally:
        if not ctx.args.watch:
            for _, source in built:
                close = getattr(source, "close", None)
                if callable(close):
                    close()


def _now_ms() -> int:
    """When a reading was taken: the monotonic clock in milliseconds, as a real-time
    service stamps its own (`read_at_ms` in `info`)."""
    return time.monotonic_ns() // 1_000_000


def _watch(ctx: Any, board: HealthBoard, built: list[tuple[SourceState, HealthSource]]) -> int:
    lock = threading.Lock()

    def deliver(state: SourceState, sample: HealthSample | None, error: str | None) -> None:
        with lock:
            state.sample, state.error, state.read_at_ms = sample, error, _now_ms()
            if all(s.sample is not None or s.error for s, _ in built):
                _show(ctx, board, ctx.out)

    monitor = HealthMonitor(deliver)
    for state, source in built:
        monitor.add(state, source)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        monitor.stop()
    return 0


__all__ = ["DEFAULT_SOURCE", "add_health", "cmd_health", "parse_source"]
