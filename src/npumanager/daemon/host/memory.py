"""A model host's memory held to what its client's grants allow, by a memory cgroup of its
own: cgroup v2's `memory.max` where the daemon's cgroup has the memory controller, else
cgroup v1's `memory.limit_in_bytes` where a v1 memory hierarchy is mounted (hybrid
machines), else the host's own data limit (`RLIMIT_DATA`, set by the daemon with
`prlimit` before the host's runtime loads: `HostRlimit`).

A host's limit is `HOST_MEMORY_BASE_BYTES` (its interpreter, its runtime and a run's
activations) plus `HELD_FACTOR` times the weight bytes of the models it holds, plus
`LOADING_FACTOR` times what the grant of a load in progress allows (the file's bytes, the
parsed model and the runtime's copy live at once while a model opens). A host over its
limit is killed by the kernel (an OOM kill in its own cgroup): only its client's models go;
under a data limit an allocation past it fails instead, and so does the run that made it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

HOST_MEMORY_BASE_BYTES = 256 << 20
"""What a host may use beyond its models: Python, the runtime (about 90-100 MiB resident
for either built-in runtime on x86-64) and the tensors of its runs."""
HELD_FACTOR = 2
"""A model's weights count this many times while it is open (a runtime may keep a
pre-packed copy beside the weights)."""
HOST_MEMORY_CEILING_BYTES = 16 << 30
"""The hard data limit of a host without a memory cgroup: what no grants on the built-in
drivers' default device reach (its soft limit follows the grants below this)."""
LOADING_FACTOR = 3
"""A load's allowance counts this many times while the model opens."""

_OOM_KILL = re.compile(rb"^oom_kill (\d+)$", re.MULTILINE)


def host_limit(held: int, loading: int) -> int:
    """The bytes a host holding `held` weight bytes, opening a model allowed `loading`, may use."""
    return HOST_MEMORY_BASE_BYTES + HELD_FACTOR * held + LOADING_FACTOR * loading


@dataclass(frozen=True)
class HostCgroup:
    """One host's memory cgroup."""

    path: Path
    version: Literal[1, 2]

    @property
    def _limit_file(self) -> Path:
        return self.path / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")

    def set_limit(self, limit: int) -> bool:
        """Hold the host to `limit` bytes; False (the old limit kept) when the host uses more
        than that and the kernel could not reclaim it."""
        if self.version == 2 and self.usage() > limit:
            return False  # v2 would OOM-kill at once; refuse instead
        try:
            self._limit_file.write_text(f"{limit}\n")
        except OSError as exc:
            if exc.errno == errno.EBUSY:  # v1: in use above the new limit
                return False
            raise
        return True

    def limit(self) -> int | None:
        """The limit in force (None: none)."""
        text = self._limit_file.read_text().strip()
        return None if text == "max" else int(text)

    def usage(self) -> int:
        """The bytes charged to the host now."""
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return int((self.path / name).read_text())

    def oom_kills(self) -> int:
        """How many of the host's processes the kernel killed for going over the limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError):
            found = _OOM_KILL.search((self.path / name).read_bytes())
            return int(found.group(1)) if found else 0
        return 0

    def remove(self) -> None:
        """Remove the cgroup once its host has been reaped."""
        with contextlib.suppress(FileNotFoundError):
            self.path.rmdir()


@dataclass(frozen=True)
class HostRlimit:
    """One host's memory held by its data limit (`RLIMIT_DATA`: its heap and private
    writable mappings), where no memory cgroup can be written.

    Raising a limit takes `CAP_SYS_RESOURCE`, which a daemon may lack (and which the host,
    another uid, must not have), so the daemon sets both limits as the host starts, while
    it may: the soft one to `HOST_MEMORY_BASE_BYTES`, the hard one to `ceiling` (the most
    any grants could allow); the host then moves its own soft limit as the daemon tells it
    (`limit`). A host that lies can raise its soft limit as far as `ceiling`, never past."""

    pid: int
    ceiling: int

    def start(self) -> None:
        """Set the started host's limits (`OSError` if the daemon may not)."""
        soft = min(host_limit(0, 0), self.ceiling)
        resource.prlimit(self.pid, resource.RLIMIT_DATA, (soft, self.ceiling))

    def usage(self) -> int:
        """The host's data bytes now (`VmData`), 0 once it is gone."""
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
        return 0


