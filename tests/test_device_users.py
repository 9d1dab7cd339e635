"""Who else uses the device: processes holding an accelerator node, found in fake /proc trees
whose fdinfo files are in the kernel's format (the examples of its DRM usage-stats documents,
and what the DRM core prints for an accel device), by hypothesis over the key grammar, and
through the real /proc with a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.proc_trees import descriptor, device_node, process
from npumanager.apps.device_users import (
    MAX_PROC_FILE_BYTES,
    MEMORY_KINDS,
    U64_MAX,
    DeviceScan,
    DeviceUser,
    device_nodes,
    parse_fdinfo,
    scan,
)
from npumanager.apps.identity import app_of_cgroup, cgroup_of_pid

RENDER = "/dev/dri/renderD128"
ACCEL = "/dev/accel/accel0"

I915 = """drm-driver: i915
drm-pdev:   0000:00:02.0
drm-client-id:      7
drm-engine-render:  9288864723 ns
drm-engine-copy:    2035071108 ns
drm-engine-video:   0 ns
drm-engine-capacity-video:   2
drm-engine-video-enhance:   0 ns
"""
"""The example of Documentation/gpu/i915.rst (after pos, flags and mnt_id)."""

XE = """drm-driver:     xe
drm-client-id:  3
drm-pdev:       0000:03:00.0
drm-total-system:       0
drm-shared-system:      0
drm-active-system:      0
drm-resident-system:    0
drm-purgeable-system:   0
drm-total-gtt:  192 KiB
drm-shared-gtt: 0
drm-active-gtt: 0
drm-resident-gtt:       192 KiB
drm-total-vram0:        23992 KiB
drm-shared-vram0:       16 MiB
drm-active-vram0:       0
drm-resident-vram0:     23992 KiB
drm-cycles-rcs: 28257900
drm-total-cycles-rcs:   7655183225
drm-cycles-ccs: 0
drm-total-cycles-ccs:   7655183225
drm-engine-capacity-ccs:        4
"""
"""Part of the example of Documentation/gpu/xe/xe-drm-usage-stats.rst."""

AMDGPU = """drm-driver:\tamdgpu
drm-pdev:\t0000:03:00.0
drm-client-id:\t42
pasid:\t32775
drm-total-gtt:\t4 MiB
drm-shared-gtt:\t0
drm-resident-gtt:\t4 MiB
drm-total-vram:\t96100 KiB
drm-shared-vram:\t0
drm-resident-vram:\t96100 KiB
drm-memory-vram:\t96100 KiB
drm-memory-gtt: \t4096 KiB
drm-memory-cpu: \t2 KiB
amd-evicted-vram:\t0 KiB
amd-requested-vram:\t96100 KiB
drm-engine-gfx:\t1319405040 ns
drm-engine-compute:\t0 ns
"""
"""amdgpu as amdgpu_fdinfo.c prints it: the core's memory stats, the deprecated drm-memory-
aliases (``drm-memory-gtt: \\t``, a space before the tab), and keys of its own."""

ACCEL_VPU = """drm-driver:\tintel_vpu
drm-client-id:\t5
drm-pdev:\t0000:00:0b.0
drm-total-memory:\t12 MiB
drm-shared-memory:\t0
drm-active-memory:\t0
drm-resident-memory:\t8192 KiB
drm-purgeable-memory:\t0
"""
"""An accel device's client as the DRM core prints it (drm_show_fdinfo, then
drm_print_memory_stats: ``drm-<kind>-<region>:\\t<n>[ KiB| MiB]``)."""

MiB = 1024 * 1024


def only(found: DeviceScan) -> DeviceUser:
    assert len(found.users) == 1, found
    return found.users[0]


def test_an_i915_client_with_its_engines_and_app(tmp_path: Path) -> None:
    process(tmp_path, 4242, uid=1000, euid=0, comm=b"totem")
    descriptor(tmp_path, 4242, 0, "/dev/null")
    descriptor(tmp_path, 4242, 9, RENDER, I915)
    user = only(scan([RENDER], root=tmp_path))
    assert (user.pid, user.uid, user.comm, user.node) == (4242, 1000, "totem", RENDER)
    assert user.app_id == "org.example.Viewer"
    assert user.cgroup is not None and user.cgroup.endswith("Viewer-4242.scope")
    assert (user.driver, user.pdev, user.client_id) == ("i915", "0000:00:02.0", 7)
    assert user.engines == {
        "render": 9288864723,
        "copy": 2035071108,
        "video": 0,
        "video-enhance": 0,
    }
    assert user.capacity == {"video": 2}
    assert user.memory == {} and user.resident_bytes() == 0


def test_xe_memory_regions_and_cycles() -> None:
    client, garbled = parse_fdinfo(XE.encode())
    assert garbled == 0
    assert client.memory["vram0"] == {
        "total": 23992 * 1024,
        "shared": 16 * MiB,
        "active": 0,
        "resident": 23992 * 1024,
    }
    assert client.memory["system"] == dict.fromkeys(MEMORY_KINDS, 0)
    assert "cycles-rcs" not in client.memory  # drm-total-cycles-rcs is no region
    assert client.cycles == {"rcs": 28257900, "ccs": 0}
    assert client.total_cycles == {"rcs": 7655183225, "ccs": 7655183225}
    assert client.capacity == {"ccs": 4}
    assert client.resident_bytes() == (23992 + 192) * 1024


def test_amdgpu_legacy_memory_is_resident_and_driver_keys_are_ignored() -> None:
    client, garbled = parse_fdinfo(AMDGPU.encode())
    assert garbled == 0
    assert client.memory["vram"] == {"total": 96100 * 1024, "shared": 0, "resident": 96100 * 1024}
    # an explicit drm-resident- wins over the deprecated alias; alone, the alias is resident
    assert client.memory["gtt"]["resident"] == 4 * MiB
    assert client.memory["cpu"] == {"resident": 2048}
    assert client.engines == {"gfx": 1319405040, "compute": 0}
    assert client.resident_bytes() == 96100 * 1024 + 4 * MiB + 2048


def test_an_accel_client_and_the_machines_nodes(tmp_path: Path) -> None:
    for node in (ACCEL, "/dev/accel/accel10", "/dev/accel/accel2", RENDER, "/dev/dri/card0"):
        device_node(tmp_path, node)
    device_node(tmp_path, "/dev/dri/by-path/pci-0000:00:02.0-render")
    nodes = device_nodes(tmp_path)
    assert nodes == (ACCEL, "/dev/accel/accel2", "/dev/accel/accel10", RENDER)
    assert device_nodes(tmp_path / "nowhere") == ()
    process(tmp_path, 77, uid=998, comm=b"ov-bench", cgroup="/system.slice/bench.service")
    descriptor(tmp_path, 77, 4, ACCEL, ACCEL_VPU)
    user = only(scan(nodes, root=tmp_path))
    assert (user.driver, user.client_id, user.app_id) == ("intel_vpu", 5, "bench.service")
    assert user.memory == {
        "memory": {
            "total": 12 * MiB,
            "shared": 0,
            "active": 0,
            "resident": 8 * MiB,
            "purgeable": 0,
        }
    }
    assert user.resident_bytes() == 8 * MiB


def test_duplicated_descriptors_are_one_user_and_other_opens_are_others(tmp_path: Path) -> None:
    process(tmp_path, 10)
    for fd in (3, 7, 100):  # dup, dup2 and one passed over a socket: one open file
        descriptor(tmp_path, 10, fd, ACCEL, ACCEL_VPU)
    descriptor(tmp_path, 10, 8, ACCEL, ACCEL_VPU.replace("client-id:\t5", "client-id:\t6"))
    descriptor(tmp_path, 10, 9, RENDER, I915)
    found = scan([ACCEL, RENDER], root=tmp_path)
    assert sorted((u.node, u.client_id) for u in found.users) == [
        (ACCEL, 5),
        (ACCEL, 6),
        (RENDER, 7),
    ]
    assert found.skipped == {} and not found.truncated


def test_a_client_shared_by_forked_processes_counts_its_memory_once(tmp_path: Path) -> None:
    for pid in (20, 21):
        process(tmp_path, pid)
        descriptor(tmp_path, pid, 5, ACCEL, ACCEL_VPU)
    found = scan([ACCEL], root=tmp_path)
    assert sorted(u.pid for u in found.users) == [20, 21]
    assert found.resident_bytes() == 8 * MiB


def test_the_managers_own_processes_are_excluded(tmp_path: Path) -> None:
    for pid in (30, 31, 32):
        process(tmp_path, pid)
        descriptor(tmp_path, pid, 5, ACCEL, ACCEL_VPU)
    found = scan([ACCEL], root=tmp_path, exclude_pids=[30, 32])
    assert [u.pid for u in found.users] == [31]


def test_no_app_cgroup_falls_back_to_the_uid(tmp_path: Path) -> None:
    process(tmp_path, 40, uid=1001, cgroup="/user.slice/user-1001.slice/session-2.scope")
    process(tmp_path, 41, uid=1002, cgroup=None)  # no v2 line to read
    for pid in (40, 41):
        descriptor(tmp_path, pid, 3, ACCEL)
    found = scan([ACCEL], root=tmp_path)
    assert sorted((u.app_id, u.cgroup is None) for u in found.users) == [
        ("uid:1001", False),
        ("uid:1002", True),
    ]
    # a node with no usage stats: a user with no driver, engines or memory
    assert all(u.driver is None and u.client_id is None and not u.engines for u in found.users)


def test_a_process_that_vanished_mid_scan_is_skipped_and_counted(tmp_path: Path) -> None:
    gone = process(tmp_path, 50)
    descriptor(tmp_path, 50, 3, ACCEL, ACCEL_VPU)
    (gone / "status").unlink()  # it exited after its descriptors were listed
    closed = process(tmp_path, 51)
    descriptor(tmp_path, 51, 3, ACCEL, ACCEL_VPU)
    (closed / "fdinfo" / "3").unlink()  # the descriptor was closed after readlink
    process(tmp_path, 52)
    (tmp_path / "proc" / "52" / "fd").rmdir()  # gone before its descriptors were listed
    process(tmp_path, 53)
    descriptor(tmp_path, 53, 3, ACCEL, ACCEL_VPU)
    (tmp_path / "proc" / "not-a-pid").mkdir()
    found = scan([ACCEL], root=tmp_path)
    assert [u.pid for u in found.users] == [53]
    assert found.skipped == {"vanished": 3}


def test_a_permission_error_is_skipped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As hidepid=1 (or another uid's process, to anyone but root) answers: in process, for a
    fake tree; `test_real_proc_as_an_unprivileged_user` meets the kernel's own refusal."""
    for pid in (60, 61):
        process(tmp_path, pid)
        descriptor(tmp_path, pid, 3, ACCEL, ACCEL_VPU)
    hidden = str(tmp_path / "proc" / "60" / "fd")
    real_scandir = os.scandir

    def scandir(path: str | os.PathLike[str]) -> object:
        if os.fspath(path) == hidden:
            raise PermissionError(13, "Permission denied", hidden)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = scan([ACCEL], root=tmp_path)
    assert [u.pid for u in found.users] == [61]
    assert found.skipped == {"denied": 1}


