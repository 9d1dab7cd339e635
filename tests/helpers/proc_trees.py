"""Fake procfs and devfs trees for the tests of who else uses the device: processes with their
status, comm and cgroup, descriptors as symlinks to a device path (the target need not exist),
and each descriptor's fdinfo in the kernel's format."""

from __future__ import annotations

import os
from pathlib import Path

from helpers.health_trees import write

USER_SCOPE = "/user.slice/user-1000.slice/user@1000.service/app.slice"


def process(
    root: Path,
    pid: int,
    *,
    uid: int = 1000,
    euid: int | None = None,
    comm: bytes = b"app",
    cgroup: str | None = USER_SCOPE + "/app-gnome-org.example.Viewer-4242.scope",
) -> Path:
    """``/proc/PID`` with its status (real uid first, then the effective one), comm, and
    cgroup file (a v2 line; none with ``cgroup=None``); its folder."""
    effective = uid if euid is None else euid
    name = comm.decode(errors="replace")
    status = (
        f"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\n"
        f"PPid:\t1\nUid:\t{uid}\t{effective}\t{effective}\t{effective}\n"
        f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
    )
    base = f"/proc/{pid}"
    write(root, f"{base}/status", status)
    (root / base.lstrip("/") / "comm").write_bytes(comm + b"\n")
    if cgroup is not None:
        write(root, f"{base}/cgroup", f"0::{cgroup}\n")
    (root / base.lstrip("/") / "fd").mkdir(exist_ok=True)
    (root / base.lstrip("/") / "fdinfo").mkdir(exist_ok=True)
    return root / base.lstrip("/")


def descriptor(root: Path, pid: int, fd: int, target: str, fdinfo: str | bytes = "") -> None:
    """Descriptor ``fd`` of ``pid``: a symlink to the machine path ``target``, and its fdinfo
    (``pos``, ``flags``, ``mnt_id`` and ``ino`` first, as the kernel prints them)."""
    link = root / "proc" / str(pid) / "fd" / str(fd)
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)
    head = b"pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t1085\n"
    body = fdinfo.encode() if isinstance(fdinfo, str) else fdinfo
    info = root / "proc" / str(pid) / "fdinfo" / str(fd)
    info.parent.mkdir(parents=True, exist_ok=True)
    info.write_bytes(head + body)


def device_node(root: Path, path: str) -> None:
    """A stand-in for a device node (a plain file: only its name counts)."""
    write(root, path, "")
