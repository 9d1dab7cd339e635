"""Who else uses the accelerator: the processes holding one of its device nodes open without
the manager, found by their descriptors in ``/proc/PID/fd`` and described by what the driver
prints in ``/proc/PID/fdinfo/FD``: the DRM client usage stats of the kernel's
``Documentation/gpu/drm-usage-stats.rst`` (``drm-driver``, ``drm-client-id``, ``drm-pdev``,
``drm-engine-<name>`` in ``ns``, ``drm-engine-capacity-<name>``, ``drm-cycles-<name>``,
``drm-total-cycles-<name>``, and ``drm-<total|shared|resident|purgeable|active>-<region>``
in bytes, ``KiB`` or ``MiB``).

One `DeviceUser` stands for each DRM client (an open of a node, the kernel's ``struct
drm_file``) of each process: descriptors that share a ``drm-client-id`` (``dup``, or passed
over a socket) are one user. Everything is read with ``root`` in front (fake trees in tests,
as the ``linux`` health source does), and nothing a process or a driver shows raises: a
process that exits, a descriptor closed meanwhile, another uid's descriptors (unreadable
but to root, or with ``hidepid=1``) and a garbled line are skipped and counted in
`DeviceScan.skipped`; processes ``hidepid=2`` makes invisible cannot even be counted. Pids
may be reused during a scan: a process that starts meanwhile may answer for one that ended,
which a snapshot of this kind accepts.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Final, Literal, NamedTuple

from npumanager.apps.identity import app_of_cgroup, cgroup_of_pid

MAX_SCAN_ENTRIES: Final = 100_000
"""How many process directories and descriptors one `scan` looks at, at most: the rest of a
machine with more is left out and the scan says so (`DeviceScan.truncated`), so a million
open files cannot stall the caller."""
MAX_PROC_FILE_BYTES: Final = 64 * 1024
"""How much of one fdinfo or status file is read; a driver's stats take a few hundred bytes."""
U64_MAX: Final = 2**64 - 1
"""The largest value the kernel prints (a u64); a value beyond it, in bytes or ns, is garbled."""
MEMORY_KINDS: Final = ("total", "shared", "resident", "purgeable", "active")
"""The memory categories of the usage stats, each ``drm-<kind>-<region>``."""

SkipReason = Literal["denied", "vanished", "unreadable", "garbled"]
"""Why something was skipped: a permission error, a process or descriptor gone, another read
error, or a ``drm-`` line whose value is not what the usage stats allow."""

