"""The device's users outside the manager, beyond `info`: their memory counted against the
device's capacity (`serve --count-device-users`, `Service.count_outside_memory`) and shown
in the Prometheus metrics by app. Fake /proc trees stand in for a DRM driver's fdinfo (no
accelerator here); the service, the daemon and the sink are real."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

import npumanager as npu
from helpers.daemon_support import Daemons
from helpers.proc_trees import descriptor, device_node, process
from helpers.service_apps import WAIT_S, App, background_app, wait_for
from npumanager.apps.device_users import DeviceUser
from npumanager.core.service.service import Service
from npumanager.daemon.client.client import DaemonClient
from npumanager.daemon.server.device_users import DeviceUsers
from npumanager.errors import IllegalArgumentError

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

ACCEL = "/dev/accel/accel0"
MiB = 1024 * 1024
VPU = "drm-driver:\tintel_vpu\ndrm-client-id:\t{client}\ndrm-resident-memory:\t{kib} KiB\n"
INDEXER = (
    "/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-org.example.Indexer-7.scope"
)


def holder(root: Path, pid: int, *, client: int, kib: int, cgroup: str = INDEXER) -> None:
    """A process of the fake tree holding the accelerator open with `kib` KiB resident."""
    process(root, pid, cgroup=cgroup)
    descriptor(root, pid, 3, ACCEL, VPU.format(client=client, kib=kib))


def user(app: str, pid: int, client: int | None, resident: int, **engines: int) -> DeviceUser:
    return DeviceUser(
        pid=pid,
        uid=1000,
        app_id=app,
        cgroup=None,
        comm="app",
        node=ACCEL,
        driver="intel_vpu",
        client_id=client,
        engines=engines,
        memory={"memory": {"resident": resident}},
    )


def test_memory_held_outside_asks_background_apps_to_unload_and_holds_back_loads() -> None:
    with Service("vnpu", "pressure", clock="real") as service:
        app = background_app(service)
        capacity = service.snapshot()["devices"][0]["weight_memory_bytes"]
        service.count_outside_memory([capacity - MiB // 2])  # the app's 1 MiB no longer fits
        assert app.unloaded.wait(WAIT_S)
        device = service.snapshot()["devices"][0]
        assert device["weight_memory_outside_bytes"] == capacity - MiB // 2
        assert device["weight_memory_bytes"] == capacity, "the driver's capacity is as it was"

        service.set_uid_importance(10_201, npu.IMPORTANCE_CACHED)
        again = App(service.manager(10_201, uses_feature=True))
        request = npu.ModelLoadRequest.Builder(1).set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB)
        again.manager.request_can_load_model(request.build(), again)
        held_back = service.snapshot()["requests"]["not_prioritized"]
        assert [r["uid"] for r in held_back] == [10_201], "no room left for its 1 GiB class"
        service.count_outside_memory([0])
        assert again.loaded.wait(WAIT_S), "the room given back is granted"
        assert service.snapshot()["devices"][0]["weight_memory_outside_bytes"] == 0


@pytest.mark.parametrize(
    ("held", "message"),
    [
        ("12", "must be a sequence of ints; got '12'"),
        ([-1], "memory held outside on device 0"),
        ([1.5], "memory held outside on device 0"),
        ([0] * 40, "lists 40 devices; the driver has"),
    ],
)
def test_bad_counts_of_memory_held_outside_are_refused_and_change_nothing(
    held: object, message: str
) -> None:
    with Service("vnpu", "pressure", clock="real") as service:
        service.count_outside_memory([MiB])
        with pytest.raises(IllegalArgumentError, match=message):
            service.count_outside_memory(held)  # type: ignore[arg-type]
        assert service.snapshot()["devices"][0]["weight_memory_outside_bytes"] == MiB


def test_counting_scans_on_its_own_thread_and_tells_each_change(tmp_path: Path) -> None:
    device_node(tmp_path, ACCEL)
    holder(tmp_path, 400, client=1, kib=8192)
    told: list[int] = []
    changed = threading.Condition()

    def tell(held: int) -> None:
        with changed:
            told.append(held)
            changed.notify_all()

    users = DeviceUsers([ACCEL], list, interval_s=0.01, root=tmp_path)
    users.count_against(tell)
    try:
        with changed:
            assert changed.wait_for(lambda: told == [8 * MiB], WAIT_S), told
        holder(tmp_path, 401, client=2, kib=4096)
        with changed:
            assert changed.wait_for(lambda: told == [8 * MiB, 12 * MiB], WAIT_S), told
        with pytest.raises(RuntimeError, match="counted already"):
            users.count_against(tell)
    finally:
        users.close()
    assert not any(t.name == "npu-device-users" for t in threading.enumerate())


def test_the_daemon_counts_them_and_its_metrics_show_them_by_app(
    daemon: Daemons, tmp_path: Path
) -> None:
    root = tmp_path / "machine"
    device_node(root, ACCEL)
    holder(root, 500, client=9, kib=8192)
    holder(root, 501, client=9, kib=8192)  # forked: the same open, counted once
    from npumanager.telemetry.prometheus import PrometheusSink

    prometheus = PrometheusSink()
    service = Service("vnpu", "pressure", clock="real")
    service.add_sink(prometheus)
    served = daemon.on_a_thread(
        service, device_nodes=[ACCEL], count_device_users=True, device_users_root=root
    )
    with DaemonClient(served.socket_path) as client:
        wait_for(lambda: client.info()["devices"][0]["weight_memory_outside_bytes"] == 8 * MiB)
        shown = {u["pid"]: u["app_id"] for u in client.info()["device_users"]}
    assert shown == {500: "org.example.Indexer", 501: "org.example.Indexer"}
    command = [str(Path(sys.executable).with_name("npu-manager")), "info"]
    text = subprocess.run(
        [*command, "--socket", str(served.socket_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "0.00/6.00 (0.01 outside)" in text.stdout, text.stdout + text.stderr
    metrics = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(prometheus.exposition())
        for sample in family.samples
    }
    indexer = (("app", "org.example.Indexer"),)
    assert metrics[("npu_device_users", indexer)] == 1
    assert metrics[("npu_device_user_resident_bytes", indexer)] == 8 * MiB


def test_metrics_sum_each_apps_clients_and_engine_time() -> None:
    from npumanager.telemetry.prometheus import PrometheusSink

    prometheus = PrometheusSink()
    with Service("vnpu", "pressure", clock="real") as service:
        service.add_sink(prometheus)
        users = [
            user("org.example.Viewer", 10, 1, 2 * MiB, render=3_000_000_000),
            user("org.example.Viewer", 11, 2, MiB, render=1_000_000_000, copy=500_000_000),
            user("org.example.Viewer", 12, 2, MiB, render=1_000_000_000),  # fork of pid 11
            user("uid:1000", 13, None, 0),
        ]
        service.show_device_users(lambda: users)
        families = {f.name: f for f in text_string_to_metric_families(prometheus.exposition())}
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for name in (
            "npu_device_users",
            "npu_device_user_resident_bytes",
            "npu_device_user_engine_busy_seconds",
        )
        for s in families[name].samples
    }
    viewer = ("app", "org.example.Viewer")
    assert values == {
        ("npu_device_users", (viewer,)): 2,
        ("npu_device_users", (("app", "uid:1000"),)): 1,
        ("npu_device_user_resident_bytes", (viewer,)): 3 * MiB,
        ("npu_device_user_resident_bytes", (("app", "uid:1000"),)): 0,
        ("npu_device_user_engine_busy_seconds_total", (viewer, ("engine", "render"))): 4.0,
        ("npu_device_user_engine_busy_seconds_total", (viewer, ("engine", "copy"))): 0.5,
    }
    assert families["npu_device_user_engine_busy_seconds"].type == "counter"


def test_in_process_there_are_no_device_users_in_the_metrics() -> None:
    from npumanager.telemetry.prometheus import PrometheusSink

    prometheus = PrometheusSink()
    with Service("vnpu", "pressure", clock="real") as service:
        service.add_sink(prometheus)
        text = prometheus.exposition()
    assert "npu_device_users{" not in text
    assert "# TYPE npu_device_users gauge" in text, "the family is there, with no samples"