def test_garbage_is_skipped_line_by_line(tmp_path: Path) -> None:
    garbage = (
        b"drm-driver:\tintel_vpu\n"
        b"drm-client-id:\tseven\n"  # not a number
        b"drm-engine-compute:\t12 us\n"  # a unit engines do not have
        b"drm-engine-copy:\t12\n"  # engines are in ns, said so
        b"drm-total-memory:\t3 GiB\n"  # memory is in bytes, KiB or MiB
        b"drm-resident-memory:\t18446744073709551616\n"  # a u64 cannot hold it
        b"drm-shared-memory:\t18014398509481984 MiB\n"  # nor this once in bytes
        b"drm-engine-capacity-compute:\t0\n"  # zero capacity is not allowed
        b"drm-total-:\t5\n"  # no region
        b"drm-purgeable-\xff\xfe:\t1\n"  # not UTF-8
        b"drm-active memory:\t1\n"  # whitespace in a key
        b"drm-active-memory\n"  # no colon
        b"drm-engine-render:\t" + b"9" * 5000 + b" ns\n"  # more digits than a u64 has
        b"drm-engine-npu:\t1000 ns\n"
    )
    process(tmp_path, 70, comm=b"\xffbad")
    descriptor(tmp_path, 70, 3, ACCEL, garbage)
    found = scan([ACCEL], root=tmp_path)
    user = only(found)
    assert (user.driver, user.client_id, user.comm) == ("intel_vpu", None, "\\xffbad")
    assert user.engines == {"npu": 1000} and user.memory == {} and user.capacity == {}
    assert found.skipped == {"garbled": 12}


