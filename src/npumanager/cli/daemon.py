"""The daemon's command-line verbs against a running daemon: `info`, `set-policy`, `set-importance`,
`set-access` against a running daemon (after the platform's shell commands)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from npumanager.cli.apps import add_apps
from npumanager.cli.options import (
    Add,
    CommandContext,
    budget_options,
    check_uid,
    client,
    json_option,
    policy_params,
    verb_options,
)
from npumanager.cli.serve import add_serve
from npumanager.cli.tables import format_table
from npumanager.cli.units import add_units
from npumanager.errors import NpuManagerError
from npumanager.schemas import Importance
from npumanager.schemas.limits import (
    DEFAULT_INFO_LIMIT,
    INT32_MAX,
    MAX_INFO_LIMIT,
    MAX_PRIORITY,
    MIN_PRIORITY,
)


def register(add: Add) -> None:
    """Add the daemon's subcommands to the CLI's parser."""
    add_serve(add)
    add_units(add)
    add_apps(add)

    info = add("info", cmd_info, "show a running daemon's policy, priorities, requests, devices")
    info.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_INFO_LIMIT,
        metavar="N",
        help=f"list at most N entries of each list (0..{MAX_INFO_LIMIT}; default "
        f"{DEFAULT_INFO_LIMIT}); counts are always whole",
    )
    info.add_argument(
        "--offset", type=int, default=0, metavar="K", help="skip the first K entries of each list"
    )
    verb_options(info)
    json_option(info)

    policy = add("set-policy", cmd_set_policy, "swap a running daemon's model-loading policy")
    policy.add_argument(
        "policy",
        metavar="POLICY",
        help="status_quo, turn_taking, budget, pressure, or another installed one (npu-manager "
        "plugins lists them; a - for a _ is accepted too)",
    )
    budget_options(policy)
    verb_options(policy)
    json_option(policy)

    importance = add(
        "set-importance",
        cmd_set_importance,
        "pin the importance of an app, or of every app of a uid, above the importance sources",
    )
    importance.add_argument(
        "target", metavar="UID|APP_ID", help="a uid (a number) or an app id (camera.service)"
    )
    importance.add_argument(
        "importance",
        metavar="IMPORTANCE",
        help=f"{', '.join(i.name for i in Importance)}, a number {MIN_PRIORITY}..{MAX_PRIORITY}, "
        "or auto (take the pin away)",
    )
    verb_options(importance)
    json_option(importance)

    access = add("set-access", cmd_set_access, "allow or deny a uid direct access or attribution")
    access.add_argument("uid", type=int, metavar="UID")
    access.add_argument(
        "--direct-access",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the uid's work may run at all",
    )
    access.add_argument(
        "--attribute-other-uid",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the uid may attribute work to another uid",
    )
    verb_options(access)
    json_option(access)


# Verbs against a running daemon -----------------------------------------------------------


def cmd_info(ctx: CommandContext) -> int:
    """Print the daemon's state."""
    args = ctx.args
    if not 0 <= args.limit <= MAX_INFO_LIMIT:
        raise NpuManagerError(f"--limit must be 0..{MAX_INFO_LIMIT}; got {args.limit}")
    if not 0 <= args.offset <= INT32_MAX:
        raise NpuManagerError(f"--offset must be 0 or more; got {args.offset}")
    with client(args) as daemon:
        document = daemon.info(offset=args.offset, limit=args.limit)
    if ctx.args.json:
        json.dump(document, ctx.out, indent=2)
        ctx.out.write("\n")
        return 0
    print(render_info(document), file=ctx.out)
    return 0


