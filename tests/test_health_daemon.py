"""End to end through a real daemon: a thermal spike in a fake sysfs tree, read by the
`linux` health source, makes the `pressure` policy ask a background app (a process of its
own uid) to unload with reason THERMAL; `info` shows the readings and their source."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import npumanager as npu
from helpers import health_trees as tree
from helpers.daemon_support import (
    BACKGROUND_UID,
    FOREGROUND_UID,
    SOCKET_GID,
    Child,
    DaemonProcess,
)
from npumanager.schemas import ModelLoadStatus, UnloadReason

GIB = 1 << 30


@pytest.mark.skipif(os.geteuid() != 0, reason="giving client processes their own uids needs root")
def test_a_thermal_spike_in_a_fake_tree_unloads_a_background_app_through_the_daemon(
    socket_dir: Path,
) -> None:
    root = socket_dir / "machine"
    tree.zone(root, 0, "x86_pkg_temp", 45_000, tree.SOC_TRIPS)
    tree.memory(root, 0.5)
    daemon = DaemonProcess(
        socket_dir,
        "--socket-group",
        str(SOCKET_GID),
        "--policy",
        "pressure",
        "--health",
        f"linux:root={root},interval_ms=50",
    )
    apps: list[Child] = []
    try:
        background = Child(daemon.socket, BACKGROUND_UID)
        foreground = Child(daemon.socket, FOREGROUND_UID)
        apps += [background, foreground]
        with npu.DaemonClient(daemon.socket) as admin:
            admin.set_uid_importance(BACKGROUND_UID, npu.IMPORTANCE_CACHED)
            admin.set_uid_importance(FOREGROUND_UID, npu.IMPORTANCE_FOREGROUND)
            for app, priority in ((background, 1000), (foreground, 0)):
                app.ok("request", id=1, priority=priority, weight_bytes=GIB)
                assert app.event("decision", 1)["status"] == int(ModelLoadStatus.CAN_LOAD_NOW)
                app.ok("load", id=1, priority=priority, weight_bytes=GIB)
            before = admin.info()
            assert before["devices"][0]["severity"] == "NONE"

            tree.heat(root, 0, 85_000)  # past the passive trip point: MODERATE
            asked = background.event("unload", 1)
            assert asked["reason"] == int(UnloadReason.THERMAL)
            assert background.event("complete", 1)["status"] == int(
                npu.NPU_MODEL_LOAD_REQUEST_STATUS_COMPLETE
            )
            with pytest.raises(AssertionError):  # a NORMAL-priority model stays at MODERATE
                foreground.event("unload", 1, timeout=0.3)
            info = admin.info()
        assert info["devices"][0]["severity"] == "MODERATE"
        assert info["devices"][0]["driver_severity"] == "NONE"
        (source,) = info["health"]["sources"]
        assert source["name"] == "linux" and source["error"] is None
        assert source["thermal"] == [
            {
                "name": "thermal_zone0:x86_pkg_temp",
                "device": None,
                "temperature_mc": 85_000,
                "severity": "MODERATE",
            }
        ]
        assert source["memory"][0]["some_avg10"] == 0.5
        assert "device health from linux" in daemon.log()
    finally:
        for app in apps:
            app.close()
        assert daemon.stop() == 0, daemon.log()
