"""`npu-manager apps`: the apps connected to a running daemon, each with its HAL uid, its
importance and what decided it (`daemon.server.importance`)."""

from __future__ import annotations

import json
import time
from typing import Any

from npumanager.cli.options import Add, CommandContext, client, json_option, verb_options
from npumanager.cli.tables import format_table
from npumanager.errors import NpuManagerError
from npumanager.schemas.limits import MAX_INFO_LIMIT

DEFAULT_WATCH_INTERVAL_S = 0.5
MAX_WATCH_INTERVAL_S = 3600.0


def add_apps(add: Add) -> None:
    """Add `apps` to the CLI's parser."""
    apps = add(
        "apps",
        cmd_apps,
        "list the apps connected to a running daemon: their uids, HAL uids and importances",
    )
    apps.add_argument(
        "--watch",
        action="store_true",
        help="print the list again whenever it changes, until interrupted",
    )
    apps.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_WATCH_INTERVAL_S,
        metavar="S",
        help=f"with --watch, ask the daemon every S seconds (default {DEFAULT_WATCH_INTERVAL_S:g})",
    )
    verb_options(apps)
    json_option(apps)


def cmd_apps(ctx: CommandContext) -> int:
    """Print the daemon's apps (management sees every uid's, others their own uid's)."""
    args = ctx.args
    if not 0 < args.interval <= MAX_WATCH_INTERVAL_S:
        raise NpuManagerError(
            f"--interval must be more than 0 and at most {MAX_WATCH_INTERVAL_S:g} s; "
            f"got {args.interval:g}"
        )
    with client(args) as daemon:
        shown: dict[str, Any] | None = None
        while True:
            document = daemon.info(limit=MAX_INFO_LIMIT)
            listed = {
                "apps": document.get("apps", []),
                "device_users": document.get("device_users", []),
            }
            if listed != shown:
                _print(ctx, listed, watching=args.watch)
                shown = listed
            if not args.watch:
                return 0
            time.sleep(args.interval)


def _print(ctx: CommandContext, listed: dict[str, Any], *, watching: bool) -> None:
    if ctx.args.json:
        ctx.out.write(json.dumps(listed, indent=None if watching else 2) + "\n")
    else:
        text = render_apps(listed["apps"])
        if listed["device_users"]:
            text += "\n\nusing the device without the manager:\n"
            text += render_device_users(listed["device_users"])
        ctx.out.write(text + ("\n\n" if watching else "\n"))
    ctx.out.flush()


def render_device_users(users: list[dict[str, Any]]) -> str:
    """Processes holding the accelerator's nodes outside the manager, one row each."""
    return format_table(
        [
            [
                u["app_id"],
                str(u["uid"]),
                str(u["pid"]),
                u["comm"],
                u["node"],
                u["driver"] or "-",
                str(u["resident_bytes"]),
            ]
            for u in users
        ],
        ["APP ID", "UID", "PID", "COMMAND", "NODE", "DRIVER", "RESIDENT BYTES"],
    )


def render_apps(apps: list[dict[str, Any]]) -> str:
    """The apps as a table, one row each."""
    if not apps:
        return "no apps connected"
    return format_table(
        [
            [
                app["app_id"],
                str(app["uid"]),
                str(app["hal_uid"]),
                app["importance"] or "-",
                app["importance_source"],
                ",".join(map(str, app["pids"])),
                app["cgroup"] or "-",
                app.get("host_ended") or "-",
            ]
            for app in apps
        ],
        ["APP ID", "UID", "HAL UID", "IMPORTANCE", "SOURCE", "PIDS", "CGROUP", "LAST HOST END"],
    )
