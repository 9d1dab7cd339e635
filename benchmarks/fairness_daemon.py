"""The fair scheduler's workloads through the daemon, with real model hosts, against the
same workloads in process, in one run.

`benchmarks/fairness.py` measures the device scheduler in virtual time on vnpu. Here two
of its workloads run for real on `onnxruntime` with one channel (`channels=1`, so the two
apps contend), each app a closed loop of `LoadedModel.run` on the chain of MatMuls
(`realexec.chain`, `ROWS` rows, a few milliseconds a run; the driver's background workers
at the normal OS priority, `DRIVER_OPTIONS`):

* deep_queues: two foreground apps, two loops each: fair share gives each half;
* background_floor: a foreground app with two loops against a cached app with one: the
  background band's floor keeps it from starving.

In process, one `Service` holds both apps (a manager per loop, one thread each). Through
the daemon, `npu-manager serve --driver onnxruntime --driver-option channels=1` (model
hosts, the data plane and its leases as shipped), each app a process of its own uid (run
as root) with a connection per loop, its importance pinned as the platform would. Each
app's share is its runs over both apps' runs in the same window (the same model, so the
share of runs is the share of device time). Target (issue 40): each share through the
daemon within 5 % of the in-process one (relative), medians over rounds.

Usage: python benchmarks/fairness_daemon.py [--json] [--quick] [--seconds S] [--rounds R]
       [--serve-arg=ARG ...]
"""

from __future__ import annotations

import argparse
import faulthandler
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _report import SERVE, Progress, Target, print_report  # beside this script

import npumanager as npu
from npumanager.vendor_drivers.realexec.chain import chain_inputs, chain_model

ROWS = 1024
"""Rows of the chain's input: a few milliseconds a run on one core."""
SOCKET_GID = 20000
WARM_S = 0.5
"""Runs before the window opens (hosts started, caches warm)."""
TOLERANCE = 0.05
DRIVER_OPTIONS = {"channels": 1, "background_idle": False}
"""One channel, so the apps contend; background workers at the normal OS priority, so the
figures are the device scheduler's shares, not how much CPU a `SCHED_IDLE` thread gets
beside whatever else runs on the machine (in process and through the daemon alike)."""


@dataclass(frozen=True)
class App:
    """One app of a workload: its uid, its importance and its closed loops."""

    name: str
    uid: int
    importance: int
    loops: int


WORKLOADS = {
    "deep_queues": (
        App("a", 20031, npu.IMPORTANCE_FOREGROUND, 2),
        App("b", 20032, npu.IMPORTANCE_FOREGROUND, 2),
    ),
    "background_floor": (
        App("foreground", 20031, npu.IMPORTANCE_FOREGROUND, 2),
        App("background", 20032, npu.IMPORTANCE_CACHED, 1),
    ),
}


def _request() -> npu.ModelLoadRequest:
    return npu.ModelLoadRequest.Builder(1).set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB).build()


def _loop(manager: npu.NpuManager, go: Any, stop: Any, counted: list[int]) -> None:
    """A closed loop of runs on the manager's model; runs between `go` and `stop` counted
    (-1 once, if the loop failed: the figures would mean nothing)."""
    x = chain_inputs(ROWS)
    try:
        with manager.reserve(_request(), timeout_s=60) as lease:
            model = lease.load_model(model=chain_model())
            while not stop.is_set():
                model.run(x)
                if go.is_set():
                    counted[0] += 1
    except Exception as exc:
        print(f"fairness_daemon.py: a loop failed: {exc!r}", file=sys.stderr)
        counted[0] = -1


def _total(counts: list[list[int]]) -> int:
    if any(c[0] < 0 for c in counts):
        raise SystemExit("fairness_daemon.py: a loop failed; no figures")
    return sum(c[0] for c in counts)


def _window(go: Any, stop: Any, seconds: float) -> None:
    time.sleep(WARM_S)
    go.set()
    time.sleep(seconds)
    stop.set()


def in_process(apps: tuple[App, ...], seconds: float) -> dict[str, int]:
    """Each app's runs in the window, both apps in one `Service`."""
    service = npu.Service("onnxruntime", driver_options=DRIVER_OPTIONS)
    go, stop = threading.Event(), threading.Event()
    counts = {app.name: [[0] for _ in range(app.loops)] for app in apps}
    threads = []
    try:
        for app in apps:
            service.set_uid_importance(app.uid, app.importance)
            for counted in counts[app.name]:
                manager = service.manager(app.uid, uses_feature=True)
                threads.append(
                    threading.Thread(target=_loop, args=(manager, go, stop, counted), daemon=True)
                )
        for thread in threads:
            thread.start()
        _window(go, stop, seconds)
        for thread in threads:
            thread.join(60)
    finally:
        service.close()
    return {name: _total(rows) for name, rows in counts.items()}


