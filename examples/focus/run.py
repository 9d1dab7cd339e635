"""Focus decides: two apps of one person share the device through `npu-manager serve`, and the
app the user is looking at goes first, as GNOME's compositor says by a cgroup attribute.

Two apps of ONE uid, each a process in an app cgroup of its own, as a desktop launches them
(`app.slice/app-gnome-org.example.Call-<n>.scope`, `app-gnome-org.example.Indexer-<n>.scope`):

* the call, with a deadline: one inference every 16.7 ms (a frame), as in
  examples/two_processes;
* the indexer, flooding: inferences back to back on `--flood-threads` connections.

The daemon finds each app from its process's cgroup at hello, and its `desktop` importance
source (on by default where cgroup v2 is mounted) watches `user.xdg.inactive-since` on the
apps' cgroups. The script moves the focus exactly as Mutter does: `-1` on the app that gets
it, the time in microseconds of `CLOCK_MONOTONIC` on the one that lost it. Phases alternate
(`--phases`, 3 by default): the call focused, then the indexer, then the call again. Each
phase begins once the daemon shows the new importances (`DaemonClient.info()["apps"]`, as
`npu-manager apps --json` does) and lasts `--seconds`; the script prints each app's
importance, what decided it, and the call's p50/p99 latency per phase, then the call's p99
without the focus over its p99 with it.

With the daemon's default ladder an app that lost the focus is `SERVICE` at once, out of the
device's focus band, and the focus decides which app's work goes first;
`--ladder VISIBLE@0/SERVICE@60/CACHED@600` keeps an app that lost the focus `VISIBLE`, in
the same band as the `FOREGROUND` one, where the device scheduler's fair share alone decides
between the two, and the focus is worth little to the call (benchmarks/focus.py measures
both).

The apps' cgroups: where a systemd user manager runs for `--uid` (a desktop session;
`sudo python run.py --uid 1000`), each app is started by `systemd-run --user --scope` as
that user and the daemon's socket is given to the user's group; otherwise the script writes
cgroupfs as root, making both cgroups below its own cgroup (the app's user manager's folder,
`user@<uid>.service/app.slice/...`, mimicked), and each app moves itself in before it drops to
the uid and connects, and the daemon's `desktop` source watches that folder only (a focus
written elsewhere on the machine, by a desktop or another run, changes nothing here). The
development machines have no user manager: the cgroupfs path is what runs there.
Processes, cgroups and the daemon are removed at the end, on Ctrl-C or on an error too.

    sudo python examples/focus/run.py [--seconds 5] [--phases 3] [--ladder L]
        [--driver-option KEY=VALUE] [--json] [--quick]

Needs root, cgroup v2 and pip install -e '.[onnxruntime]'; otherwise one line and exit 2.
Figures are this machine's CPU; no NPU is used.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import npumanager as npu
from npumanager.apps.identity import cgroup_of_pid, v2_mount
from npumanager.daemon.peer import answers
from npumanager.plugins.importance.desktop import FOCUSED, XATTR
from npumanager.plugins.importance.options import DesktopOptions

APP = Path(__file__).with_name("app.py")
APP_UID, SOCKET_GID = 20011, 20010
"""The cgroupfs launcher: both apps' uid, and the group the daemon's socket is given to."""
CALL, INDEXER = "org.example.Call", "org.example.Indexer"
ROLES = {CALL: "deadline", INDEXER: "flood"}
ROWS = {CALL: 48, INDEXER: 512}
"""Rows of each app's inference, as in examples/two_processes."""
FRAME_MS = 1000 / 60
WAIT_S = 120.0
"""How long the script waits for the daemon, an app or an importance before it gives up."""
QUICK_SECONDS = 1.5


class UnsupportedError(Exception):
    """The machine cannot run the example (one line, exit 2)."""


def check_machine() -> tuple[Path, str]:
    """The cgroup v2 mount and this process's cgroup, or `UnsupportedError` saying what lacks."""
    if os.geteuid() != 0:
        raise UnsupportedError(
            "needs root: it makes cgroups, moves processes and sets their xattrs"
        )
    mount = v2_mount()
    if mount is None:
        raise UnsupportedError("no cgroup v2 hierarchy is mounted (see /proc/self/mountinfo)")
    home = cgroup_of_pid(os.getpid())
    if home is None:
        raise UnsupportedError("this process has no cgroup v2 line in /proc/self/cgroup")
    if importlib.util.find_spec("onnxruntime") is None:
        raise UnsupportedError("needs onnxruntime: pip install -e '.[onnxruntime]'")
    return mount, home


