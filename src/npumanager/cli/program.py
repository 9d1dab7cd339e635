"""The `npu-manager` command line.

A user's mistake (a bad config file, an unknown name) is one line on stderr and exit
code 2; only a bug in npu-manager itself produces a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from npumanager import __version__
from npumanager.cli import simulation as simulation_commands
from npumanager.cli.daemon import register as register_daemon_commands
from npumanager.cli.health import add_health
from npumanager.cli.run import register as register_run
from npumanager.cli.tables import format_table
from npumanager.core.plugins.config import LoadedConfig, load_config
from npumanager.core.plugins.registry import PluginRegistry, Registration, load_plugins
from npumanager.errors import NpuManagerError, PluginWarning
from npumanager.schemas import SCHEMA_MODELS, DriverRecord
from npumanager.schemas.limits import REAL_DEMO_SECONDS

PROG = "npu-manager"
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
"""What a shell reports for a command ended by Ctrl-C (128 + SIGINT)."""
_FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})
"""Errors of writing the output that are the machine's state, not a bug."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose mistakes are one line and a hint to --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


class _Context:
    """What every command needs: the config, lazily the plugins, and the output streams."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
        self.args = args
        self.out = out
        self.err = err
        self._loaded: LoadedConfig | None = None
        self._registry: PluginRegistry | None = None

    @property
    def loaded(self) -> LoadedConfig:
        if self._loaded is None:
            self._loaded = load_config(self.args.config)
        return self._loaded

    @property
    def registry(self) -> PluginRegistry:
        if self._registry is None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", PluginWarning)
                self._registry = load_plugins(self.loaded.config)
            for warning in caught:
                print(f"{PROG}: warning: {warning.message}", file=self.err)
        return self._registry


def _capabilities(registration: Registration) -> str:
    record = registration.record
    if isinstance(record, DriverRecord):
        return ",".join(sorted(record.capabilities)) or "-"
    return "-"


def _plugin_rows(registry: PluginRegistry) -> list[dict[str, Any]]:
    return [
        {
            "kind": str(reg.kind),
            "name": reg.name,
            "distribution": reg.source.distribution,
            "version": reg.version,
            "plugin": reg.source.name,
            "builtin": reg.source.builtin,
            "capabilities": _capabilities(reg).split(",") if _capabilities(reg) != "-" else [],
            "description": reg.record.description,
        }
        for reg in registry.registrations()
    ]


def _entry_rows(registry: PluginRegistry) -> list[dict[str, str]]:
    return [
        {
            "entry_point": e.source.name,
            "distribution": e.source.distribution,
            "version": e.source.version,
            "status": str(e.status),
            "detail": e.detail,
        }
        for e in registry.entries
    ]


def _caps(row: dict[str, Any]) -> str:
    return ",".join(row["capabilities"]) or "-"


def cmd_plugins(ctx: _Context) -> int:
    """List every registered driver, policy and sink, and every entry point with its status."""
    registry = ctx.registry
    rows = _plugin_rows(registry)
    entries = _entry_rows(registry)
    if ctx.args.json:
        problems = [
            {"plugin": p.source.name, "distribution": p.source.distribution, "message": p.message}
            for p in registry.problems
        ]
        document = {"plugins": rows, "entry_points": entries, "problems": problems}
        json.dump(document, ctx.out, indent=2)
        ctx.out.write("\n")
        return 0
    if not rows:
        print("no plugins registered", file=ctx.out)
    else:
        headers = ["KIND", "NAME", "DISTRIBUTION", "VERSION", "CAPABILITIES"]
        body = [
            [*(r[key] for key in ("kind", "name", "distribution", "version")), _caps(r)]
            for r in rows
        ]
        print(format_table(body, headers), file=ctx.out)
    if entries:
        body = [[e["entry_point"], e["distribution"], e["status"], e["detail"]] for e in entries]
        table = format_table(body, ["ENTRY POINT", "DISTRIBUTION", "STATUS", "DETAIL"])
        print(f"\n{table}", file=ctx.out)
    return 0


def cmd_demo(ctx: _Context) -> int:
    """Play the demo scenario direct and managed, and show the difference."""
    return simulation_commands.demo(ctx, format_table, _demo_path())


def cmd_simulate(ctx: _Context) -> int:
    """Play a scenario file or a shipped scenario; --list names the shipped ones."""
    return simulation_commands.simulate(ctx, format_table)


def _demo_path() -> Path:
    from importlib import resources

    return Path(str(resources.files("npumanager") / "scenarios" / "demo.toml"))


def cmd_schema(ctx: _Context) -> int:
    """Print the JSON Schema of one model, or of all of them."""
    name = ctx.args.name
    if name is None:
        document: dict[str, Any] = {
            model_name: model.model_json_schema(by_alias=True)
            for model_name, model in SCHEMA_MODELS.items()
        }
    else:
        matches = [m for m in SCHEMA_MODELS if m.lower() == name.lower()]
        if not matches:
            raise NpuManagerError(f"unknown schema {name!r}; available: {', '.join(SCHEMA_MODELS)}")
        document = SCHEMA_MODELS[matches[0]].model_json_schema(by_alias=True)
    json.dump(document, ctx.out, indent=2)
    ctx.out.write("\n")
    return 0


def cmd_vts(ctx: _Context) -> int:
    """Run the conformance suite on an installed driver; non-zero if any test fails."""
    from npumanager.cli.options import parse_driver_option
    from npumanager.core.plugins.factories import build_with_options
    from npumanager.testing.runner import FAIL, module_for, run_suite

    if ctx.args.list:
        from npumanager.testing.rules import table

        print(format_table(table(), ["RULE", "TEST", "CAPABILITY", "A DRIVER MUST"]), file=ctx.out)
        return 0
    name = ctx.args.driver
    if name is None:
        raise NpuManagerError("vts needs --driver NAME (or --list)")
    record = ctx.registry.driver(name)  # an unknown name: one line listing the known ones
    options = dict(parse_driver_option(spec) for spec in ctx.args.driver_option)
    args: tuple[str, ...] = () if ctx.args.seed is None else ("--npu-seed", str(ctx.args.seed))
    if options:
        # checked here, once, so that a wrong option is one line and not a failure per rule
        build_with_options(f"driver {name!r}", record.factory, (), options).close()
        args += ("--npu-driver-options", json.dumps(options))
    results, output = run_suite(module_for(name), pytest_args=args)
    failed = sum(r.outcome == FAIL for r in results)
    if ctx.args.json:
        rows = [{"test": r.name, "result": r.outcome, "detail": r.detail} for r in results]
        print(
            json.dumps({"driver": name, "results": rows, "failed": failed}, indent=2), file=ctx.out
        )
    else:
        rows_ = [[r.name, r.outcome, r.detail] for r in results]
        print(format_table(rows_, ["TEST", "RESULT", "DETAIL"]), file=ctx.out)
        counts = {o: sum(r.outcome == o for r in results) for o in ("PASS", "FAIL", "SKIP")}
        summary = ", ".join(f"{n} {o.lower()}" for o, n in counts.items())
        print(f"\ndriver {name}: {summary}", file=ctx.out)
    if failed and ctx.args.verbose:
        print(output, file=ctx.err)
    return 1 if failed or not results else 0


def cmd_config(ctx: _Context) -> int:
    """Print the effective configuration and where each value came from."""
    loaded = ctx.loaded
    rows = loaded.rows()
    if ctx.args.json:
        document = {
            "file": str(loaded.path),
            "file_found": loaded.file_found,
            "settings": {
                key: {"value": list(v) if isinstance(v, tuple) else v, "source": source}
                for key, v, source in rows
            },
        }
        json.dump(document, ctx.out, indent=2)
        ctx.out.write("\n")
        return 0
    state = "" if loaded.file_found else " (not found; defaults apply)"
    print(f"config file: {loaded.path}{state}", file=ctx.out)
    body = [[key, _show(value), source] for key, value, source in rows]
    print(format_table(body, ["KEY", "VALUE", "SOURCE"]), file=ctx.out)
    return 0


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(value) or "(empty)"
    if value is None:
        return "(unset)"
    return json.dumps(value)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(
        prog=PROG,
        description="Arbitrate a neural accelerator between the apps that want it.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument(
        "--config",
        type=Path,
        metavar="PATH",
        help="configuration file (default: $NPUMANAGER_CONFIG or the per-user config.toml)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(
        name: str, handler: Callable[[_Context], int], help_text: str
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    demo = add(
        "demo", cmd_demo, "play the demo scenario without and with the arbiter, side by side"
    )
    demo.add_argument(
        "--scenario", type=Path, metavar="FILE", help="a scenario file (default: the shipped demo)"
    )
    demo.add_argument(
        "--real",
        action="store_true",
        help="run the scenario's apps as real models on a real driver, on the wall clock",
    )
    demo.add_argument(
        "--seconds",
        type=float,
        help=f"with --real only: wall-clock seconds per run (default {REAL_DEMO_SECONDS:g}); "
        "the simulated demo plays the scenario's own duration",
    )
    demo.add_argument(
        "--min-jobs",
        type=int,
        metavar="N",
        help="with --real only: an app's time is not up before it has finished N inferences, "
        "however busy the machine (a run may then outlast --seconds; default 0)",
    )
    simulation_commands.add_play_arguments(demo)
    simulate = add(
        "simulate", cmd_simulate, "play a scenario file direct and managed, or --list shipped ones"
    )
    simulation_commands.add_simulate_arguments(simulate)
    plugins = add("plugins", cmd_plugins, "list installed drivers, policies and sinks")
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    schema = add("schema", cmd_schema, "print the JSON Schema of the HAL and API models")
    schema.add_argument(
        "name", nargs="?", metavar="NAME", help=f"one of: {', '.join(SCHEMA_MODELS)} (default: all)"
    )
    config = add("config", cmd_config, "print the effective configuration and its sources")
    config.add_argument("--json", action="store_true", help="print JSON instead of a table")
    vts = add("vts", cmd_vts, "run the driver conformance suite on an installed driver")
    vts.add_argument("--driver", metavar="NAME", help="the driver to test")
    vts.add_argument("--list", action="store_true", help="print the rules and their tests")
    vts.add_argument(
        "--seed", type=int, metavar="N", help="another seed for the state machine (default: fixed)"
    )
    vts.add_argument(
        "--driver-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option every driver of the suite is built with, as serve takes it, e.g. "
        "background_idle=false (repeatable)",
    )
    vts.add_argument("--json", action="store_true", help="print JSON instead of a table")
    vts.add_argument(
        "-v", "--verbose", action="store_true", help="print pytest's output when a test fails"
    )
    add_health(add)
    register_daemon_commands(add)
    register_run(add)
    return parser


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run the command line; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    ctx = _Context(args, out, err)
    try:
        code: int = args.handler(ctx)
        out.flush()
    except NpuManagerError as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return EXIT_USAGE
    except BrokenPipeError:
        _drop_output(out)
        return 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=err)
        return EXIT_INTERRUPTED
    except OSError as exc:
        if exc.errno not in _FULL_DISK:
            raise
        print(f"{PROG}: error: cannot write the output: {exc.strerror}", file=err)
        _drop_output(out)
        return EXIT_USAGE
    return code


def _drop_output(out: TextIO) -> None:
    """Point standard output at /dev/null, so the interpreter's last flush cannot fail again."""
    if out is sys.stdout:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
