"""Run a command under the kernel-side sandbox a systemd service unit asks for, without systemd.

`python unit_sandbox.py UNIT COMMAND...` reads the unit's `[Service]` lines and, as
systemd's executor would before it runs the service: moves to a network namespace of its
own (`PrivateNetwork=`), gives up every capability (an empty `CapabilityBoundingSet=`: the
uid stays, so the test's interpreter stays readable), sets no_new_privs
(`NoNewPrivileges=`), and installs a seccomp filter made of `SystemCallFilter=` (the sets
expanded by `systemd-analyze syscall-filter`, denials answered with
`SystemCallErrorNumber=`), `SystemCallArchitectures=native`, `MemoryDenyWriteExecute=`
(the rules of systemd's seccomp version: no mapping both writable and executable, no
mprotect/pkey_mprotect adding PROT_EXEC, no SHM_EXEC) and `RestrictAddressFamilies=`; then
it execs COMMAND, keeping every inherited descriptor (the socket systemd-socket-activate
passes). x86-64 only; it imports only the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import socket
import struct
import subprocess
import sys
from pathlib import Path

UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
AUDIT_ARCH_X86_64 = 0xC000003E
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
CLONE_NEWNET = 0x40000000
PR_CAPBSET_DROP = 24
CAP_LAST_CAP = Path("/proc/sys/kernel/cap_last_cap")
CAPABILITY_VERSION_3 = 0x20080522
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
LD_ABS_W, JEQ_K, AND_K, RET_K, JA = 0x20, 0x15, 0x54, 0x06, 0x05
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET, ARG2_OFFSET = 0, 4, 16, 32
PROT_WRITE, PROT_EXEC, SHM_EXEC = 2, 4, 0o100000


def service_lines(unit: Path) -> list[tuple[str, str]]:
    """(key, value) of each line of the unit's [Service] section, in order."""
    lines, section = [], ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            lines.append((key, value))
    return lines


def numbers() -> dict[str, int]:
    """x86-64 syscall numbers by name."""
    found = re.findall(r"#define __NR_(\w+) (\d+)", UNISTD.read_text())
    return {name: int(number) for name, number in found}


def expand(names: list[str], seen: set[str] | None = None) -> set[str]:
    """Syscall names, with every `@set` expanded the way systemd expands it."""
    seen = set() if seen is None else seen
    calls: set[str] = set()
    for name in names:
        if not name.startswith("@"):
            calls.add(name)
        elif name not in seen:
            seen.add(name)
            listed = subprocess.run(
                ["systemd-analyze", "syscall-filter", "--no-pager", name],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()[1:]
            members = [m.strip() for m in listed if m.strip() and not m.strip().startswith("#")]
            calls |= expand(members, seen)
    return calls


class Program:
    """A classic BPF program whose jumps name labels further on, resolved when packed."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int | str, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((code, jt, jf, k))

    def jump(self, target: str) -> None:
        self.op(JA, 0, target)

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def packed(self) -> bytes:
        out = b""
        for at, (code, jt, jf, k) in enumerate(self.code):
            t, f = (self.labels[j] - at - 1 if isinstance(j, str) else j for j in (jt, jf))
            jump = (0, 0, t) if code == JA else (t, f, k)  # JA's offset is its k
            out += struct.pack("HBBI", code, *jump)
        return out


def build(lines: list[tuple[str, str]]) -> bytes:
    """The seccomp program for the unit's lines."""
    values: dict[str, list[str]] = {}
    for key, value in lines:
        values.setdefault(key, []).append(value)
    nr = numbers()
    listed: set[str] = set()
    allow_list = None  # the first SystemCallFilter= line decides: an allow list or a deny list
    for value in values.get("SystemCallFilter", []):
        names = expand(value.lstrip("~").split())
        if allow_list is None:
            allow_list = not value.startswith("~")
        listed = listed - names if value.startswith("~") == allow_list else listed | names
    denied = RET_ERRNO | getattr(errno, values.get("SystemCallErrorNumber", ["EPERM"])[-1])
    p = Program()
    p.op(LD_ABS_W, ARCH_OFFSET)
    p.op(JEQ_K, AUDIT_ARCH_X86_64, 1, 0)
    p.op(RET_K, denied)
    p.op(LD_ABS_W, NR_OFFSET)
    if values.get("MemoryDenyWriteExecute", ["no"])[-1] == "yes":
        p.op(JEQ_K, nr["mmap"], "mmap")
        p.op(JEQ_K, nr["mprotect"], "mprotect")
        p.op(JEQ_K, nr["pkey_mprotect"], "mprotect")
        p.op(JEQ_K, nr["shmat"], "shmat")
    families = " ".join(values.get("RestrictAddressFamilies", [])).split()
    if families:
        p.op(JEQ_K, nr["socket"], "socket")
    p.jump("list")
    for name, mask in (("mmap", PROT_WRITE | PROT_EXEC), ("mprotect", PROT_EXEC)):
        p.label(name)
        p.op(LD_ABS_W, ARG2_OFFSET)
        p.op(AND_K, mask)
        p.op(JEQ_K, mask, "eperm", "list")
    p.label("shmat")
    p.op(LD_ABS_W, ARG2_OFFSET)
    p.op(AND_K, SHM_EXEC)
    p.op(JEQ_K, SHM_EXEC, "eperm", "list")
    p.label("socket")
    p.op(LD_ABS_W, ARG0_OFFSET)
    for family in families:
        p.op(JEQ_K, int(getattr(socket, family)), "list")
    p.op(RET_K, RET_ERRNO | errno.EAFNOSUPPORT)
    p.label("eperm")
    p.op(RET_K, RET_ERRNO | errno.EPERM)
    p.label("list")
    p.op(LD_ABS_W, NR_OFFSET)
    for number in sorted(nr[name] for name in listed if name in nr):
        p.op(JEQ_K, number, 0, 1)
        p.op(RET_K, RET_ALLOW if allow_list else denied)
    p.op(RET_K, denied if allow_list else RET_ALLOW)
    return p.packed()


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def drop_capabilities(libc: ctypes.CDLL) -> None:
    """Empty the bounding set and the effective, permitted and inheritable sets."""
    for capability in range(int(CAP_LAST_CAP.read_text()) + 1):
        if libc.prctl(PR_CAPBSET_DROP, capability, None, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {capability}")
    header = struct.pack("Ii", CAPABILITY_VERSION_3, 0)
    if libc.syscall(numbers()["capset"], header, bytes(24)) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def main() -> None:
    unit, command = Path(sys.argv[1]), sys.argv[2:]
    lines = service_lines(unit)
    program = build(lines)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    if ("PrivateNetwork", "yes") in lines and libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    bounding = [value for key, value in lines if key == "CapabilityBoundingSet"]
    if bounding:
        if bounding != [""]:
            raise SystemExit("only an empty CapabilityBoundingSet= is emulated here")
        drop_capabilities(libc)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _Fprog(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