def test_a_garbled_status_skips_the_process(tmp_path: Path) -> None:
    base = process(tmp_path, 71)
    descriptor(tmp_path, 71, 3, ACCEL, ACCEL_VPU)
    (base / "status").write_bytes(b"Name:\tx\nUid:\t-1\t0\t0\t0\n")
    found = scan([ACCEL], root=tmp_path)
    assert found.users == () and found.skipped == {"garbled": 1}


def test_a_long_fdinfo_is_cut_at_a_line(tmp_path: Path) -> None:
    """Past `MAX_PROC_FILE_BYTES` the cut never turns a longer number into a shorter one."""
    head = len(b"pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t1085\n")
    pad = b"x" * (MAX_PROC_FILE_BYTES - head - 20) + b"\n"
    process(tmp_path, 80)
    descriptor(tmp_path, 80, 3, ACCEL, pad + b"drm-client-id:\t123456789012345\n")
    assert only(scan([ACCEL], root=tmp_path)).client_id is None


def test_the_work_is_bounded(tmp_path: Path) -> None:
    for pid in range(100, 110):
        process(tmp_path, pid)
        for fd in range(3):
            descriptor(tmp_path, pid, fd, ACCEL if fd == 2 else "/dev/null", ACCEL_VPU)
    everything = scan([ACCEL], root=tmp_path)
    assert len(everything.users) == 10 and not everything.truncated
    bounded = scan([ACCEL], root=tmp_path, limit=9)  # a process costs 1, each descriptor 1
    assert bounded.truncated and 1 <= len(bounded.users) <= 2
    assert scan([], root=tmp_path).users == ()  # nothing to look for: nothing read


