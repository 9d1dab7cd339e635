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
        shown: list[dict[str, Any]] | None = None
        while True:
            apps: list[dict[str, Any]] = daemon.info(limit=MAX_INFO_LIMIT).get("apps", [])
            if apps != shown:
                _print(ctx, apps, watching=args.watch)
                shown = apps
            if not args.watch:
                return 0
            time.sleep(args.interval)


def _print(ctx: CommandContext, apps: list[dict[str, Any]], *, watching: bool) -> None:
    if ctx.args.json:
        ctx.out.write(json.dumps(apps, indent=None if watching else 2) + "\n")
    else:
        ctx.out.write(render_apps(apps) + ("\n\n" if watching else "\n"))
    ctx.out.flush()


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
            ]
            for app in apps
        ],
        ["APP ID", "UID", "HAL UID", "IMPORTANCE", "SOURCE", "PIDS", "CGROUP"],
    )