def wait_until(what: str, done: Any, process: subprocess.Popen[Any] | None = None) -> None:
    """Poll `done()` until it holds; `what` in the error if it does not within `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process ended (exit {process.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {WAIT_S:g} s")
        time.sleep(0.01)


@dataclass
class Launcher:
    """How the apps get their cgroups and their uid: `systemd-run --user --scope` as a user
    whose manager runs, or cgroupfs written as root below this process's cgroup."""

    mount: Path
    uid: int
    gid: int
    folder: Path | None = None
    """cgroupfs: the folder made for the example, removed at the end."""

    @property
    def name(self) -> str:
        return "cgroupfs" if self.folder is not None else "systemd-run"

    @classmethod
    def choose(cls, mount: Path, home: str, uid: int) -> Launcher:
        """systemd-run where `uid` has a user manager, else cgroupfs below `home`."""
        bus = Path(f"/run/user/{uid}/bus")
        if shutil.which("systemd-run") and shutil.which("runuser") and bus.exists():
            try:
                return cls(mount, uid, pwd.getpwuid(uid).pw_gid)
            except KeyError:
                pass
        folder = mount / home.lstrip("/") / f"npu-focus-{secrets.token_hex(4)}"
        try:
            folder.mkdir()
        except OSError as error:
            raise UnsupportedError(
                f"cannot make a cgroup under {folder.parent}: {error.strerror}"
            ) from None
        return cls(mount, uid, SOCKET_GID, folder)

    def command(self, app_id: str, app: list[str]) -> list[str]:
        """The command that starts `app` as the app `app_id`, in a cgroup named for it."""
        unit = f"app-gnome-{app_id}-{secrets.randbelow(1 << 20)}.scope"
        if self.folder is None:
            user = pwd.getpwuid(self.uid)
            scope = ["systemd-run", "--user", "--scope", "--quiet", f"--unit={unit}", "--"]
            env = [f"XDG_RUNTIME_DIR=/run/user/{self.uid}", f"HOME={user.pw_dir}"]
            return ["runuser", "-u", user.pw_name, "--", "env", *env, *scope, *app]
        cgroup = self.folder / f"user@{self.uid}.service" / "app.slice" / unit
        cgroup.mkdir(parents=True)
        return [*app, "--cgroup", str(cgroup), "--uid", str(self.uid), "--gid", str(self.gid)]

    def remove(self) -> None:
        """cgroupfs: every process left back to our cgroup, every folder removed leaf-first."""
        if self.folder is None or not self.folder.exists():
            return
        home = self.folder.parent / "cgroup.procs"
        for folder, _, _ in os.walk(self.folder, topdown=False):
            for pid in (Path(folder) / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                    home.write_text(pid)
            for _ in range(100):  # a cgroup stays busy a moment after its last process left
                try:
                    os.rmdir(folder)
                    break
                except OSError as error:
                    if error.errno != errno.EBUSY:
                        raise
                    time.sleep(0.01)


class App:
    """One app's process: started, ready, told to go and to stop, and what it measured."""

    def __init__(self, launcher: Launcher, app_id: str, socket: Path, flood_threads: int):
        command = [sys.executable, str(APP), ROLES[app_id], "--socket", str(socket)]
        command += ["--rows", str(ROWS[app_id])]
        command += ["--threads", str(flood_threads if app_id == INDEXER else 1)]
        self.process = subprocess.Popen(
            launcher.command(app_id, command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C reaches the script, which stops the apps
        )
        self.app_id, self.mount = app_id, launcher.mount
        self.found: dict[str, Any] = {}

    def ready(self) -> None:
        """Wait for its line: the app the daemon found it to be, and its cgroup."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the app {self.app_id} did not start (exit {self.process.wait()})")
        self.found = json.loads(line)
        if self.found["app_id"] != self.app_id:
            raise RuntimeError(f"the daemon took {self.app_id} for {self.found['app_id']}")
        self.cgroup = self.mount / str(self.found["cgroup"]).lstrip("/")

    def say(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def result(self) -> dict[str, Any]:
        """Stop it and read what it measured."""
        self.say("stop")
        out, _ = self.process.communicate(timeout=WAIT_S)
        if self.process.returncode != 0:
            raise RuntimeError(f"an app failed (exit {self.process.returncode})")
        document: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return document

    def end(self) -> None:
        """Close its stdin (it stops and leaves, even behind runuser), else kill it."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            self.process.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def serve(
    directory: Path,
    gid: int,
    ladder: str | None = None,
    root: Path | None = None,
    driver_options: Sequence[str] = (),
) -> Iterator[Path]:
    """`npu-manager serve --driver onnxruntime` on a socket in `directory` that `gid` may use;
    its default importance sources (`rules`, `desktop`, `slices`) rank the apps, the
    `desktop` source with `ladder` if given and watching only `root` if given, and the
    driver built with `driver_options` (`KEY=VALUE` each)."""
    path = directory / "npu.sock"
    os.chmod(directory, 0o755)
    command = [sys.executable, "-m", "npumanager", "serve", "--driver", "onnxruntime"]
    command += ["--socket", str(path), "--socket-group", str(gid), "--log-level", "warning"]
    command += [arg for option in driver_options for arg in ("--driver-option", option)]
    desktop = [f"ladder={ladder}"] * (ladder is not None) + [f"root={root}"] * (root is not None)
    if desktop:
        sources = ["rules", "desktop:" + ",".join(desktop), "slices"]
        command += [arg for source in sources for arg in ("--importance", source)]
    daemon = subprocess.Popen(command, start_new_session=True)
    try:
        wait_until("the daemon listening", lambda: answers(path), daemon)
        yield path
    finally:
        daemon.terminate()
        try:
            daemon.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def move_focus(apps: dict[str, App], focused: str) -> None:
    """What Mutter writes when the focus moves to `focused`: the time on the others, then -1."""
    lost = str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000).encode()
    for app_id, app in apps.items():
        if app_id != focused:
            os.setxattr(app.cgroup, XATTR, lost)
    os.setxattr(apps[focused].cgroup, XATTR, str(FOCUSED).encode())


