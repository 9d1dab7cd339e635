"""The daemon's command-line verbs: `serve`, and `info`, `set-policy`, `set-importance`,
`set-access` against a running daemon (after the platform's shell commands)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TextIO

from npumanager.errors import NpuManagerError
from npumanager.schemas import Importance
from npumanager.schemas.limits import DEFAULT_UNLOAD_GRACE_MS, MAX_PRIORITY, MIN_PRIORITY
from npumanager.tables import format_table

log = logging.getLogger("npumanager.daemon")

_LOG_FORMAT = "%(asctime)s npu-manager[%(process)d] %(levelname)s %(name)s: %(message)s"


class CommandContext(Protocol):
    """What the CLI hands every command."""

    args: argparse.Namespace
    out: TextIO
    err: TextIO

    @property
    def registry(self) -> Any: ...


Add = Callable[[str, Callable[[Any], int], str], argparse.ArgumentParser]


def register(add: Add) -> None:
    """Add the daemon's subcommands to the CLI's parser."""
    serve = add("serve", cmd_serve, "run the arbiter as a daemon on a Unix socket (foreground)")
    _socket_option(serve)
    serve.add_argument("--driver", default="vnpu", help="the driver to serve (default: vnpu)")
    serve.add_argument(
        "--policy", default="status_quo", help="the model-loading policy (default: status_quo)"
    )
    _budget_options(serve)
    serve.add_argument(
        "--devices", type=int, default=1, metavar="N", help="devices of a simulated driver"
    )
    serve.add_argument(
        "--socket-group",
        metavar="GROUP",
        help="group that owns the socket; its members may connect (mode 0660)",
    )
    serve.add_argument(
        "--management-group",
        metavar="GROUP",
        help="group whose members may set the policy, importances and access, as root may",
    )
    serve.add_argument(
        "--attribution-uid",
        type=int,
        action="append",
        default=[],
        metavar="UID",
        help="a uid allowed to attribute work to other uids (repeatable)",
    )
    serve.add_argument(
        "--unload-grace-ms",
        type=int,
        default=DEFAULT_UNLOAD_GRACE_MS,
        metavar="MS",
        help=f"how long a client asked to unload may take (default {DEFAULT_UNLOAD_GRACE_MS})",
    )
    serve.add_argument(
        "--sink",
        action="append",
        default=[],
        metavar="NAME[:KEY=VALUE,...]",
        help="send telemetry to a sink, e.g. prometheus:port=9464 or "
        "jsonl:path=/var/log/npu.jsonl,debounce_duration_ms=50 (repeatable)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="what the daemon logs to stderr (default: info)",
    )

    info = add("info", cmd_info, "show a running daemon's policy, priorities, requests, devices")
    _socket_option(info)
    _json_option(info)

    policy = add("set-policy", cmd_set_policy, "swap a running daemon's model-loading policy")
    policy.add_argument(
        "policy", metavar="POLICY", help="status-quo, turn-taking, budget, or another installed one"
    )
    _budget_options(policy)
    _socket_option(policy)
    _json_option(policy)

    importance = add("set-importance", cmd_set_importance, "set the importance of a uid")
    importance.add_argument("uid", type=int, metavar="UID")
    importance.add_argument(
        "importance",
        metavar="IMPORTANCE",
        help=f"{', '.join(i.name for i in Importance)}, or a number {MIN_PRIORITY}..{MAX_PRIORITY}",
    )
    _socket_option(importance)
    _json_option(importance)

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
    _socket_option(access)
    _json_option(access)


def _socket_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket",
        type=Path,
        metavar="PATH",
        help="the daemon's socket (default: $NPUMANAGER_SOCKET or the per-user runtime socket)",
    )


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _budget_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-budget", type=int, metavar="N", help="budget policy: the total weight admitted"
    )
    parser.add_argument(
        "--weights",
        metavar="W1,W2,W4",
        help="budget policy: the weight of each size class, smallest first (e.g. 1,2,4)",
    )


def _policy_params(policy: str, args: argparse.Namespace) -> dict[str, Any] | None:
    params: dict[str, Any] = {}
    if args.max_budget is not None:
        params["max_budget"] = args.max_budget
    if args.weights is not None:
        try:
            params["weights"] = [int(w) for w in args.weights.split(",")]
        except ValueError:
            raise NpuManagerError(
                f"--weights must be comma-separated ints, e.g. 1,2,4; got {args.weights!r}"
            ) from None
    if params and policy.replace("-", "_") != "budget":
        raise NpuManagerError(
            f"--max-budget and --weights apply to the budget policy only, not {policy!r}"
        )
    return params or None


def parse_sink(spec: str) -> tuple[str, dict[str, Any]]:
    """`NAME[:KEY=VALUE,...]` as the sink name and its options (digits become ints)."""
    name, _, rest = spec.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise NpuManagerError(
                f"--sink {spec!r}: options are KEY=VALUE separated by commas; got {item!r}"
            )
        options[key] = int(value) if value.lstrip("-").isdigit() else value
    if not name:
        raise NpuManagerError(f"--sink {spec!r}: name a sink first, e.g. prometheus:port=9464")
    return name, options


def _client(args: argparse.Namespace) -> Any:
    from npumanager.daemon.client import DaemonClient

    return DaemonClient(args.socket)


# serve ----------------------------------------------------------------------------------


def cmd_serve(ctx: CommandContext) -> int:
    """Serve one arbiter on the socket until SIGTERM or SIGINT."""
    from npumanager.core.service import Service
    from npumanager.daemon.peer import default_socket_path, group_id
    from npumanager.daemon.server import Daemon

    args = ctx.args
    logging.basicConfig(stream=ctx.err, level=args.log_level.upper(), format=_LOG_FORMAT)
    logging.captureWarnings(True)
    path = args.socket or default_socket_path()
    socket_group = group_id(args.socket_group) if args.socket_group else None
    management_group = group_id(args.management_group) if args.management_group else None
    service = Service(
        args.driver,
        args.policy,
        policy_params=_policy_params(args.policy, args),
        clock="real",
        devices=args.devices,
        attribution_uids=args.attribution_uid,
        unload_grace_ms=args.unload_grace_ms,
        registry=ctx.registry,
    )
    try:
        for spec in args.sink:
            name, options = parse_sink(spec)
            service.add_sink(name, **options)
    except BaseException:
        service.close()
        raise
    daemon = Daemon(service, path, socket_group=socket_group, management_group=management_group)
    try:
        daemon.bind()
    except OSError as exc:
        service.close()
        raise NpuManagerError(f"cannot serve on {path}: {exc.strerror or exc}") from None
    except BaseException:
        service.close()
        raise

    def stop(signum: int, _frame: Any) -> None:
        log.info("%s: shutting down", signal.Signals(signum).name)
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info(
        "serving on %s: driver %s, policy %s, pid %d",
        path,
        args.driver,
        service.policy_name,
        os.getpid(),
    )
    daemon.serve_forever()
    log.info("stopped; every live request was completed and %s removed", path)
    return 0


# Verbs against a running daemon -----------------------------------------------------------


def cmd_info(ctx: CommandContext) -> int:
    """Print the daemon's state."""
    with _client(ctx.args) as client:
        document = client.info()
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
                    f"{c['min_priority']}..{c['max_priority']}",
                    _yes(c["has_direct_access"]),
                    _yes(c["can_attribute_other_uid"]),
                ]
                for c in document["priorities"]
            ],
            ["UID", "PRIORITY", "JOB RANGE", "DIRECT", "ATTRIBUTE"],
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
    lines += ["", "devices:"]
    lines.append(
        format_table(
            [
                [
                    str(d["device"]),
                    f"{d['weight_memory_used_bytes'] / (1 << 30):.2f}/"
                    f"{d['weight_memory_bytes'] / (1 << 30):.2f}",
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
    sinks = document.get("sinks", {})
    if sinks:
        lines += ["", "sinks:"]
        rows = [
            [name, str(st["delivered"]), str(st["dropped"]), str(st["failed"]), str(st["queued"])]
            for name, st in sinks.items()
        ]
        lines.append(format_table(rows, ["SINK", "DELIVERED", "DROPPED", "FAILED", "QUEUED"]))
    return "\n".join(lines)


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def cmd_set_policy(ctx: CommandContext) -> int:
    """Swap the policy of a running daemon."""
    args = ctx.args
    params = _policy_params(args.policy, args)
    with _client(args) as client:
        name = client.set_policy(args.policy, params)
    return _done(ctx, {"policy": name, "params": params or {}}, f"policy is now {name}")


def cmd_set_importance(ctx: CommandContext) -> int:
    """Set one uid's importance on a running daemon."""
    args = ctx.args
    importance = parse_importance(args.importance)
    with _client(args) as client:
        client.set_uid_importance(args.uid, importance)
    return _done(
        ctx,
        {"uid": args.uid, "importance": importance},
        f"uid {args.uid} importance is now {importance}",
    )


def cmd_set_access(ctx: CommandContext) -> int:
    """Override a uid's direct access or attribution on a running daemon."""
    args = ctx.args
    if args.direct_access is None and args.attribute_other_uid is None:
        raise NpuManagerError(
            "say what to change: --direct-access/--no-direct-access or "
            "--attribute-other-uid/--no-attribute-other-uid"
        )
    with _client(args) as client:
        client.set_uid_access(
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
