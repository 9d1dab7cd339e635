"""200 concurrent clients against one daemon: every request ends once, the budget holds.

Eight worker processes, each with its own uid and importance, run 25 client connections
each; every connection runs NPUMANAGER_LOAD_CYCLES request/load/unload/cancel cycles
(default 500). While they run, the test polls `info`: the weight the budget policy has
committed never exceeds its maximum, and the daemon's resident memory stays flat.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import npumanager as npu
from helpers.daemon_support import LOAD_WORKER, SOCKET_GID, WAIT_S, DaemonProcess, Daemons

PROCESSES = 8
CLIENTS_PER_PROCESS = 25
CYCLES = int(os.environ.get("NPUMANAGER_LOAD_CYCLES", "500"))
MAX_BUDGET = 4
IMPORTANCES = [
    npu.IMPORTANCE_FOREGROUND,
    npu.IMPORTANCE_VISIBLE,
    npu.IMPORTANCE_SERVICE,
    npu.IMPORTANCE_CACHED,
]
COMMITTED = ("granted", "loaded", "unloading")
RSS_SLACK_KIB = 8 << 10
"""Resident growth allowed after the warm-up fifth of the run (allocator noise)."""


class Monitor(threading.Thread):
    """Polls the daemon's info and memory until stopped."""

    def __init__(self, daemon: DaemonProcess) -> None:
        super().__init__(daemon=True)
        self.daemon_process = daemon
        self.stop_event = threading.Event()
        self.max_committed = 0
        self.samples = 0
        self.rss: list[tuple[float, int]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        with npu.DaemonClient(self.daemon_process.socket) as admin:
            while not self.stop_event.wait(0.02):
                info = admin.info()
                committed = sum(r["weight"] for state in COMMITTED for r in info["requests"][state])
                self.max_committed = max(self.max_committed, committed)
                if committed > MAX_BUDGET:
                    self.errors.append(f"committed {committed} > {MAX_BUDGET}: {info['requests']}")
                self.samples += 1
                self.rss.append((time.monotonic(), self.daemon_process.rss_kib()))


def start_worker(socket_path: Path, uid: int, seed: int) -> subprocess.Popen[str]:
    """One worker process of CLIENTS_PER_PROCESS connections, dropping to `uid`."""
    arguments = [socket_path, uid, SOCKET_GID, CLIENTS_PER_PROCESS, CYCLES, seed]
    return subprocess.Popen(
        [sys.executable, str(LOAD_WORKER), *map(str, arguments)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def max_overlap(intervals: list[tuple[int, int, int]]) -> int:
    """The largest total weight held at one instant, from (start, end, weight) intervals."""
    points = sorted(
        [(start, weight) for start, _, weight in intervals]
        + [(end, -weight) for _, end, weight in intervals],
        key=lambda p: (p[0], p[1]),  # a release at the same instant counts first
    )
    held = peak = 0
    for _, delta in points:
        held += delta
        peak = max(peak, held)
    return peak


def test_two_hundred_clients_hundred_thousand_cycles(daemon: Daemons) -> None:
    served = daemon(
        "--policy", "budget",
        "--max-budget", str(MAX_BUDGET),
        "--socket-group", str(SOCKET_GID),
        "--unload-grace-ms", "600000",
        "--log-level", "warning",
    )  # fmt: skip
    uids = [21000 + i for i in range(PROCESSES)]
    with npu.DaemonClient(served.socket) as admin:
        for i, uid in enumerate(uids):
            admin.set_uid_importance(uid, IMPORTANCES[i % len(IMPORTANCES)])
    workers = [start_worker(served.socket, uid, seed) for seed, uid in enumerate(uids)]
    for worker in workers:
        assert worker.stdout is not None
        assert json.loads(worker.stdout.readline()) == {"connected": CLIENTS_PER_PROCESS}
    with npu.DaemonClient(served.socket) as admin:
        assert admin.info()["daemon"]["connections"] == PROCESSES * CLIENTS_PER_PROCESS + 1

    monitor = Monitor(served)
    monitor.start()
    started = time.monotonic()
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    summaries: list[dict[str, Any]] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=1800)
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = time.monotonic() - started
    monitor.stop_event.set()
    monitor.join(WAIT_S)

    violations = [v for s in summaries for v in s["violations"]]
    assert not violations, violations[:10]
    assert not monitor.errors, monitor.errors[:3]
    requests = sum(s["requests"] for s in summaries)
    assert requests == PROCESSES * CLIENTS_PER_PROCESS * CYCLES
    assert sum(s["completions"] for s in summaries) == requests
    intervals = [tuple(i) for s in summaries for i in s["intervals"]]
    assert max_overlap(intervals) <= MAX_BUDGET  # type: ignore[arg-type]
    loads = sum(s["loads"] for s in summaries)
    waits = sum(s["waits"] for s in summaries)
    assert loads > 0 and waits > 0, "the clients never competed"

    with npu.DaemonClient(served.socket) as admin:
        info = admin.info()
    assert all(not requests for requests in info["requests"].values())
    assert info["daemon"]["connections"] == 1
    assert info["daemon"]["internal_errors"] == 0
    warm = [kib for t, kib in monitor.rss if t - started >= elapsed / 5]
    assert warm, "no memory samples after the warm-up"
    growth = max(warm) - warm[0]
    assert growth <= RSS_SLACK_KIB, f"daemon memory grew {growth} KiB after the warm-up"
    print(
        f"\nload: {requests} requests from {PROCESSES * CLIENTS_PER_PROCESS} clients in "
        f"{elapsed:.1f} s ({requests / elapsed:.0f} cycles/s); {loads} loads, {waits} waited, "
        f"{sum(s['cancels'] for s in summaries)} cancels, "
        f"{sum(s['ended_by_service'] for s in summaries)} ended by the service; "
        f"max committed weight {monitor.max_committed}/{MAX_BUDGET} over {monitor.samples} "
        f"samples, client-side peak {max_overlap(intervals)}; daemon RSS "  # type: ignore[arg-type]
        f"{warm[0] / 1024:.1f} -> {max(warm) / 1024:.1f} MiB after warm-up "
        f"(first sample {monitor.rss[0][1] / 1024:.1f} MiB)"
    )
