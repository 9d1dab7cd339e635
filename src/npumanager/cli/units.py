"""`npu-manager units`: the systemd unit files an administrator installs to run the daemon.

Three files: a socket unit (systemd owns `/run/npu-manager/npu.sock` and starts the
daemon on the first connection), a `Type=notify` service with a watchdog that runs as its
own system user, and a sysusers.d file that creates that user and the two groups (apps
that may connect; administrators who may manage).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from npumanager.cli.options import Add, CommandContext
from npumanager.daemon.peer import SYSTEM_SOCKET_PATH
from npumanager.errors import NpuManagerError

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
SupplementaryGroups={device_groups}
RuntimeDirectory=npu-manager
RuntimeDirectoryPreserve=yes
WatchdogSec={watchdog}
Restart=on-failure
TimeoutStopSec=10
MemoryPressureWatch=auto
LimitNOFILE=65536
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelModules=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
LockPersonality=yes

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


def _executable() -> str:
    """The `npu-manager` script of this installation, by absolute path."""
    script = Path(sys.argv[0])
    if script.name == "npu-manager" and script.exists():
        return str(script.resolve())
    found = shutil.which("npu-manager")
    if found:
        return str(Path(found).resolve())
    return f"{Path(sys.executable).resolve()} -m npumanager"


def render(
    name: str,
    *,
    executable: str | None = None,
    driver: str = "vnpu",
    policy: str = "status_quo",
    device_groups: str = "render",
) -> str:
    """One unit file's text."""
    fields = {
        "socket": SYSTEM_SOCKET_PATH,
        "exec": executable or _executable(),
        "driver": driver,
        "policy": policy,
        "user": SERVICE_USER,
        "app_group": APP_GROUP,
        "admin_group": ADMIN_GROUP,
        "device_groups": device_groups,
        "watchdog": WATCHDOG_SEC,
    }
    templates = {NAMES[0]: _SOCKET, NAMES[1]: _SERVICE, NAMES[2]: _SYSUSERS}
    try:
        return templates[name].format(**fields)
    except KeyError:
        raise NpuManagerError(f"no unit named {name!r}; the units are {', '.join(NAMES)}") from None


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
        help="groups that give the daemon access to the accelerator's device node "
        "(default: render)",
    )
    units.add_argument(
        "--exec", dest="executable", metavar="PATH", help="the npu-manager to run (default: this)"
    )


def cmd_units(ctx: CommandContext) -> int:
    """Print one unit, or every unit each after a comment naming where it goes."""
    args: argparse.Namespace = ctx.args
    options = {
        "executable": args.executable,
        "driver": args.driver,
        "policy": args.policy,
        "device_groups": args.device_groups,
    }
    if args.name is not None:
        ctx.out.write(render(args.name, **options))
        return 0
    for index, name in enumerate(NAMES):
        if index:
            ctx.out.write("\n")
        ctx.out.write(f"# {PLACES[name]}\n{render(name, **options)}")
    return 0