def _app_process(app: App, path: str, go: Any, stop: Any, results: Any) -> None:
    """One app of its own uid: a connection and a thread per loop; its count to `results`."""
    os.setgroups([SOCKET_GID])
    os.setgid(app.uid)
    os.setuid(app.uid)
    counts = [[0] for _ in range(app.loops)]
    managers = [npu.connect(path, uses_feature=True) for _ in range(app.loops)]
    threads = [
        threading.Thread(target=_loop, args=(manager, go, stop, counted), daemon=True)
        for manager, counted in zip(managers, counts, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    hung = [thread for thread in threads if thread.is_alive()]
    if hung:
        print(f"fairness_daemon.py: {len(hung)} loop(s) of {app.name} hung:", file=sys.stderr)
        faulthandler.dump_traceback(sys.stderr)
    for manager in managers:
        manager.close()
    failed = hung or any(c[0] < 0 for c in counts)
    results.put((app.name, -1 if failed else sum(c[0] for c in counts)))


def through_daemon(
    apps: tuple[App, ...], seconds: float, serve_args: tuple[str, ...] = ()
) -> dict[str, int]:
    """Each app's runs in the window, each app a process of its own uid on the daemon
    (started with `serve_args` too)."""
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        path = Path(tmp) / "npu.sock"
        options = [f"--driver-option={key}={value}" for key, value in DRIVER_OPTIONS.items()]
        command = [*SERVE, "--driver", "onnxruntime", *options, *serve_args]
        log = Path(tmp) / "daemon.log"
        with log.open("wb") as written:
            daemon = subprocess.Popen(
                [*command, "--socket", str(path), "--socket-group", str(SOCKET_GID)],
                stderr=written,
            )
        try:
            deadline = time.monotonic() + 60
            while not path.exists():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the daemon did not start listening within 60 s")
                time.sleep(0.05)
            with npu.DaemonClient(path) as admin:
                for app in apps:
                    admin.set_uid_importance(app.uid, app.importance)
            go, stop, results = context.Event(), context.Event(), context.Queue()
            processes = [
                context.Process(target=_app_process, args=(app, str(path), go, stop, results))
                for app in apps
            ]
            for process in processes:
                process.start()
            time.sleep(2.0)  # the hosts start and load before the warm-up counts
            _window(go, stop, seconds)
            counts = dict(results.get(timeout=180) for _ in apps)  # past a hung loop's bound
            if any(n < 0 for n in counts.values()):
                said = log.read_text(errors="replace").splitlines()[-20:]
                raise SystemExit(
                    "fairness_daemon.py: an app's loop failed; no figures. The daemon's "
                    "last lines:\n" + "\n".join(said)
                )
            for process in processes:
                process.join(60)
        finally:
            daemon.terminate()
            daemon.wait(30)
    return counts


def _shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values()) or 1
    return {name: 100 * n / total for name, n in counts.items()}


def measure(seconds: float, rounds: int, serve_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """Each workload's app shares in process and through the daemon, medians over rounds."""
    result: dict[str, Any] = {"seconds": seconds, "rounds": rounds, "rows": ROWS}
    result["serve_args"] = " ".join(serve_args) or "(the defaults)"
    progress = Progress("fairness through the daemon", rounds * len(WORKLOADS) * 2)
    for workload, apps in WORKLOADS.items():
        shares: dict[str, list[dict[str, float]]] = {"in_process": [], "daemon": []}
        runs: dict[str, list[int]] = {"in_process": [], "daemon": []}
        for number in range(rounds):
            for kind in ("in_process", "daemon"):
                progress.step(f"{workload}, round {number + 1} of {rounds}, {kind}")
                if kind == "daemon":
                    counts = through_daemon(apps, seconds, serve_args)
                else:
                    counts = in_process(apps, seconds)
                shares[kind].append(_shares(counts))
                runs[kind].append(sum(counts.values()))
        for app in apps:
            here = statistics.median(s[app.name] for s in shares["in_process"])
            there = statistics.median(s[app.name] for s in shares["daemon"])
            result[f"{workload}_{app.name}_share_in_process_percent"] = round(here, 1)
            result[f"{workload}_{app.name}_share_daemon_percent"] = round(there, 1)
            result[f"{workload}_{app.name}_share_daemon_vs_in_process"] = round(
                there / here if here else 0.0, 3
            )
        for kind, counted in runs.items():
            result[f"{workload}_runs_per_s_{kind}"] = round(statistics.median(counted) / seconds, 1)
    progress.done()
    return result


TARGETS = [
    Target(
        f"{workload}_{app.name}_share_daemon_vs_in_process",
        "within",
        1 - TOLERANCE,
        1 + TOLERANCE,
        why="issue 40: within 5% of in process",
    )
    for workload, apps in WORKLOADS.items()
    for app in apps
]


def main(argv: list[str] | None = None) -> int:
    """Print the figures with their targets, as one JSON object with `--json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--quick", action="store_true", help="one short round (noisy)")
    parser.add_argument("--seconds", type=float, default=3.0, help="a window's length")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind")
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for `npu-manager serve` (repeatable): --serve-arg=--lease-us=0",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.exit(2, "fairness_daemon.py: run it as root (each app needs a uid of its own)\n")
    seconds, rounds = (1.0, 1) if args.quick else (args.seconds, args.rounds)
    print_report(measure(seconds, rounds, tuple(args.serve_arg)), TARGETS, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
