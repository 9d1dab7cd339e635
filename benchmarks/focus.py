"""How fast a focus change reaches the arbiter and the driver, and what the focus is worth to
an app with a deadline beside a flood (issue 30).

(a) Latency, in this process with the code the daemon runs: a `Service` on a real driver
(onnxruntime, real clock), a `Daemon` serving on a thread (its `AppRegistry` and
`AppImportance`, its loop), and the built-in `desktop` source built as `serve` builds it,
watching with inotify a folder of the mounted cgroup v2 hierarchy made below this process's
cgroup (only it: a focus written elsewhere, by a desktop or a test beside, is not timed).
Two app cgroups of one uid are made in it and registered as their processes' hellos would
register them.
A focus change is what Mutter writes: the time (`CLOCK_MONOTONIC`, microseconds) in
`user.xdg.inactive-since` of the app that loses the focus, then `-1` in the one that gets it.
Each change is timed from the first `setxattr` call until both apps' new importances have
(i) reached `Service.set_uid_importance` (the daemon's apply callback, wrapped) and (ii)
reached the driver as the `SchedulingConfig`s the arbiter relays (its
`update_scheduling_configs`, wrapped). The floor, interleaved with them in the same run: the
same two opinions posted straight to the daemon's loop, as the source's callback posts them
(no xattr, no inotify, no watching thread); reported as ratios. Target: p99 at most 20 ms.

(b) Worth: `examples/focus/run.py` through `npu-manager serve --driver onnxruntime`, two apps
of one uid in two app cgroups, the call (a frame every 16.7 ms) and the indexer (a flood on
two connections), the focus alternating between them; the call's p99 without the focus over
its p99 with it (the call focused in the odd phases, frames pooled). Run twice: with the
daemon's default ladder, `SERVICE@0/CACHED@600` (an app that lost the focus drops to the
normal band at once), and with `VISIBLE@0/SERVICE@60/CACHED@600` (one that lost the focus
stays `VISIBLE`, in the focus band beside `FOREGROUND`, where the device scheduler's fair
share alone decides: the reason the default is not that). The issue gives no number; our
bound for "clearly better" is 1.5x, for the default.

Needs root (cgroups, xattrs, the apps' uid) and cgroup v2; otherwise one line and exit 2.

Usage: python benchmarks/focus.py [--json] [--quick] [--changes N] [--seconds S] [--phases P]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _report import Progress, Target, print_report  # beside this script

import npumanager as npu
from npumanager.apps.identity import app_of_cgroup, cgroup_of_pid, v2_mount
from npumanager.cli.importance import build_importance_sources
from npumanager.daemon.server.server import Daemon
from npumanager.plugins.importance.desktop import FOCUSED, XATTR
from npumanager.schemas import Importance

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "focus" / "run.py"
APPS = (
    "user@20011.service/app.slice/app-gnome-org.example.Call-1.scope",
    "user@20011.service/app.slice/app-gnome-org.example.Indexer-2.scope",
)
FLOOR_APPS = (
    "/user.slice/user@20011.service/app.slice/app-gnome-org.example.FloorA-3.scope",
    "/user.slice/user@20011.service/app.slice/app-gnome-org.example.FloorB-4.scope",
)
"""The floor's apps: registered, never given a cgroup (the desktop source never ranks them)."""
APP_UID = 20011
INDEXER = "org.example.Indexer"
FOREGROUND, LOST = int(Importance.FOREGROUND), int(Importance.SERVICE)
"""The importance of an app that has the focus, and of one that just lost it (the default
ladder's first step)."""
VISIBLE_LADDER = "VISIBLE@0/SERVICE@60/CACHED@600"
"""A ladder whose first step stays in the focus band: the focus then changes little."""
WAIT_S = 120.0
"""How long one change may take before the benchmark gives up."""
MAX_P99_MS = 20.0
CLEARLY_BETTER = 1.5
QUICK = {"changes": 40, "seconds": 1.5, "phases": 3}

TARGETS = [
    Target(
        "change.arbiter_p99_ms",
        "<=",
        MAX_P99_MS,
        why="issue 30: a focus change reaches the arbiter within milliseconds (p99 <= 20 ms)",
    ),
    Target(
        "change.driver_p99_ms",
        "<=",
        MAX_P99_MS,
        why="issue 30: ... and the configs relayed to the driver (p99 <= 20 ms)",
    ),
    Target(
        "deadline.default_ladder.without_over_with_focus_p99",
        ">=",
        CLEARLY_BETTER,
        why="issue 30: the deadline app's p99 with the focus clearly better (no number given)",
    ),
]


class UnsupportedError(Exception):
    """The machine cannot run the benchmark (one line, exit 2)."""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(values), 3),
        "p99_ms": round(percentile(values, 0.99), 3),
    }