# --- the key grammar, by hypothesis --------------------------------------------------------

KEYSTR = st.text(
    st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters=":"),
    min_size=1,
    max_size=12,
)
"""A <keystr>: printable, no whitespace, no delimiter."""
GAP = st.text(" \t", max_size=3)
UNITS = {"": 1, "KiB": 1024, "MiB": MiB}


@given(st.binary(max_size=2000))
def test_any_bytes_never_raise(data: bytes) -> None:
    client, garbled = parse_fdinfo(data)
    assert garbled <= data.count(b"drm-")
    numbers = [*client.engines.values(), *client.cycles.values(), *client.capacity.values()]
    numbers += [n for kinds in client.memory.values() for n in kinds.values()]
    assert all(0 <= n <= U64_MAX for n in numbers)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["drm-driver", "drm-client-id", "drm-engine-", "drm-total-", "drm-"]),
            st.text(max_size=12),
            st.text(max_size=30),
        ),
        max_size=12,
    )
)
def test_garbled_lines_never_raise_even_in_a_scan(lines: list[tuple[str, str, str]]) -> None:
    text = "".join(f"{key}{name}:{value}\n" for key, name, value in lines)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        process(root, 90)
        descriptor(root, 90, 3, ACCEL, text.encode(errors="surrogateescape"))
        found = scan([ACCEL], root=root)
    assert [u.pid for u in found.users] == [90]
    assert found.skipped.get("garbled", 0) <= len(lines)