_MEMORY_UNITS: Final[Mapping[str | None, int]] = {None: 1, "KiB": 1024, "MiB": 1024 * 1024}
_TIME_UNITS: Final[Mapping[str | None, int]] = {"ns": 1}
_COUNT: Final[Mapping[str | None, int]] = {None: 1}
_CAPACITY: Final = "engine-capacity-"
_ENGINE_KEYS: Final = (
    (_CAPACITY, _COUNT),
    ("engine-", _TIME_UNITS),
    ("total-cycles-", _COUNT),
    ("cycles-", _COUNT),
)
"""Per-engine keys and their units, longest prefix first (``engine-capacity-`` before
``engine-``, ``total-cycles-`` before a memory region called ``cycles-...``)."""
_LEGACY_MEMORY: Final = "memory"
_NUMBER = re.compile(r"([0-9]{1,20})(?:[ \t]+([^\s]+))?")
_KEY = re.compile(r"drm-[^\s]+")
_NODE = re.compile(r"(accel|renderD)([0-9]+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class DrmClient:
    """What one fdinfo says of its DRM client; empty where the node's driver prints no usage
    stats (or the node is no DRM device at all)."""

    driver: str | None = None
    """``drm-driver``: the name the driver registered (``i915``, ``amdgpu``, ``intel_vpu``)."""
    pdev: str | None = None
    """``drm-pdev``: the PCI slot of the device, where the driver gives it."""
    client_id: int | None = None
    """``drm-client-id``: one per open of a node, shared by the descriptors of that open."""
    engines: Mapping[str, int] = field(default_factory=dict)
    """Engine name -> the time it spent busy with this client's work, in ns."""
    capacity: Mapping[str, int] = field(default_factory=dict)
    """Engine name -> how many identical engines it groups, where not one."""
    cycles: Mapping[str, int] = field(default_factory=dict)
    """Engine name -> busy cycles (``drm-cycles-<name>``)."""
    total_cycles: Mapping[str, int] = field(default_factory=dict)
    """Engine name -> total cycles, the clock ``cycles`` is measured against."""
    memory: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Region -> category (`MEMORY_KINDS`) -> bytes. The deprecated ``drm-memory-<region>``
    is the kernel's alias of ``drm-resident-<region>``, and counts as resident."""

    def resident_bytes(self) -> int:
        """The bytes of this client's buffers resident in any region."""
        return sum(kinds.get("resident", 0) for kinds in self.memory.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceUser(DrmClient):
    """A process holding an accelerator node open, and what its driver says of that open."""

    pid: int
    uid: int
    """The real uid, from ``/proc/PID/status``."""
    app_id: str
    """The app its cgroup names (`identity.app_of_cgroup`), else ``uid:<uid>``."""
    cgroup: str | None
    """Its cgroup v2 path, where it could be read."""
    comm: str
    node: str
    """The device node the descriptor refers to, as the kernel names it (``/dev/accel/accel0``)."""


@dataclass(frozen=True, slots=True)
class DeviceScan:
    """What one `scan` found: the users, and what it skipped, by `SkipReason`, for a log line."""

    users: tuple[DeviceUser, ...]
    skipped: Mapping[SkipReason, int]
    truncated: bool
    """The scan stopped at its limit of entries (`MAX_SCAN_ENTRIES`): some may be missing."""

    def resident_bytes(self) -> int:
        """The resident bytes of all users, each DRM client counted once (`distinct_clients`)."""
        return sum(user.resident_bytes() for user in distinct_clients(self.users))


def distinct_clients(users: Iterable[DeviceUser]) -> list[DeviceUser]:
    """The users with each DRM client (node and client id) once, though forked processes
    share it: the first process seen stands for it. Users with no client id are all kept."""
    seen: set[tuple[str, int]] = set()
    kept = []
    for user in users:
        if user.client_id is not None:
            if (user.node, user.client_id) in seen:
                continue
            seen.add((user.node, user.client_id))
        kept.append(user)
    return kept


def device_nodes(root: Path = Path("/")) -> tuple[str, ...]:
    """The machine's accelerator nodes, ``/dev/accel/accel*`` then ``/dev/dri/renderD*``, as
    machine paths (``root`` left off), in number order."""
    found = []
    for folder in ("dev/accel", "dev/dri"):
        try:
            names = os.listdir(root / folder)
        except OSError:
            continue
        numbered = [(m[1], int(m[2]), name) for name in names if (m := _NODE.fullmatch(name))]
        found += ["/" + folder + "/" + name for *_, name in sorted(numbered)]
    return tuple(found)


def scan(
    nodes: Iterable[str | os.PathLike[str]],
    root: Path = Path("/"),
    exclude_pids: Iterable[int] = (),
    *,
    limit: int = MAX_SCAN_ENTRIES,
) -> DeviceScan:
    """Every process under ``root/proc`` (but ``exclude_pids``: the manager's own, the daemon
    and its model hosts) with a descriptor open on one of ``nodes`` (machine paths, as
    `device_nodes` gives them), one `DeviceUser` per process and DRM client. Looks at
    ``limit`` process directories and descriptors at most. Never raises for what it reads."""
    wanted = frozenset(os.path.normpath(os.fspath(node)) for node in nodes)
    scanner = _Scanner(root / "proc", wanted, frozenset(exclude_pids), limit)
    if wanted:
        scanner.run()
    return DeviceScan(tuple(scanner.users.values()), dict(+scanner.skipped), scanner.truncated)


def parse_fdinfo(data: bytes) -> tuple[DrmClient, int]:
    """The DRM client usage stats in an fdinfo file's bytes, and how many ``drm-`` lines were
    garbled (skipped): not UTF-8, a key with whitespace, a value that is not a number, a
    unit the stats do not allow, a value beyond a u64, a zero capacity. Other keys (``pos``,
    ``flags``, a driver's own ``<driver>-`` keys, ``drm-`` keys of later kernels) are ignored."""
    parsed = _Parsed()
    garbled = 0
    for raw in data.split(b"\n"):
        if not raw.startswith(b"drm-"):
            continue
        try:
            line = raw.decode()
        except UnicodeDecodeError:
            garbled += 1
            continue
        key, colon, value = line.partition(":")
        if not (colon and _KEY.fullmatch(key) and parsed.take(key[4:], value.strip())):
            garbled += 1
    return parsed.client(), garbled


class _Parsed:
    """The stats of one fdinfo as they are read."""

    def __init__(self) -> None:
        self.text: dict[str, str] = {}
        self.client_id: int | None = None
        self.engine_keys: dict[str, dict[str, int]] = {prefix: {} for prefix, _ in _ENGINE_KEYS}
        self.memory: dict[str, dict[str, int]] = {}

    def take(self, key: str, value: str) -> bool:
        """Record one ``drm-`` key (without its prefix); False where its value is garbled."""
        if key in ("driver", "pdev"):
            if not value or not value.isprintable() or any(char.isspace() for char in value):
                return False
            self.text[key] = value
            return True
        if key == "client-id":
            client_id = _number(value, _COUNT)
            if client_id is None:
                return False
            self.client_id = client_id
            return True
        for prefix, units in _ENGINE_KEYS:
            if key.startswith(prefix):
                name, number = key.removeprefix(prefix), _number(value, units)
                if not name or number is None or (number == 0 and prefix == _CAPACITY):
                    return False
                self.engine_keys[prefix][name] = number
                return True
        kind, _, region = key.partition("-")
        if kind in MEMORY_KINDS or kind == _LEGACY_MEMORY:
            number = _number(value, _MEMORY_UNITS)
            if not region or number is None:
                return False
            self.memory.setdefault(region, {})[kind] = number
        return True

    def client(self) -> DrmClient:
        for kinds in self.memory.values():
            legacy = kinds.pop(_LEGACY_MEMORY, None)
            if legacy is not None:
                kinds.setdefault("resident", legacy)
        keys = self.engine_keys
        return DrmClient(
            driver=self.text.get("driver"),
            pdev=self.text.get("pdev"),
            client_id=self.client_id,
            engines=keys["engine-"],
            capacity=keys[_CAPACITY],
            cycles=keys["cycles-"],
            total_cycles=keys["total-cycles-"],
            memory=self.memory,
        )


def _number(value: str, units: Mapping[str | None, int]) -> int | None:
    """A ``<uint> [unit]`` value in the base unit, or None where it is not one of ``units``'
    or does not fit a u64."""
    match = _NUMBER.fullmatch(value)
    if match is None or match[2] not in units:
        return None
    number = int(match[1]) * units[match[2]]
    return number if number <= U64_MAX else None


class _Who(NamedTuple):
    """Who a process is, read once for all its descriptors."""

    uid: int
    app_id: str
    cgroup: str | None
    comm: str


class _Scanner:
    """One scan's walk of ``/proc``: the users found, what was skipped, the budget left."""

    def __init__(self, proc: Path, wanted: frozenset[str], excluded: frozenset[int], limit: int):
        self.proc = proc
        self.wanted = wanted
        self.excluded = excluded
        self.budget = limit
        self.users: dict[tuple[int, str, int | None], DeviceUser] = {}
        self.skipped: Counter[SkipReason] = Counter()
        self.truncated = False

    def run(self) -> None:
        try:
            with os.scandir(self.proc) as entries:
                for entry in entries:
                    name = entry.name
                    if not (name.isascii() and name.isdigit()) or int(name) in self.excluded:
                        continue
                    if not self._spend():
                        return
                    self._process(int(name))
        except OSError as error:
            self.skipped[_reason(error)] += 1

    def _spend(self) -> bool:
        """Take one entry from the budget; False (and the scan truncated) when none is left."""
        if self.budget <= 0:
            self.truncated = True
            return False
        self.budget -= 1
        return True

    def _process(self, pid: int) -> None:
        held = self._held(pid)
        if not held:
            return
        who = self._who(pid)
        if who is None:
            return
        for fd, node in held:
            try:
                data = _read(self.proc / str(pid) / "fdinfo" / fd)
            except OSError as error:
                self.skipped[_reason(error)] += 1
                continue
            client, garbled = parse_fdinfo(data)
            self.skipped["garbled"] += garbled
            key = (pid, node, client.client_id)
            if key not in self.users:
                state = {item.name: getattr(client, item.name) for item in fields(DrmClient)}
                self.users[key] = DeviceUser(
                    **state,
                    pid=pid,
                    uid=who.uid,
                    app_id=who.app_id,
                    cgroup=who.cgroup,
                    comm=who.comm,
                    node=node,
                )

    def _held(self, pid: int) -> list[tuple[str, str]]:
        """The descriptors of ``pid`` open on a wanted node, with the node."""
        held = []
        try:
            with os.scandir(self.proc / str(pid) / "fd") as entries:
                for entry in entries:
                    if not self._spend():
                        break
                    try:
                        target = os.readlink(entry.path)
                    except OSError as error:
                        self.skipped[_reason(error)] += 1
                        continue
                    if target in self.wanted:
                        held.append((entry.name, target))
        except OSError as error:
            self.skipped[_reason(error)] += 1
        return held

    def _who(self, pid: int) -> _Who | None:
        """The process's real uid, name, cgroup and app id; None (counted) where it is gone."""
        base = self.proc / str(pid)
        try:
            status = _read(base / "status")
            comm = _read(base / "comm").rstrip(b"\n").decode(errors="backslashreplace")
        except OSError as error:
            self.skipped[_reason(error)] += 1
            return None
        uid = _real_uid(status)
        if uid is None:
            self.skipped["garbled"] += 1
            return None
        try:
            cgroup = cgroup_of_pid(pid, self.proc)
        except OSError:
            cgroup = None
        app = app_of_cgroup(cgroup) if cgroup is not None else None
        app_id = app.app_id if app is not None else f"uid:{uid}"
        return _Who(uid, app_id, cgroup, comm)


def _real_uid(status: bytes) -> int | None:
    """The real uid of a ``/proc/PID/status`` file (the first of its ``Uid:`` line)."""
    for line in status.split(b"\n"):
        if line.startswith(b"Uid:"):
            first = line[4:].split()[:1]
            if first and first[0].isdigit() and len(first[0]) <= 10:
                return int(first[0])
            return None
    return None


def _read(path: Path) -> bytes:
    """A file of ``/proc``, at most `MAX_PROC_FILE_BYTES`; where it is longer, its complete lines
    only, so that a cut cannot make a shorter number of a longer one."""
    with open(path, "rb") as file:
        data = file.read(MAX_PROC_FILE_BYTES)
    if len(data) == MAX_PROC_FILE_BYTES:
        data = data[: data.rfind(b"\n") + 1]
    return data


def _reason(error: OSError) -> SkipReason:
    if isinstance(error, PermissionError):
        return "denied"
    if isinstance(error, FileNotFoundError | ProcessLookupError):
        return "vanished"
    return "unreadable"