def render_info(document: dict[str, Any]) -> str:
    """The `info` document as text: a header, then one table per section."""
    daemon = document["daemon"]
    policy = document["policy"]
    params = ", ".join(f"{k}={v}" for k, v in policy["params"].items())
    lines = [
        f"daemon pid {daemon['pid']} on {daemon['socket']}, up {daemon['uptime_s']:g} s, "
        f"{len(document['clients'])} client(s), protocol {daemon['protocol_version']}",
        f"policy: {policy['name']}" + (f" ({params})" if params else ""),
        "",
        "priorities:",
        format_table(
            [
                [
                    str(c["uid"]),
                    str(c["priority"]),
                    c.get("importance") or "-",
                    f"{c['min_priority']}..{c['max_priority']}",
                    _yes(c["has_direct_access"]),
                    _yes(c["can_attribute_other_uid"]),
                ]
                for c in document["priorities"]
            ],
            ["UID", "PRIORITY", "IMPORTANCE", "JOB RANGE", "DIRECT", "ATTRIBUTE"],
        ),
        "",
        "requests:",
    ]
    rows = [
        [
            state,
            str(r["client"]),
            str(r["uid"]),
            str(r["id"]),
            r["size"],
            r["priority"],
            str(r["weight"]),
            "-" if r["device"] is None else str(r["device"]),
        ]
        for state, requests in document["requests"].items()
        for r in requests
    ]
    headers = ["STATE", "CLIENT", "UID", "ID", "SIZE", "PRIORITY", "WEIGHT", "DEVICE"]
    lines.append(format_table(rows, headers) if rows else "(none)")
    lines.extend(_paging_note(document, len(rows)))
    lines += ["", "devices:"]
    lines.append(
        format_table(
            [
                [
                    str(d["device"]),
                    f"{d['weight_memory_used_bytes'] / (1 << 30):.2f}/"
                    f"{d['weight_memory_bytes'] / (1 << 30):.2f}"
                    + _outside(d.get("weight_memory_outside_bytes", 0)),
                    str(d["models_loaded"]),
                    f"{d['running']}/{d['channels']}",
                    str(d["queue_depth"]),
                    f"{d['temperature_c']:.1f}",
                    d["severity"],
                ]
                for d in document["devices"]
            ],
            ["DEVICE", "MEMORY GiB", "MODELS", "BUSY", "QUEUED", "TEMP C", "THERMAL"],
        )
    )
    health = _health_rows(document.get("health") or {})
    if health:
        lines += ["", "health:"]
        lines.append(format_table(health, ["SOURCE", "READING", "NAME", "VALUE", "LEVEL"]))
    sinks = document.get("sinks", {})
    if sinks:
        lines += ["", "sinks:"]
        rows = [
            [name, str(st["delivered"]), str(st["dropped"]), str(st["failed"]), str(st["queued"])]
            for name, st in sinks.items()
        ]
        lines.append(format_table(rows, ["SINK", "DELIVERED", "DROPPED", "FAILED", "QUEUED"]))
    return "\n".join(lines)


def _health_rows(health: dict[str, Any]) -> list[list[str]]:
    """One row per reading of each health source: what it read and what that maps to."""
    rows = []
    for source in health.get("sources", []):
        name = source["name"]
        if source.get("error"):
            rows.append([name, "error", "-", source["error"], "-"])
        for memory in source.get("memory", []):
            value = (
                "-" if memory.get("some_avg10") is None else f"some avg10 {memory['some_avg10']}%"
            )
            rows.append([name, "memory", memory["name"], value, str(memory["level"])])
        for zone in source.get("thermal", []):
            temp = zone.get("temperature_mc")
            value = "-" if temp is None else f"{temp / 1000:.1f} C"
            rows.append([name, "thermal", zone["name"], value, str(zone["severity"])])
        for device in source.get("devices", []):
            now, top = device.get("frequency_mhz"), device.get("max_frequency_mhz")
            value = "-" if now is None else f"{now}/{top if top is not None else '?'} MHz"
            rows.append([name, "device", device["name"], value, "-"])
    return rows