@given(
    kind=st.sampled_from(MEMORY_KINDS),
    region=KEYSTR.filter(lambda region: not region.startswith("cycles-")),
    value=st.integers(0, U64_MAX),
    unit=st.sampled_from(sorted(UNITS)),
    gap=GAP,
)
def test_well_formed_memory_parses_to_bytes(
    kind: str, region: str, value: int, unit: str, gap: str
) -> None:
    line = f"drm-{kind}-{region}:{gap}{value}{' ' + unit if unit else ''}\n"
    client, garbled = parse_fdinfo(line.encode())
    in_bytes = value * UNITS[unit]
    if in_bytes > U64_MAX:
        assert (client.memory, garbled) == ({}, 1)
    else:
        assert (client.memory, garbled) == ({region: {kind: in_bytes}}, 0)


@given(
    name=KEYSTR.filter(lambda name: not name.startswith("capacity-")),
    value=st.integers(0, 2 * U64_MAX),
    gap=GAP,
)
def test_well_formed_engines_parse_to_ns(name: str, value: int, gap: str) -> None:
    client, garbled = parse_fdinfo(f"drm-engine-{name}:{gap}{value} ns".encode())
    assert client.engines == ({name: value} if value <= U64_MAX else {})
    assert garbled == (value > U64_MAX)


@given(
    unit=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=5),
    value=st.integers(0, 10**6),
)
def test_units_it_does_not_know_are_garbled(unit: str, value: int) -> None:
    client, garbled = parse_fdinfo(
        f"drm-engine-npu: {value} {unit}\ndrm-resident-vram: {value} {unit}\n".encode()
    )
    assert client.engines == ({"npu": value} if unit == "ns" else {})
    known = UNITS.get(unit)
    assert client.memory == ({"vram": {"resident": value * known}} if known else {})
    assert garbled == (unit != "ns") + (known is None)


# --- the real /proc ---------------------------------------------------------------------


def expected_app(pid: int, uid: int) -> str:
    cgroup = cgroup_of_pid(pid)
    app = app_of_cgroup(cgroup) if cgroup is not None else None
    return app.app_id if app is not None else f"uid:{uid}"


def test_a_real_process_holding_a_real_node_is_found() -> None:
    """No DRM device exists on this machine (no /dev/accel, no /dev/dri): a real child holding
    /dev/null stands in for a process holding the accelerator, found through the real /proc
    with its pid, real uid (another user's where the test runs as root) and app id. /dev/null's
    fdinfo has no drm- keys: the child is a device user with no engines or memory."""
    as_root = os.geteuid() == 0
    uid = 65534 if as_root else os.getuid()
    extra = {"user": uid, "group": uid, "extra_groups": []} if as_root else {}
    child = subprocess.Popen(
        ["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, **extra
    )  # lives until its stdin closes; its stdout is /dev/null
    try:
        found = scan(["/dev/null"])
        mine = [u for u in found.users if u.pid == child.pid]
        assert len(mine) == 1, found
        user = mine[0]
        assert (user.uid, user.comm, user.node) == (uid, "cat", "/dev/null")
        assert user.app_id == expected_app(child.pid, uid)
        assert (user.driver, user.client_id, user.engines, user.memory) == (None, None, {}, {})
        assert os.getpid() not in {
            u.pid for u in scan(["/dev/null"], exclude_pids=[os.getpid()]).users
        }
        assert child.pid not in {u.pid for u in scan(["/dev/null"], exclude_pids=[child.pid]).users}
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


UNPRIVILEGED = """
import json, os
from npumanager.apps.device_users import scan
held = open("/dev/null")
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
found = scan(["/dev/null"])
print(json.dumps({
    "pid": os.getpid(),
    "found": [[u.pid, u.uid] for u in found.users],
    "skipped": found.skipped,
}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="drops from root to uid 65534; needs root")
def test_real_proc_as_an_unprivileged_user() -> None:
    """The kernel's own refusal: an unprivileged scanner may not read root's descriptors, so
    those are counted as denied, and its own process is still found."""
    out = subprocess.run(
        [sys.executable, "-c", UNPRIVILEGED], capture_output=True, check=True, text=True
    )
    result = json.loads(out.stdout)
    assert [result["pid"], 65534] in result["found"]
    assert result["skipped"].get("denied", 0) >= 1  # this test's own process, at least