def shown(admin: npu.DaemonClient) -> dict[str, dict[str, Any]]:
    """Each app of the example as the daemon shows it: importance and source by app id."""
    return {a["app_id"]: a for a in admin.info()["apps"] if a["app_id"] in ROLES}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figures(latencies: list[float]) -> dict[str, Any]:
    """p50, p99 and missed frames of the call's latencies (milliseconds)."""
    if not latencies:
        return {"frames": 0, "p50_ms": None, "p99_ms": None, "missed_frames": 0}
    return {
        "frames": len(latencies),
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "missed_frames": sum(ms > FRAME_MS for ms in latencies),
    }


def p99_over(without: dict[str, Any], with_focus: dict[str, Any]) -> float | None:
    """The call's p99 without the focus over with it; None where either side saw no frame
    (on a machine kept busy, an unfocused call may finish none in a short phase)."""
    if without["p99_ms"] is None or with_focus["p99_ms"] is None:
        return None
    return round(without["p99_ms"] / with_focus["p99_ms"], 2)


def first_step(ladder: str | None) -> str:
    """The importance an app has just after it lost the focus (the ladder's first step)."""
    options = DesktopOptions() if ladder is None else DesktopOptions(ladder=ladder)
    return options.ladder[0][1].name


def play(
    apps: dict[str, App], admin: npu.DaemonClient, seconds: float, phases: int, unfocused: str
) -> list[Any]:
    """The phases: focus moved, the daemon's importances awaited, `seconds` of both apps."""
    for app in apps.values():
        app.say("go")
    played = []
    for number in range(phases):
        focused = CALL if number % 2 == 0 else INDEXER
        moved = time.monotonic()
        move_focus(apps, focused)
        expected = {a: "FOREGROUND" if a == focused else unfocused for a in apps}

        def arrived(expected: dict[str, str] = expected) -> bool:
            return {a: s["importance"] for a, s in shown(admin).items()} == expected

        wait_until(f"the focus on {focused} shown by the daemon", arrived)
        start = time.monotonic()
        state = shown(admin)
        time.sleep(seconds)
        played.append(
            {
                "focused": focused,
                "importance": {a: state[a]["importance"] for a in sorted(state)},
                "source": {a: state[a]["importance_source"] for a in sorted(state)},
                "shown_after_ms": round((start - moved) * 1000, 1),
                "span": (start, time.monotonic()),
            }
        )
    return played


