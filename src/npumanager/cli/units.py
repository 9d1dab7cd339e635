"""`npu-manager units`: the systemd unit files an administrator installs to run the daemon.

Three files: a socket unit (systemd owns `/run/npu-manager/npu.sock` and starts the
daemon on the first connection), a `Type=notify` service with a watchdog that runs as its
own system user in a sandbox (`systemd-analyze security` rates it OK), and a sysusers.d
file that creates that user and the two groups (apps that may connect; administrators who
may manage). What would not run under that sandbox is refused before anything is printed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npumanager.cli.options import Add, CommandContext
from npumanager.core.plugins.registry import PluginRegistry
from npumanager.daemon.peer import SYSTEM_SOCKET_PATH
from npumanager.errors import NpuManagerError
from npumanager.schemas import DriverCapability, PluginKind

SERVICE_USER = "npu-manager"
APP_GROUP = "npu"
ADMIN_GROUP = "npu-admin"
WATCHDOG_SEC = 30

_SOCKET = """\
[Unit]
Description=npu-manager socket: apps ask here before they use the neural accelerator

[Socket]
ListenStream={socket}
SocketMode=0660
SocketGroup={app_group}
DirectoryMode=0755
Accept=no
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
"""

_SERVICE = """\
[Unit]
Description=npu-manager: one arbiter between the apps and the neural accelerator
Requires=npu-manager.socket
After=npu-manager.socket

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec} serve --driver {driver} --policy {policy} --management-group {admin_group}
User={user}
Group={user}
{groups}RuntimeDirectory=npu-manager
RuntimeDirectoryPreserve=yes
LogsDirectory=npu-manager
LogsDirectoryMode=0750
WatchdogSec={watchdog}
Restart=on-failure
TimeoutStopSec=10
MemoryPressureWatch=auto
LimitNOFILE=65536
UMask=0077
# The sandbox: what each line means is in the integrators' guide.
{devices}NoNewPrivileges=yes
CapabilityBoundingSet=
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateMounts=yes
PrivateNetwork=yes
IPAddressDeny=any
RestrictAddressFamilies=AF_UNIX
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=default
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
{memory}RemoveIPC=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
Also=npu-manager.socket
"""

_SYSUSERS = """\
g {app_group} -
g {admin_group} -
u {user} - "npu-manager daemon" - -
"""

NAMES = ("npu-manager.socket", "npu-manager.service", "npu-manager.conf")
"""The files, by the name each is installed under."""

PLACES = {
    "npu-manager.socket": "/etc/systemd/system/npu-manager.socket",
    "npu-manager.service": "/etc/systemd/system/npu-manager.service",
    "npu-manager.conf": "/etc/sysusers.d/npu-manager.conf",
}

ACCELERATOR_DEVICES = ("char-accel rw", "char-drm rw")
"""`DeviceAllow=` for a real runtime: accel nodes (`/dev/accel/accel*`, the Intel NPU) and
DRM nodes (`/dev/dri/renderD*`, GPUs and older NPU drivers); the cgroup denies the rest."""


@dataclass(frozen=True)
class Sandbox:
    """What a driver's runtime needs of the sandbox: device nodes, and memory both written
    and executed (a runtime that compiles kernels as it runs, as OpenVINO's CPU plugin does)."""

    devices: tuple[str, ...] = ACCELERATOR_DEVICES
    jit: bool = True


SANDBOXES = {"vnpu": Sandbox(devices=(), jit=False), "onnxruntime": Sandbox(jit=False)}
"""Built-in drivers measured to need less than the default: the simulated device opens no
device node, and Python, cffi and ONNX Runtime's CPU provider run with W^X enforced
(tests/test_units_hardening.py). Any other driver gets `Sandbox()`."""

HIDDEN = {
    "/home": "ProtectHome=",
    "/root": "ProtectHome=",
    "/run/user": "ProtectHome=",
    "/tmp": "PrivateTmp=",
    "/var/tmp": "PrivateTmp=",
}
"""Where the service sees nothing (or an empty folder of its own), and the line that says so."""

_OUTSIDE = "/home, /root, /run/user, /tmp and /var/tmp"
_GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,30}")
"""A group name systemd accepts in `SupplementaryGroups=` (its strict rule, 31 characters)."""
_UNSAFE = re.compile(r"[\s\"'\\$%;]")
"""Characters `ExecStart=` would split at, unquote or expand."""


def _default_command() -> tuple[str, ...]:
    """The `npu-manager` of this installation: its script, else its Python with `-m`."""
    script = Path(sys.argv[0])
    if script.name == "npu-manager" and script.exists():
        return (str(script.resolve()),)
    beside = Path(sys.executable).parent / "npu-manager"
    found = str(beside) if beside.exists() else shutil.which("npu-manager")
    if found:
        return (str(Path(found).resolve()),)
    # Not resolved: a virtual environment's python is a link that must stay the venv's.
    return (os.path.abspath(sys.executable), "-m", "npumanager")


def _hidden(path: str) -> tuple[str, str] | None:
    """The hidden folder `path` lies in and the line that hides it, or None."""
    for prefix, directive in HIDDEN.items():
        if path == prefix or path.startswith(prefix + "/"):
            return prefix, directive
    return None


def _check_place(subject: str, path: str) -> None:
    """Refuse `path` if the service would not see it there, as named or through links."""
    real = os.path.realpath(path)
    for said, place in ((path, os.path.normpath(path)), (f"{path}, really {real},", real)):
        if hidden := _hidden(place):
            raise NpuManagerError(
                f"{subject} {said} lies under {hidden[0]}, which {hidden[1]} hides from the "
                f"service; install npu-manager outside {_OUTSIDE} and give that path to --exec"
            )


