"""A throwaway cgroup v2 tree below this process's own cgroup, with real processes moved in
(as root): for the tests of apps told apart by their cgroups."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from npumanager.apps.identity import cgroup_of_pid, v2_mount

WAITER = "import sys; sys.stdin.buffer.read()"
"""A child that lives until its stdin is closed: no sleeping, no timing."""
SCOPE = "app.slice/app-gnome-org.example.Cam-42.scope"


@dataclass
class CgroupTree:
    """A throwaway cgroup tree below this process's own cgroup, and the children moved in."""

    home: Path
    home_path: str
    root: Path
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def path(self, rel: str) -> str:
        """The path ``/proc/PID/cgroup`` gives for a cgroup of the tree."""
        return self.home_path.rstrip("/") + "/" + str((self.root / rel).relative_to(self.home))

    def move(self, pid: int, rel: str) -> None:
        (self.root / rel).mkdir(parents=True, exist_ok=True)
        (self.root / rel / "cgroup.procs").write_text(str(pid))

    def spawn(self, rel: str, *args: str, code: str = WAITER) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE)
        self.children.append(child)
        self.move(child.pid, rel)
        return child

    def clean(self) -> None:
        """Every process back to our cgroup, the children ended, the cgroups removed leaf-first."""
        for folder, _, _ in os.walk(self.root, topdown=False):
            for pid in (Path(folder) / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                    (self.home / "cgroup.procs").write_text(pid)
        for child in self.children:
            child.kill()
            child.wait()
            if child.stdin is not None:
                child.stdin.close()
        for folder, _, _ in os.walk(self.root, topdown=False):
            os.rmdir(folder)


def cgroup_tree() -> Iterator[CgroupTree]:
    if os.geteuid() != 0:
        pytest.skip("making cgroups and moving processes into them needs root")
    mount = v2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy is mounted (see /proc/self/mountinfo)")
    home_path = cgroup_of_pid(os.getpid())
    if home_path is None:
        pytest.skip("this process has no cgroup v2 line in /proc/self/cgroup")
    home = mount / home_path.lstrip("/")
    root = home / f"npu-test-{secrets.token_hex(4)}"
    try:
        root.mkdir()
    except OSError as error:
        pytest.skip(f"cannot make a cgroup under {home}: {error.strerror}")
    tree = CgroupTree(home, home_path, root)
    try:
        yield tree
    finally:
        tree.clean()
