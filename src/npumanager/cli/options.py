"""What the daemon's commands share: the CLI context, common options, option parsing."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from npumanager.daemon.peer import socket_file
from npumanager.errors import NpuManagerError
from npumanager.schemas.limits import (
    BUDGET_SIZE_CLASSES,
    DEFAULT_CALL_TIMEOUT_S,
    INT32_MAX,
    MAX_BUDGET_VALUE,
    MAX_CALL_TIMEOUT_S,
)


class CommandContext(Protocol):
    """What the CLI hands every command."""

    args: argparse.Namespace
    out: TextIO
    err: TextIO

    @property
    def registry(self) -> Any: ...


Add = Callable[[str, Callable[[Any], int], str], argparse.ArgumentParser]


def socket_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="the daemon's socket (default: $NPUMANAGER_SOCKET, else the per-user runtime "
        "socket, else the system service's /run/npu-manager/npu.sock)",
    )


def verb_options(parser: argparse.ArgumentParser) -> None:
    """`--socket` and `--timeout`, for a verb that talks to a running daemon."""
    socket_option(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_CALL_TIMEOUT_S,
        metavar="S",
        help=f"give up on a daemon that does not answer within S seconds "
        f"(default {DEFAULT_CALL_TIMEOUT_S:g})",
    )


def json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def budget_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-budget", type=int, metavar="N", help="budget policy: the total weight admitted"
    )
    parser.add_argument(
        "--weights",
        metavar="W1,W2,W4",
        help="budget policy: the weight of each size class, smallest first (e.g. 1,2,4)",
    )


def policy_params(policy: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """The budget options as policy parameters, each checked before connecting."""
    params: dict[str, Any] = {}
    if args.max_budget is not None:
        if not 0 < args.max_budget <= MAX_BUDGET_VALUE:
            raise NpuManagerError(
                f"--max-budget must be 1..{MAX_BUDGET_VALUE}; got {args.max_budget}"
            )
        params["max_budget"] = args.max_budget
    if args.weights is not None:
        try:
            weights = [int(w) for w in args.weights.split(",")]
        except ValueError:
            weights = []
        if len(weights) != BUDGET_SIZE_CLASSES or not all(
            0 < w <= MAX_BUDGET_VALUE for w in weights
        ):
            raise NpuManagerError(
                f"--weights must be {BUDGET_SIZE_CLASSES} comma-separated ints "
                f"1..{MAX_BUDGET_VALUE}, smallest size class first, e.g. 1,2,4; "
                f"got {args.weights!r}"
            )
        params["weights"] = weights
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


def parse_driver_option(spec: str) -> tuple[str, Any]:
    """`KEY=VALUE` as a driver option: digits become ints, true/false bools, the rest text."""
    key, equals, value = spec.partition("=")
    if not equals or not key.isidentifier():
        raise NpuManagerError(
            f"--driver-option {spec!r}: give KEY=VALUE, e.g. capacity_bytes=1073741824 or "
            "device=CPU"
        )
    if value.lstrip("-").isdigit():
        return key, int(value)
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    return key, value


def client(args: argparse.Namespace) -> Any:
    """A `DaemonClient` on the verb's `--socket`, with its `--timeout`."""
    from npumanager.daemon.client.client import DaemonClient

    socket = None if args.socket is None else socket_file(args.socket, "--socket")
    timeout = getattr(args, "timeout", DEFAULT_CALL_TIMEOUT_S)
    if not 0 < timeout <= MAX_CALL_TIMEOUT_S:
        raise NpuManagerError(
            f"--timeout must be more than 0 and at most {MAX_CALL_TIMEOUT_S:g} s; got {timeout:g}"
        )
    return DaemonClient(socket, timeout_s=timeout)


def check_uid(uid: int) -> int:
    """A uid the scheduling HAL carries, or a one-line error (checked before connecting)."""
    if not 0 <= uid <= INT32_MAX:
        raise NpuManagerError(f"UID must be a uid 0..{INT32_MAX}; got {uid}")
    return uid