def _paging_note(document: dict[str, Any], shown: int) -> list[str]:
    """A line saying how many requests there are in all, when the list shows fewer."""
    counts: dict[str, int] = document.get("request_counts", {})
    total = sum(counts.values())
    if total <= shown:
        return []
    by_state = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    page = document.get("page", {})
    scope = "" if page.get("scope") != "own" else " (this uid's are listed)"
    return [
        f"{total} live requests in all: {by_state}{scope}; "
        "--limit N and --offset K page through them"
    ]


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def cmd_set_policy(ctx: CommandContext) -> int:
    """Swap the policy of a running daemon."""
    args = ctx.args
    params = policy_params(args.policy, args)
    with client(args) as daemon:
        name = daemon.set_policy(args.policy, params)
    return _done(ctx, {"policy": name, "params": params or {}}, f"policy is now {name}")


def cmd_set_importance(ctx: CommandContext) -> int:
    """Pin (or unpin) the importance of an app or of a uid's apps on a running daemon."""
    args = ctx.args
    target: str = args.target
    uid = check_uid(int(target)) if target.lstrip("-").isdigit() else None
    if uid is None and not 0 < len(target) <= 512:
        raise NpuManagerError(f"an app id is 1..512 characters; got {len(target)}")
    importance = None if args.importance == "auto" else parse_importance(args.importance)
    with client(args) as daemon:
        if uid is not None:
            daemon.set_uid_importance(uid, importance)
        else:
            daemon.set_app_importance(target, importance)
    who = f"uid {uid}" if uid is not None else f"app {target}"
    document: dict[str, Any] = {"uid": uid, "app_id": None if uid is not None else target}
    if importance is None:
        document.update(importance=None, name=None)
        return _done(ctx, document, f"{who} is no longer pinned: its importance sources rank it")
    name = importance_name(importance)
    document.update(importance=importance, name=name)
    shown = f"{name} ({importance})" if name else str(importance)
    return _done(ctx, document, f"{who} importance is now {shown}")


def cmd_set_access(ctx: CommandContext) -> int:
    """Override a uid's direct access or attribution on a running daemon."""
    args = ctx.args
    check_uid(args.uid)
    if args.direct_access is None and args.attribute_other_uid is None:
        raise NpuManagerError(
            "say what to change: --direct-access/--no-direct-access or "
            "--attribute-other-uid/--no-attribute-other-uid"
        )
    with client(args) as daemon:
        daemon.set_uid_access(
            args.uid,
            has_direct_access=args.direct_access,
            can_attribute_other_uid=args.attribute_other_uid,
        )
    changes = {
        k: v
        for k, v in (
            ("has_direct_access", args.direct_access),
            ("can_attribute_other_uid", args.attribute_other_uid),
        )
        if v is not None
    }
    text = ", ".join(f"{k} {_yes(v)}" for k, v in changes.items())
    return _done(ctx, {"uid": args.uid, **changes}, f"uid {args.uid}: {text}")


def importance_name(value: int) -> str | None:
    """The platform's name of an importance value, if it has one."""
    try:
        return Importance(value).name
    except ValueError:
        return None


def parse_importance(text: str) -> int:
    """An importance by name (case-insensitive) or number; a one-line error otherwise."""
    if text.lstrip("-").isdigit():
        value = int(text)
        if MIN_PRIORITY <= value <= MAX_PRIORITY:
            return value
    else:
        member = Importance.__members__.get(text.upper().replace("-", "_"))
        if member is not None:
            return int(member)
    names = ", ".join(i.name for i in Importance)
    raise NpuManagerError(
        f"importance must be one of {names} or a number {MIN_PRIORITY}..{MAX_PRIORITY}; "
        f"got {text!r}"
    )


def _done(ctx: CommandContext, document: dict[str, Any], text: str) -> int:
    if ctx.args.json:
        json.dump(document, ctx.out, indent=2)
        ctx.out.write("\n")
    else:
        print(text, file=ctx.out)
    return 0


def _outside(held: int) -> str:
    """What processes outside the manager hold on a device, where counted and not 0."""
    return f" ({held / (1 << 30):.2f} outside)" if held else ""