def check_machine() -> tuple[Path, str]:
    """The cgroup v2 mount and this process's cgroup, or `UnsupportedError` saying what lacks."""
    if os.geteuid() != 0:
        raise UnsupportedError("needs root: it makes cgroups, sets their xattrs, drops to a uid")
    mount, home = v2_mount(), cgroup_of_pid(os.getpid())
    if mount is None or home is None:
        raise UnsupportedError("no cgroup v2 hierarchy is mounted, or this process is not in it")
    return mount, home


@contextmanager
def app_cgroups() -> Iterator[tuple[Path, list[Path]]]:
    """A folder below this process's own cgroup and two app cgroups in it, removed at the
    end."""
    mount, home = check_machine()
    top = mount / home.lstrip("/") / f"npu-focus-bench-{secrets.token_hex(4)}"
    made = [top / rel for rel in APPS]
    try:
        for path in made:
            try:
                path.mkdir(parents=True)
            except OSError as error:
                why = f"cannot make a cgroup under {top.parent}: {error.strerror}"
                raise UnsupportedError(why) from None
        yield top, made
    finally:
        for folder, _, _ in os.walk(top, topdown=False):  # nothing when top was not made
            os.rmdir(folder)


class Arrivals:
    """When each HAL uid's importance last reached the service, and its config the driver."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.arbiter: dict[int, tuple[int, int]] = {}
        self.driver: dict[int, tuple[int, int]] = {}

    def wrap(self, service: npu.Service) -> None:
        """Time the daemon's apply callback and the driver's config relay (instances only)."""
        apply, relay = service.set_uid_importance, service.driver.update_scheduling_configs

        def set_uid_importance(uid: int, importance: int) -> None:
            self._arrived(self.arbiter, uid, importance)
            apply(uid, importance)

        def update_scheduling_configs(configs: Any) -> None:
            for config in configs:
                self._arrived(self.driver, config.uid, config.app_priority)
            relay(configs)

        service.set_uid_importance = set_uid_importance  # type: ignore[method-assign]
        service.driver.update_scheduling_configs = update_scheduling_configs  # type: ignore[method-assign]

    def _arrived(self, into: dict[int, tuple[int, int]], uid: int, importance: int) -> None:
        now = time.perf_counter_ns()
        with self.lock:
            into[uid] = (importance, now)
            self.lock.notify_all()

    def wait(self, wanted: dict[int, int]) -> tuple[int, int]:
        """When the last of `wanted` (HAL uid: importance) reached the service, and the driver."""
        deadline = time.monotonic() + WAIT_S

        def latest(seen: dict[int, tuple[int, int]]) -> int | None:
            if any(uid not in seen or seen[uid][0] != value for uid, value in wanted.items()):
                return None
            return max(seen[uid][1] for uid in wanted)

        with self.lock:
            while True:
                arbiter, driver = latest(self.arbiter), latest(self.driver)
                if arbiter is not None and driver is not None:
                    return arbiter, driver
                if not self.lock.wait(max(0.0, deadline - time.monotonic())):
                    raise SystemExit(f"focus: {wanted} did not arrive within {WAIT_S:g} s")


def change_latency(changes: int, progress: Progress) -> dict[str, Any]:
    """(a): focus changes by xattr, interleaved with the floor's direct opinions."""
    progress.step("the service, the daemon on a thread and the desktop source")
    with app_cgroups() as (top, cgroups), tempfile.TemporaryDirectory() as tmp:
        service = npu.Service("onnxruntime", clock="real")
        arrivals = Arrivals()
        arrivals.wrap(service)
        sources = build_importance_sources(npu.load_plugins(), [f"desktop:root={top}"])
        daemon = Daemon(service, Path(tmp) / "npu.sock", importance_sources=sources)
        daemon.bind()
        loop = threading.Thread(target=daemon.serve_forever)
        loop.start()
        try:
            progress.step(f"{changes} focus changes by xattr and {changes} direct")
            timed = play_changes(daemon, cgroups, arrivals, changes)
        finally:
            daemon.stop()
            loop.join(WAIT_S)
    result: dict[str, Any] = {"changes": changes}
    for kind in ("change", "floor"):
        result[kind] = {
            **{f"arbiter_{k}": v for k, v in spread(timed[kind, "arbiter"]).items()},
            **{f"driver_{k}": v for k, v in spread(timed[kind, "driver"]).items()},
        }
    result["driver_p99_over_floor"] = round(
        result["change"]["driver_p99_ms"] / result["floor"]["driver_p99_ms"], 1
    )
    result["driver_p50_over_floor"] = round(
        result["change"]["driver_p50_ms"] / result["floor"]["driver_p50_ms"], 1
    )
    return result


def register(daemon: Daemon, paths: list[str]) -> list[tuple[str, int]]:
    """Each cgroup path's app in the daemon's registry, as a hello from a process in it
    would make it (on the loop); their app ids and HAL uids."""
    done, found = threading.Event(), []

    def on_the_loop() -> None:
        for path in paths:
            app = daemon.apps.app_for(APP_UID, app_of_cgroup(path))
            daemon.importance.joined(app)
            found.append((app.app_id, app.hal_uid))
        done.set()

    daemon.post(on_the_loop)
    if not done.wait(WAIT_S):
        raise SystemExit("focus: the daemon's loop did not register the apps")
    return found


