"""`npu-manager run [OPTIONS] -- COMMAND ARGS...`: run an unmodified program so that its
ONNX Runtime sessions and OpenVINO compiled models go through the manager."""

from __future__ import annotations

import argparse
from pathlib import Path

from npumanager.cli.options import Add, CommandContext
from npumanager.run import exec_program
from npumanager.run._boot.npumanager_run_boot import RUNTIMES
from npumanager.run.settings import NO_DAEMON_CHOICES, PRIORITIES, UNMANAGED, Settings
from npumanager.schemas import ModelPriority
from npumanager.schemas.limits import RUN_GRANT_TIMEOUT_S


def register(add: Add) -> None:
    """Add the `run` verb to the CLI's parser."""
    run = add(
        "run",
        cmd_run,
        "run a program so that its ONNX Runtime and OpenVINO models go through the manager",
    )
    run.add_argument(
        "--driver-hint",
        action="append",
        choices=RUNTIMES,
        metavar="RUNTIME",
        help=f"manage only this runtime's sessions ({', '.join(RUNTIMES)}; repeatable; "
        "default: both)",
    )
    run.add_argument(
        "--socket",
        type=Path,
        metavar="PATH",
        help="the daemon's socket (default: $NPUMANAGER_SOCKET, else the per-user one)",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=RUN_GRANT_TIMEOUT_S,
        metavar="S",
        help=f"how long a model's load waits for the manager's grant (default "
        f"{RUN_GRANT_TIMEOUT_S:g} s); then the session's creation fails",
    )
    run.add_argument(
        "--priority",
        choices=list(PRIORITIES),
        default=ModelPriority.NORMAL.name.lower(),
        help="the intended priority of the program's model loads (default: normal)",
    )
    run.add_argument(
        "--no-daemon",
        choices=NO_DAEMON_CHOICES,
        default=UNMANAGED,
        help="when no daemon answers: run the models in the program's process, unmanaged, "
        "with one warning line (default), or refuse them with the runtime's error",
    )
    run.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS", help="the program to run"
    )


def cmd_run(ctx: CommandContext) -> int:
    """Exec the command under the manager (never returns unless the exec fails)."""
    args = ctx.args
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    settings = Settings(
        socket=None if args.socket is None else args.socket.absolute(),
        timeout_s=args.timeout,
        priority=PRIORITIES[args.priority],
        runtimes=tuple(dict.fromkeys(args.driver_hint or RUNTIMES)),
        no_daemon=args.no_daemon,
    )
    exec_program(command, settings)