def check_program(path: str, what: str = "--exec") -> None:
    """Refuse a program the service could not run: not an absolute path, missing, hidden by
    the sandbox (itself, its real path or its script's interpreter), or unquotable."""
    if bad := _UNSAFE.search(path):
        raise NpuManagerError(
            f"{what} {path!r} holds {bad.group()!r}, which ExecStart= would split at or "
            "expand; give a path without whitespace, quotes, backslashes, $, % or ;"
        )
    if not path.startswith("/"):
        raise NpuManagerError(f"{what} must be an absolute path; got {path!r}")
    _check_place(what, path)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        state = "is not an executable file" if os.path.exists(path) else "does not exist"
        raise NpuManagerError(f"{what} {path} {state}; give the path of an installed npu-manager")
    try:
        with open(path, "rb") as program:
            first = program.readline(4096)
    except OSError as exc:
        raise NpuManagerError(f"{what} {path} cannot be read: {exc.strerror}") from None
    interpreter = first[2:].split(maxsplit=1)[:1] if first.startswith(b"#!") else []
    if interpreter and interpreter[0].startswith(b"/"):
        named = os.fsdecode(interpreter[0])
        _check_place(f"{what} {path} runs", named)


def _group_names(text: str) -> list[str]:
    return text.replace(",", " ").split()


def check_groups(text: str) -> None:
    """Refuse a `--device-groups` name (comma- or space-separated) that is not a group name."""
    for name in _group_names(text):
        if not _GROUP_NAME.fullmatch(name):
            raise NpuManagerError(
                f"--device-groups: {name!r} is not a valid group name; a name is a letter or _ "
                "then letters, digits, _ or -, at most 31 characters, names separated by commas"
            )


def check_plugins(registry: PluginRegistry, driver: str, policy: str) -> None:
    """Refuse a driver or policy the daemon would refuse at start: unknown, or virtual-time only."""
    if DriverCapability.REAL_TIME not in registry.driver(driver).capabilities:
        real = sorted(
            reg.name
            for reg in registry.registrations(PluginKind.DRIVER)
            if DriverCapability.REAL_TIME in registry.driver(reg.name).capabilities
        )
        raise NpuManagerError(
            f"driver {driver!r} runs in virtual time only, and the daemon runs in real time; "
            f"available: {', '.join(real) or 'none installed'}"
        )
    registry.policy(policy)


def _template(name: str) -> str:
    """The text of the unit `name`, or the one-line error that lists the units."""
    templates = {NAMES[0]: _SOCKET, NAMES[1]: _SERVICE, NAMES[2]: _SYSUSERS}
    try:
        return templates[name]
    except KeyError:
        raise NpuManagerError(f"no unit named {name!r}; the units are {', '.join(NAMES)}") from None


def _lines(entries: list[str]) -> str:
    return "".join(f"{entry}\n" for entry in entries)


def render(
    name: str,
    *,
    executable: str | None = None,
    driver: str = "vnpu",
    policy: str = "status_quo",
    device_groups: str = "render",
) -> str:
    """One unit file's text, its sandbox fitted to `driver` (`SANDBOXES`)."""
    sandbox = SANDBOXES.get(driver, Sandbox())
    devices = ["DevicePolicy=closed", *(f"DeviceAllow={d}" for d in sandbox.devices)]
    groups = " ".join(_group_names(device_groups))
    fields = {
        "socket": SYSTEM_SOCKET_PATH,
        "exec": executable or " ".join(_default_command()),
        "driver": driver,
        "policy": policy,
        "user": SERVICE_USER,
        "app_group": APP_GROUP,
        "admin_group": ADMIN_GROUP,
        "groups": _lines([f"SupplementaryGroups={groups}"] if groups else []),
        "devices": _lines(devices if sandbox.devices else ["PrivateDevices=yes"]),
        "memory": _lines([] if sandbox.jit else ["MemoryDenyWriteExecute=yes"]),
        "watchdog": WATCHDOG_SEC,
    }
    return _template(name).format(**fields)


def render_all(**options: Any) -> str:
    """Every unit, each after a comment naming where it goes."""
    return "\n".join(f"# {PLACES[name]}\n{render(name, **options)}" for name in NAMES)


def add_units(add: Add) -> None:
    """Add `units` to the CLI's parser."""
    units = add("units", cmd_units, "print the systemd units that run the daemon as a service")
    units.add_argument(
        "name", nargs="?", metavar="NAME", help=f"print only this one ({', '.join(NAMES)})"
    )
    units.add_argument("--driver", default="vnpu", help="the driver to serve (default: vnpu)")
    units.add_argument(
        "--policy", default="status_quo", help="the policy to start with (default: status_quo)"
    )
    units.add_argument(
        "--device-groups",
        default="render",
        metavar="GROUPS",
        help="groups that give the daemon access to the accelerator's device node, "
        "comma-separated (default: render)",
    )
    units.add_argument(
        "--exec",
        dest="executable",
        metavar="PATH",
        help=f"the npu-manager to run, outside {_OUTSIDE} (default: this one)",
    )


def cmd_units(ctx: CommandContext) -> int:
    """Print one unit, or every unit each after a comment naming where it goes; every
    option is checked first, so a refusal prints nothing but its one line."""
    args: argparse.Namespace = ctx.args
    if args.name is not None:
        _template(args.name)
    check_plugins(ctx.registry, args.driver, args.policy)
    check_groups(args.device_groups)
    if args.executable is not None:
        check_program(args.executable)
    else:
        check_program(_default_command()[0], "the npu-manager you ran (no --exec given)")
    options = {
        "executable": args.executable,
        "driver": args.driver,
        "policy": args.policy,
        "device_groups": args.device_groups,
    }
    if args.name is not None:
        ctx.out.write(render(args.name, **options))
    else:
        ctx.out.write(render_all(**options))
    return 0