def explained(message: str) -> str:
    """A run's failure message, with this host's data limit where an allocation failed."""
    soft = resource.getrlimit(resource.RLIMIT_DATA)[0]
    if "alloc" not in message.lower() or soft == resource.RLIM_INFINITY:
        return message
    return (
        f"{message} (this model host may use {soft >> 20} MiB, what its grants allow: "
        "ask for a larger size class, or declare weight_bytes when requesting)"
    )


@dataclass(frozen=True)
class MemoryCgroups:
    """The folder under which hosts' memory cgroups are made, and its cgroup version."""

    parent: Path
    version: Literal[1, 2]

    @property
    def kind(self) -> str:
        """`cgroup v1` or `cgroup v2`, as `info` shows it."""
        return f"cgroup v{self.version}"

    def join(self, name: str, pid: int, limit: int) -> HostCgroup:
        """Make the cgroup `name` limited to `limit` bytes, and move process `pid` into it.

        A cgroup of that name already there is a dead host's that its daemon never removed
        (killed with SIGKILL, a pid of the same number since): it is removed first, which
        the kernel refuses while any process is in it."""
        cgroup = HostCgroup(self.parent / name, self.version)
        try:
            cgroup.path.mkdir()
        except FileExistsError:
            cgroup.path.rmdir()
            cgroup.path.mkdir()
        try:
            if self.version == 1:
                (cgroup.path / "memory.swappiness").write_text("0\n")
            elif (cgroup.path / "memory.swap.max").exists():
                (cgroup.path / "memory.swap.max").write_text("0\n")
            if not cgroup.set_limit(limit):
                raise OSError(errno.EBUSY, "the new cgroup would not take its limit")
            (cgroup.path / "cgroup.procs").write_text(f"{pid}\n")
        except BaseException:
            cgroup.remove()
            raise
        return cgroup

    @classmethod
    def find(cls, proc_self: Path = Path("/proc/self")) -> MemoryCgroups | None:
        """Where this process may make memory cgroups for its hosts, or None.

        v2: the process's own cgroup must have the memory controller and be writable; the
        process moves itself into a leaf `daemon` beside its hosts' cgroups (a cgroup with
        controllers for its children holds no processes), as systemd's delegation expects.
        v1: the process's own cgroup in the memory hierarchy, if writable.
        """
        try:
            lines = (proc_self / "cgroup").read_text().splitlines()
            mounts = (proc_self / "mountinfo").read_text().splitlines()
        except OSError:
            return None
        v2 = _v2(lines, mounts)
        if v2 is not None:
            return v2
        return _v1(lines, mounts)


def _mount(mounts: list[str], fstype: str, option: str | None) -> tuple[Path, str] | None:
    """The mount point and root of the first `fstype` mount (with super option `option`)."""
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if fields[dash + 1] != fstype:
            continue
        if option is not None and option not in fields[dash + 3].split(","):
            continue
        return Path(_unescape(fields[4])), _unescape(fields[3])
    return None


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _below(mount: tuple[Path, str], path: str) -> Path | None:
    point, root = mount
    relative = os.path.relpath(path, root)
    if relative.startswith(".."):
        return None  # the process's cgroup is outside what this mount shows
    return point if relative == "." else point / relative


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def _v2(lines: list[str], mounts: list[str]) -> MemoryCgroups | None:
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    mount = _mount(mounts, "cgroup2", None)
    if path is None or mount is None:
        return None
    own = _below(mount, path)
    if own is None or not _writable(own):
        return None
    try:
        if "memory" not in (own / "cgroup.controllers").read_text().split():
            return None
        if "memory" not in (own / "cgroup.subtree_control").read_text().split():
            leaf = own / "daemon"
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text("0\n")
            (own / "cgroup.subtree_control").write_text("+memory\n")
    except OSError:
        return None
    return MemoryCgroups(own, 2)


def _v1(lines: list[str], mounts: list[str]) -> MemoryCgroups | None:
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            mount = _mount(mounts, "cgroup", "memory")
            own = None if mount is None else _below(mount, parts[2])
            return MemoryCgroups(own, 1) if own is not None and _writable(own) else None
    return None
