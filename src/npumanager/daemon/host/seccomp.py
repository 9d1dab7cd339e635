"""The system calls a model host never needs, refused by a seccomp filter.

A host parses and runs models: it reads descriptors it was given, maps memory, runs
threads and talks on its one Unix socket. It never needs to trace or read other
processes, mount, change namespaces, load kernel modules or BPF programs, use keys, or
open a network socket, so those calls fail with EPERM (`DENIED`; `socket` for any family
but AF_UNIX). Calls of another ABI on the same machine (x32, i386) end the process. The
filter is built for x86-64; elsewhere `install` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import platform
import struct

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_LD_W_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_RET = 0x06
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_AF_UNIX = 1

DENIED = {
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "unshare": 272,
    "setns": 308,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "bpf": 321,
    "perf_event_open": 298,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "userfaultfd": 323,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "acct": 163,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
"""The x86-64 numbers of the calls refused with EPERM."""
_SOCKET = 41


class _Filter(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def program() -> bytes:
    """The filter as classic BPF instructions (x86-64)."""
    code: list[tuple[int, int, int, int]] = []

    def op(kind: int, k: int, jt: int = 0, jf: int = 0) -> None:
        code.append((kind, jt, jf, k))

    denied = sorted(DENIED.values())
    # layout: arch check (3), nr (1), x32 (1), denied (n), socket (1), allow (1),
    # socket's family (2), deny (1)
    op(_LD_W_ABS, 4)
    op(_JEQ, _AUDIT_ARCH_X86_64, jt=1)
    op(_RET, _RET_KILL_PROCESS)
    op(_LD_W_ABS, 0)
    after = len(denied) + 5  # from the x32 check to the deny at the end
    op(_JGE, _X32_BIT, jt=after)
    for index, number in enumerate(denied):
        op(_JEQ, number, jt=len(denied) - index + 4)
    op(_JEQ, _SOCKET, jt=1)
    op(_RET, _RET_ALLOW)
    op(_LD_W_ABS, 16)  # the low half of the first argument: the family
    op(_JEQ, _AF_UNIX, jt=0, jf=1)
    op(_RET, _RET_ALLOW)
    op(_RET, _RET_ERRNO | errno.EPERM)
    return b"".join(struct.pack("<HBBI", kind, jt, jf, k) for kind, jt, jf, k in code)


def install() -> str:
    """Install the filter on this process (no-new-privileges must be set); what was done."""
    if platform.machine() != "x86_64":
        return f"no seccomp filter on {platform.machine()} (built for x86_64 only)"
    code = program()
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _Filter(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {errno.errorcode.get(err, err)}")
    return f"seccomp filter: {len(DENIED)} calls refused, sockets AF_UNIX only"
