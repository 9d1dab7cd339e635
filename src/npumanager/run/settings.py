"""What `npu-manager run` tells the program it runs, through its environment: the daemon's
socket, how long to wait for a grant, the priority of its models, which runtimes to manage,
and what to do when no daemon answers."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from npumanager.daemon.peer import SOCKET_ENV
from npumanager.errors import IllegalArgumentError
from npumanager.run._boot.npumanager_run_boot import RUNTIMES
from npumanager.schemas import ModelPriority
from npumanager.schemas.limits import MAX_CALL_TIMEOUT_S, RUN_GRANT_TIMEOUT_S

BOOT_DIR = Path(__file__).with_name("_boot")
"""The folder put first on the program's PYTHONPATH: its `sitecustomize` installs the hook."""
TIMEOUT_ENV = "NPUMANAGER_RUN_TIMEOUT"
PRIORITY_ENV = "NPUMANAGER_RUN_PRIORITY"
RUNTIMES_ENV = "NPUMANAGER_RUN_RUNTIMES"
NO_DAEMON_ENV = "NPUMANAGER_RUN_NO_DAEMON"
UNMANAGED = "unmanaged"
"""With no daemon: run the model in the program's process as the runtime would (the default)."""
REFUSE = "refuse"
"""With no daemon: the session's creation fails with the runtime's own exception."""
NO_DAEMON_CHOICES = (UNMANAGED, REFUSE)
PRIORITIES = {p.name.lower(): p for p in ModelPriority}


@dataclass(frozen=True)
class Settings:
    """The settings of one program under `npu-manager run`."""

    socket: Path | None = None
    """The daemon's socket; None: where `npumanager.connect` looks by default."""
    timeout_s: float = RUN_GRANT_TIMEOUT_S
    """How long a session's creation waits for CAN_LOAD_NOW."""
    priority: ModelPriority = ModelPriority.NORMAL
    """The intended priority of every model's load request."""
    runtimes: tuple[str, ...] = RUNTIMES
    """The runtimes whose sessions are managed; the others are left alone."""
    no_daemon: str = UNMANAGED
    """`UNMANAGED` or `REFUSE`: what a session does when no daemon answers."""

    def __post_init__(self) -> None:
        if not (0 < self.timeout_s <= MAX_CALL_TIMEOUT_S) or math.isnan(self.timeout_s):
            raise IllegalArgumentError(
                f"the grant timeout must be more than 0 and at most {MAX_CALL_TIMEOUT_S:g} s; "
                f"got {self.timeout_s:g}"
            )
        unknown = [name for name in self.runtimes if name not in RUNTIMES]
        if unknown or not self.runtimes:
            raise IllegalArgumentError(
                f"a driver hint is one of {', '.join(RUNTIMES)}; got {', '.join(unknown) or 'none'}"
            )
        if self.no_daemon not in NO_DAEMON_CHOICES:
            raise IllegalArgumentError(
                f"with no daemon a program may {' or '.join(NO_DAEMON_CHOICES)}; "
                f"got {self.no_daemon!r}"
            )

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` with the hook first on PYTHONPATH and these settings in variables."""
        env = dict(base)
        path = [str(BOOT_DIR), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
        if self.socket is not None:
            env[SOCKET_ENV] = str(self.socket)
        env[TIMEOUT_ENV] = repr(self.timeout_s)
        env[PRIORITY_ENV] = self.priority.name.lower()
        env[RUNTIMES_ENV] = ",".join(self.runtimes)
        env[NO_DAEMON_ENV] = self.no_daemon
        return env


def parse_priority(text: str) -> ModelPriority:
    """A priority by its name (normal, background, opportunistic)."""
    try:
        return PRIORITIES[text.strip().lower()]
    except KeyError:
        raise IllegalArgumentError(
            f"a model priority is one of {', '.join(PRIORITIES)}; got {text!r}"
        ) from None


def from_environment(env: Mapping[str, str] | None = None) -> Settings:
    """The settings a program was started with (the defaults where a variable is unset)."""
    env = os.environ if env is None else env
    timeout = env.get(TIMEOUT_ENV)
    try:
        timeout_s = RUN_GRANT_TIMEOUT_S if timeout is None else float(timeout)
    except ValueError:
        raise IllegalArgumentError(
            f"{TIMEOUT_ENV} must be a number of seconds; got {timeout!r}"
        ) from None
    runtimes = env.get(RUNTIMES_ENV)
    return Settings(
        socket=None,  # npumanager.connect reads $NPUMANAGER_SOCKET itself
        timeout_s=timeout_s,
        priority=parse_priority(env.get(PRIORITY_ENV, ModelPriority.NORMAL.name)),
        runtimes=RUNTIMES if runtimes is None else tuple(filter(None, runtimes.split(","))),
        no_daemon=env.get(NO_DAEMON_ENV, UNMANAGED),
    )
