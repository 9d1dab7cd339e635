"""The focus example (`examples/focus/run.py`) end to end: a real daemon, two apps of one uid
in two app cgroups, the focus moved by `user.xdg.inactive-since` as Mutter writes it. What is
asserted are events (each app's importance follows the focus, everything is removed at the
end), never the latencies it prints."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.checkout_access import needs_checkout_other_uids_can_enter
from helpers.console import VTS_AT_NORMAL_PRIORITY
from npumanager.apps.identity import cgroup_of_pid, v2_mount
from npumanager.apps.registry import HAL_UID_FIRST

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or v2_mount() is None,
    reason="making cgroups, setting their xattrs and giving the apps a uid need root and cgroup v2",
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "focus" / "run.py"
CALL, INDEXER = "org.example.Call", "org.example.Indexer"


def home_folder() -> Path:
    """This process's cgroup folder: the example makes its own folder below it."""
    mount, home = v2_mount(), cgroup_of_pid(os.getpid())
    assert mount is not None and home is not None
    return mount / home.lstrip("/")


def test_the_focus_example_prints_every_figure_and_the_importances_follow_the_focus() -> None:
    needs_checkout_other_uids_can_enter()  # its apps start as root, then drop to their uid
    # The background app's work at the OS's normal priority: under SCHED_IDLE, beside a busy
    # machine's other programs, an unfocused call once finished no frame in a whole phase.
    argv = [sys.executable, str(EXAMPLE), "--quick", "--json", *VTS_AT_NORMAL_PRIORITY]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["launcher"] == "cgroupfs", "no user manager here: cgroupfs written as root"
    hal = figures["hal_uids"]
    assert set(hal) == {CALL, INDEXER} and hal[CALL] != hal[INDEXER] >= HAL_UID_FIRST
    assert hal[CALL] >= HAL_UID_FIRST, "one uid, two apps: each a HAL uid of its own"

    phases = figures["phases"]
    assert [phase["focused"] for phase in phases] == [CALL, INDEXER, CALL]
    for phase in phases:
        other = INDEXER if phase["focused"] == CALL else CALL
        assert phase["importance"] == {phase["focused"]: "FOREGROUND", other: "SERVICE"}, phase
        assert phase["source"] == {CALL: "desktop", INDEXER: "desktop"}
        assert phase["frames"] > 0 and 0 < phase["p50_ms"] <= phase["p99_ms"]
        assert phase["missed_frames"] >= 0 and phase["indexer_per_s"] > 0
        assert phase["shown_after_ms"] >= 0
    for focus in ("with", "without"):
        assert 0 < figures[f"call_p50_{focus}_focus_ms"] <= figures[f"call_p99_{focus}_focus_ms"]
    assert figures["without_over_with_focus_p99"] > 0
    folder = Path(figures["cgroup_folder"])  # its own: other tests make theirs meanwhile
    assert folder.parent == home_folder() and folder.name.startswith("npu-focus-")
    assert not folder.exists(), "the example's cgroups are removed at the end"

    refused = subprocess.run(
        [sys.executable, str(EXAMPLE), "--phases", "1"], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 2 and "--phases at least 2" in refused.stderr


AS_NOBODY = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("focus_run", sys.argv[1])
example = sys.modules["focus_run"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
os.setgroups([]); os.setgid(65534); os.setuid(65534)
sys.argv = sys.argv[1:]
sys.exit(example.main())
"""
"""The example loaded as root (this machine's interpreter lives where only root may read),
then run as nobody."""


def test_the_focus_example_says_in_one_line_that_it_needs_root() -> None:
    done = subprocess.run(
        [sys.executable, "-c", AS_NOBODY, str(EXAMPLE), "--quick"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "examples/focus: needs root: it makes cgroups, moves processes and sets their xattrs"
    ]
    assert done.stdout == ""


def test_a_phase_without_frames_gives_no_ratio_rather_than_a_crash() -> None:
    spec = importlib.util.spec_from_file_location("focus_run_ratio", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = sys.modules["focus_run_ratio"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # its dataclasses look their module up by name
    none, some = example.figures([]), example.figures([4.0, 8.0])
    assert example.p99_over(none, some) is None and example.p99_over(some, none) is None
    assert example.p99_over(example.figures([16.0]), some) == 2.0
