"""A model host's memory held to its client's grants by a memory cgroup of its own
(`daemon.host.memory`): found from /proc (fake trees for both cgroup versions), enforced by
the kernel (a real v1 memory cgroup where this machine has one, as root), and through a real
daemon: a host that outgrows its grants is killed alone and its app is told why.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from helpers.daemon_support import BACKGROUND_UID, FOREGROUND_UID, DaemonProcess
from npumanager.daemon.host.memory import (
    HELD_FACTOR,
    HOST_MEMORY_BASE_BYTES,
    LOADING_FACTOR,
    HostCgroup,
    MemoryCgroups,
    host_limit,
)

MIB = 1 << 20


def fake_proc(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp_path / "proc-self"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


def test_the_limit_is_the_hosts_base_and_its_models_weights() -> None:
    assert host_limit(0, 0) == HOST_MEMORY_BASE_BYTES
    assert host_limit(10 * MIB, 0) == HOST_MEMORY_BASE_BYTES + HELD_FACTOR * 10 * MIB
    assert host_limit(10 * MIB, 4 * MIB) == host_limit(10 * MIB, 0) + LOADING_FACTOR * 4 * MIB


def test_v1_is_found_under_the_processs_own_memory_cgroup(tmp_path: Path) -> None:
    mount = tmp_path / "memory"
    (mount / "box" / "daemon").mkdir(parents=True)
    proc = fake_proc(
        tmp_path,
        "5:devices:/\n4:memory:/box/daemon\n0::/\n",
        f"35 31 0:32 / {mount} rw,relatime - cgroup cgroup rw,memory\n"
        f"41 31 0:38 / {tmp_path / 'unified'} rw,relatime - cgroup2 cgroup2 rw\n",
    )
    assert MemoryCgroups.find(proc) == MemoryCgroups(mount / "box" / "daemon", 1)


def test_a_mount_rooted_below_slash_is_followed(tmp_path: Path) -> None:
    mount = tmp_path / "memory"
    (mount / "daemon").mkdir(parents=True)
    proc = fake_proc(
        tmp_path,
        "4:memory,hugetlb:/box/daemon\n",
        f"35 31 0:32 /box {mount} rw - cgroup cgroup rw,hugetlb,memory\n",
    )
    assert MemoryCgroups.find(proc) == MemoryCgroups(mount / "daemon", 1)


def test_no_memory_hierarchy_or_a_cgroup_outside_the_mount_is_no_limit(tmp_path: Path) -> None:
    mount = tmp_path / "memory"
    mount.mkdir()
    no_memory = fake_proc(tmp_path, "0::/\n", f"41 31 0:38 / {tmp_path} rw - cgroup2 cgroup2 rw\n")
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    assert MemoryCgroups.find(no_memory) is None
    outside = tmp_path / "outside"
    outside.mkdir()
    proc = fake_proc(
        outside, "4:memory:/elsewhere\n", f"35 31 0:32 /box {mount} rw - cgroup cgroup rw,memory\n"
    )
    assert MemoryCgroups.find(proc) is None


def test_v2_moves_the_process_into_a_leaf_and_gives_its_children_the_controller(
    tmp_path: Path,
) -> None:
    """As systemd's delegation expects: a cgroup whose children have controllers holds no
    processes itself, so the daemon moves into `daemon/` beside its hosts (a fake tree:
    this machine's cgroup v2 has no memory controller to run it on)."""
    unified = tmp_path / "unified"
    own = unified / "system.slice" / "npu-manager.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("\n")
    proc = fake_proc(
        tmp_path,
        "0::/system.slice/npu-manager.service\n",
        f"41 31 0:38 / {unified} rw - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    assert MemoryCgroups.find(proc) == MemoryCgroups(own, 2)
    assert (own / "daemon" / "cgroup.procs").read_text() == "0\n"
    assert (own / "cgroup.subtree_control").read_text() == "+memory\n"


def test_v2_without_the_memory_controller_is_no_limit(tmp_path: Path) -> None:
    own = tmp_path / "unified" / "user.slice"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu pids\n")
    mountinfo = f"41 31 0:38 / {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw\n"
    proc = fake_proc(tmp_path, "0::/user.slice\n", mountinfo)
    assert MemoryCgroups.find(proc) is None
    assert not (own / "daemon").exists()


def test_a_v2_limit_under_the_usage_is_refused_rather_than_an_oom_kill(tmp_path: Path) -> None:
    cgroup = HostCgroup(tmp_path, 2)
    (tmp_path / "memory.current").write_text("300000000\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup.limit() is None
    assert not cgroup.set_limit(200_000_000)
    assert cgroup.limit() is None
    assert cgroup.set_limit(400_000_000)
    assert cgroup.limit() == 400_000_000
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cgroup.oom_kills() == 1


REAL = MemoryCgroups.find()
needs_real_cgroup = pytest.mark.skipif(
    REAL is None or os.geteuid() != 0,
    reason="needs a memory cgroup this process may write (root, cgroup v1 or delegated v2)",
)

BALLOON = "import sys; b = bytearray(int(sys.argv[1])); print('survived', flush=True)"


@needs_real_cgroup
def test_the_kernel_kills_a_process_over_its_hosts_limit_and_only_it(tmp_path: Path) -> None:
    assert REAL is not None
    limit = 64 * MIB
    survivors = []
    for size in (8 * MIB, 256 * MIB):
        child = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.stdin.read(1); {BALLOON}", str(size)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        cgroup = REAL.join(f"npu-test-{os.getpid()}-{child.pid}", child.pid, limit)
        try:
            assert cgroup.limit() == limit
            out, _ = child.communicate("go", timeout=120)
            survivors.append((child.returncode, out.strip(), cgroup.oom_kills()))
        finally:
            child.kill()
            child.wait()
            cgroup.remove()
        assert not cgroup.path.exists()
    assert survivors == [(0, "survived", 0), (-9, "", 1)]


def balloon_model(mib: int) -> bytes:
    """`x: float32[1, 256]` broadcast to `[mib * 1024, 256]` (mib MiB) and summed back to
    one row: 16 bytes of weights whose run takes `mib` MiB."""
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([mib * 1024, 256], np.int64), "shape")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    graph = helper.make_graph(
        [
            helper.make_node("Expand", ["x", "shape"], ["big"]),
            helper.make_node("ReduceSum", ["big", "axes"], ["y"], keepdims=1),
        ],
        "balloon",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        initializer=[shape, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()  # type: ignore[no-any-return]


@needs_real_cgroup
def test_a_host_that_outgrows_its_grants_is_killed_alone_and_its_app_told_why(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    pytest.importorskip("onnxruntime")
    from helpers.real_daemon import app, granted, in_process_digest, info, loaded_app, wait_for

    balloon = socket_dir / "balloon.onnx"
    balloon.write_bytes(balloon_model(2 * HOST_MEMORY_BASE_BYTES // MIB))
    balloon.chmod(0o644)
    daemon = start_onnxruntime("--model-hosts")
    assert info(daemon)["daemon"]["model_hosts"]["memory_limit"] == REAL.kind  # type: ignore[union-attr]
    other = loaded_app(daemon, FOREGROUND_UID, model_file)
    greedy = app(daemon, BACKGROUND_UID)
    granted(greedy)
    greedy.ok("real_load", id=1, path=str(balloon))
    (pid,) = [c["host_pid"] for c in info(daemon)["clients"] if c["uid"] == BACKGROUND_UID]
    cgroup = HostCgroup(REAL.parent / f"npu-host-{pid}", REAL.version)  # type: ignore[union-attr]
    weights = 16 + 8  # the shape and the axes
    assert cgroup.limit() == host_limit(weights, 0) // 4096 * 4096  # v1 keeps whole pages

    failed = greedy.send("real_run", id=1, rows=1, value=1.0)
    # The run in flight fails with its host, or is cancelled as its model is unloaded:
    # whichever the daemon sees first. Once the loop has seen the death, the next call
    # says why (the cgroup goes before the loop hears of it).
    assert failed.get("error") in ("ModelHostError", "CancelledError"), failed
    wait_for(lambda: not cgroup.path.exists())
    wait_for(lambda: info(daemon)["daemon"]["model_hosts"]["died"] == 1)  # type: ignore[index]
    again = greedy.send("real_run", id=1, rows=1, value=1.0)
    assert again.get("error") == "ModelHostError", again
    assert "used more memory than its grants allow" in again["message"], again
    assert other.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    assert daemon.alive


@needs_real_cgroup
def test_a_hosts_limit_makes_room_for_a_load_then_holds_its_models_weights() -> None:
    pytest.importorskip("onnxruntime")
    from helpers.real_daemon import wait_for
    from npumanager.daemon.host.client import HostSettings, ModelHost
    from npumanager.vendor_drivers.realexec.chain import chain_model

    def pages(limit: int) -> int:
        return limit // 4096 * 4096 if REAL is not None and REAL.version == 1 else limit

    host = ModelHost(HostSettings("onnxruntime", cgroups=REAL), FOREGROUND_UID, FOREGROUND_UID)
    try:
        assert host.cgroup is not None and host.cgroup.limit() == pages(host_limit(0, 0))
        assert str(host.pid) in (host.cgroup.path / "cgroup.procs").read_text().split()
        counted = host.count(chain_model(), {}, 64 * MIB)
        assert host.cgroup.limit() == pages(host_limit(0, 64 * MIB))
        session = host.open(0, counted, 0)
        assert session.weight_bytes == counted.weight_bytes > 0
        assert host.cgroup.limit() == pages(host_limit(session.weight_bytes, 0))
        session.close()
        assert host.cgroup.limit() == pages(host_limit(0, 0))
        discarded = host.count(chain_model(), {}, 8 * MIB)
        host.discard(discarded)
        assert host.cgroup.limit() == pages(host_limit(0, 0))
        path = host.cgroup.path
    finally:
        host.kill()
    wait_for(lambda: not path.exists())


@needs_real_cgroup
def test_a_dead_hosts_cgroup_left_behind_under_the_same_name_is_replaced() -> None:
    """A daemon killed with SIGKILL leaves its hosts' cgroups; a later host that gets one of
    their pids still gets its limit (a clean-clone CI run failed on `File exists`), while a
    cgroup of that name with a live process in it is never taken over."""
    assert REAL is not None
    child = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    name = f"npu-test-{os.getpid()}-{child.pid}"
    try:
        (REAL.parent / name).mkdir()  # what the dead host's daemon left
        cgroup = REAL.join(name, child.pid, 64 * MIB)
        try:
            assert cgroup.limit() == 64 * MIB
            assert (cgroup.path / "cgroup.procs").read_text().split() == [str(child.pid)]
            with pytest.raises(OSError):  # the live process stays where it is
                REAL.join(name, os.getpid(), 64 * MIB)
            assert (cgroup.path / "cgroup.procs").read_text().split() == [str(child.pid)]
        finally:
            child.kill()
            child.wait()
            cgroup.remove()
    finally:
        child.kill()
        child.wait()
        with contextlib.suppress(FileNotFoundError):
            (REAL.parent / name).rmdir()