def play_changes(
    daemon: Daemon, cgroups: list[Path], arrivals: Arrivals, changes: int
) -> dict[tuple[str, str], list[float]]:
    """Focus changes by xattr (Mutter's two writes) on the two apps with cgroups, each
    followed by one of the floor on two apps of their own: the same two opinions posted
    straight to the loop, as the desktop source's callback posts them. Both timed from the
    first write (or post) to the service and to the driver."""
    mount = v2_mount()
    assert mount is not None
    watched = register(daemon, ["/" + str(path.relative_to(mount)) for path in cgroups])
    floor = register(daemon, list(FLOOR_APPS))
    timed: dict[tuple[str, str], list[float]] = {
        (kind, to): [] for kind in ("change", "floor") for to in ("arbiter", "driver")
    }
    for number in range(changes):
        new, old = number % 2, 1 - number % 2
        for kind, apps in (("change", watched), ("floor", floor)):
            wanted = {apps[new][1]: FOREGROUND, apps[old][1]: LOST}
            start = time.perf_counter_ns()
            if kind == "change":
                lost = str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000).encode()
                os.setxattr(cgroups[old], XATTR, lost)
                os.setxattr(cgroups[new], XATTR, str(FOCUSED).encode())
            else:
                post_opinion(daemon, apps[old][0], LOST)
                post_opinion(daemon, apps[new][0], FOREGROUND)
            arbiter, driver = arrivals.wait(wanted)
            timed[kind, "arbiter"].append((arbiter - start) / 1e6)
            timed[kind, "driver"].append((driver - start) / 1e6)
            time.sleep(0.002)  # the watching thread back asleep, as between real changes
    return timed


def post_opinion(daemon: Daemon, app_id: str, importance: int) -> None:
    """The floor: one opinion of the desktop source posted to the loop, as its callback does."""

    def on_the_loop() -> None:
        daemon.importance.opinion("desktop", app_id, importance)

    daemon.post(on_the_loop)


def deadline_worth(seconds: float, phases: int, progress: Progress) -> dict[str, dict[str, Any]]:
    """(b): the example through the daemon, with the default ladder and the visible one."""
    found = {}
    for name, ladder in (("default_ladder", None), ("visible_ladder", VISIBLE_LADDER)):
        progress.step(f"examples/focus/run.py, {phases} phases of {seconds:g} s, {name}")
        command = [sys.executable, str(EXAMPLE), "--json", "--seconds", str(seconds)]
        command += ["--phases", str(phases)] + (["--ladder", ladder] if ladder else [])
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"focus: the example failed: {done.stderr.strip()[-2000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        found[name] = {
            "ladder": figures["ladder"] or "SERVICE@0/CACHED@600",
            "with_focus_p50_ms": figures["call_p50_with_focus_ms"],
            "with_focus_p99_ms": figures["call_p99_with_focus_ms"],
            "without_focus_p50_ms": figures["call_p50_without_focus_ms"],
            "without_focus_p99_ms": figures["call_p99_without_focus_ms"],
            "without_over_with_focus_p99": figures["without_over_with_focus_p99"],
            "call_indexer_by_phase": " ".join(
                "/".join(phase["importance"][app] for app in ("org.example.Call", INDEXER))
                for phase in figures["phases"]
            ),
        }
    return found


def measure(changes: int, seconds: float, phases: int) -> dict[str, Any]:
    example_s = seconds * phases + 10  # its daemon, apps and models start in about 10 s
    progress = Progress("focus", [1, changes / 150, example_s, example_s])
    result = change_latency(changes, progress)
    result["deadline"] = deadline_worth(seconds, phases, progress)
    progress.done()
    return {"load_average": [round(x, 2) for x in os.getloadavg()], **result}


def main(argv: list[str] | None = None) -> int:
    """Print the figures beside their targets, as JSON with `--json`, else as a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--changes", type=int, default=500, help="focus changes timed")
    parser.add_argument("--seconds", type=float, default=5.0, help="each phase of (b)")
    parser.add_argument("--phases", type=int, default=5, help="focus phases of (b)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} (seconds; noisy figures)")
    args = parser.parse_args(argv)
    if args.quick:
        args.changes, args.seconds, args.phases = QUICK.values()
    if args.changes < 1 or args.seconds <= 0 or args.phases < 2:
        parser.error("--changes at least 1, --seconds above 0, --phases at least 2")
    try:
        check_machine()
        result = measure(args.changes, args.seconds, args.phases)
    except UnsupportedError as why:
        print(f"focus: {why}", file=sys.stderr)
        return 2
    print_report(result, TARGETS, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