def run(
    seconds: float,
    phases: int,
    uid: int,
    flood_threads: int,
    ladder: str | None = None,
    driver_options: Sequence[str] = (),
) -> dict[str, Any]:
    """Everything set up, the phases played, everything removed; the figures. `ladder`: the
    `desktop` source's (default: the daemon's own, `SERVICE` first); `driver_options`: the
    daemon's `--driver-option`s."""
    unfocused = first_step(ladder)
    mount, home = check_machine()
    launcher = Launcher.choose(mount, home, uid)
    apps: dict[str, App] = {}
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            serve(Path(tmp), launcher.gid, ladder, launcher.folder, driver_options) as socket,
        ):
            try:
                for app_id in (CALL, INDEXER):
                    apps[app_id] = App(launcher, app_id, socket, flood_threads)
                for app in apps.values():
                    app.ready()
                with npu.DaemonClient(socket) as admin:  # root: sees every uid's apps
                    played = play(apps, admin, seconds, phases, unfocused)
                measured = {app_id: app.result() for app_id, app in apps.items()}
            finally:
                for app in apps.values():
                    app.end()
    finally:
        launcher.remove()
    frames, ends = measured[CALL]["frames"], measured[INDEXER]["ends"]
    pooled: dict[bool, list[float]] = {True: [], False: []}
    for phase in played:
        start, end = phase.pop("span")
        latencies = [ms for at, ms in frames if start <= at < end]
        pooled[phase["focused"] == CALL] += latencies
        phase.update(figures(latencies))
        done = sum(start <= at < end for at in ends)
        phase["indexer_per_s"] = round(done / (end - start), 1)
    with_focus, without = figures(pooled[True]), figures(pooled[False])
    return {
        "seconds": seconds,
        "launcher": launcher.name,
        "cgroup_folder": None if launcher.folder is None else str(launcher.folder),
        "uid": uid,
        "flood_threads": flood_threads,
        "ladder": ladder,
        "hal_uids": {app_id: app.found["hal_uid"] for app_id, app in apps.items()},
        "phases": played,
        "call_p99_with_focus_ms": with_focus["p99_ms"],
        "call_p99_without_focus_ms": without["p99_ms"],
        "call_p50_with_focus_ms": with_focus["p50_ms"],
        "call_p50_without_focus_ms": without["p50_ms"],
        "without_over_with_focus_p99": p99_over(without, with_focus),
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"two apps of uid {result['uid']} ({result['launcher']} cgroups); the call runs a "
        f"frame every 16.7 ms, the indexer floods on {result['flood_threads']} connections"
    )
    print(
        f"{'phase':>5} {'focus':<20} {'Call':<11} {'Indexer':<11} {'shown ms':>8} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'missed':>6} {'idx inf/s':>9}"
    )
    for number, phase in enumerate(result["phases"], 1):
        importance = phase["importance"]
        print(
            f"{number:>5} {phase['focused']:<20} {importance[CALL]:<11} "
            f"{importance[INDEXER]:<11} {phase['shown_after_ms']:>8} {phase['p50_ms']:>7} "
            f"{phase['p99_ms']:>7} {phase['missed_frames']:>6} {phase['indexer_per_s']:>9}"
        )
    print(
        f"the call's p99: {result['call_p99_with_focus_ms']} ms with the focus, "
        f"{result['call_p99_without_focus_ms']} ms without "
        f"({result['without_over_with_focus_p99']}x)"
    )


def stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--phases", type=int, default=3, help="focus changes (at least 2)")
    parser.add_argument("--uid", type=int, default=APP_UID, help="the apps' uid")
    parser.add_argument("--flood-threads", type=int, default=2, help="the indexer's connections")
    parser.add_argument(
        "--ladder",
        help="the desktop source's ladder, e.g. SERVICE@0/CACHED@600 (default: the "
        "daemon's, SERVICE@0/CACHED@600)",
    )
    parser.add_argument(
        "--driver-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to the daemon (`serve --driver-option`), e.g. background_idle=false",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SECONDS:g} s phases")
    args = parser.parse_args()
    if args.quick:
        args.seconds = QUICK_SECONDS
    if args.seconds <= 0 or args.phases < 2 or args.flood_threads < 1:
        parser.error("--seconds must be above 0, --phases at least 2, --flood-threads at least 1")
    try:
        first_step(args.ladder)
    except ValidationError as error:
        parser.error(
            f"--ladder {args.ladder}: {error.errors()[0]['msg'].removeprefix('Value error, ')}"
        )
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        result = run(
            args.seconds,
            args.phases,
            args.uid,
            args.flood_threads,
            args.ladder,
            args.driver_option,
        )
    except UnsupportedError as why:
        print(f"examples/focus: {why}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "examples/focus: interrupted; the apps, their cgroups and the daemon are gone",
            file=sys.stderr,
        )
        return 130
    except RuntimeError as error:
        print(f"examples/focus: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
