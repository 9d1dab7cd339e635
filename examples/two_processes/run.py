"""Two apps in two processes share one device through `npu-manager serve`: the foreground
app's latency managed (through the daemon) against direct (each calling onnxruntime).

Three kinds of run of a few seconds each, same model, same machine:

* solo: the foreground app alone, through the daemon;
* managed: the foreground app and a background flood, both through the daemon, which
  ranks the foreground's work first and keeps one channel for it;
* direct: the same two apps, each calling onnxruntime itself.

Each kind runs `--rounds` times (solo and managed taking turns on one daemon) and its
frames are pooled: a p99 over one 3 s run is its second-worst frame of 180, which a
shared machine's hiccups move by 2x from run to run.

Run as root, each app gets a uid of its own and the daemon is told which is foreground
(as the platform tells it); as another user both apps share that user's uid and the
background app's work is marked less important with its job priority.

    python examples/two_processes/run.py [--seconds 3] [--rounds 3] [--json]

Needs: pip install -e '.[onnxruntime]'. Figures are this machine's CPU; no NPU is used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import npumanager as npu

APP = Path(__file__).with_name("app.py")
FOREGROUND_UID, BACKGROUND_UID, SOCKET_GID = 20001, 20002, 20000
FOREGROUND_ROWS, BACKGROUND_ROWS = 48, 512
BACKGROUND_JOB_PRIORITY = 900
"""With one uid for both apps: the background's work ranks in a lower band than the
foreground's."""


def serve(directory: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
    """`npu-manager serve --driver onnxruntime` (and `extra`) on a socket in `directory`."""
    path = directory / "npu.sock"
    command = [sys.executable, "-m", "npumanager", "serve", "--driver", "onnxruntime", *extra]
    command += ["--socket", str(path), "--log-level", "warning"]
    if os.geteuid() == 0:
        command += ["--socket-group", str(SOCKET_GID)]
        os.chmod(directory, 0o755)
    daemon = subprocess.Popen(command)
    deadline = time.monotonic() + 30
    while not path.exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the daemon did not start")
        time.sleep(0.05)
    if os.geteuid() == 0:
        with npu.DaemonClient(path) as admin:  # root manages: it says who is in front
            admin.set_uid_importance(FOREGROUND_UID, npu.IMPORTANCE_FOREGROUND)
            admin.set_uid_importance(BACKGROUND_UID, npu.IMPORTANCE_CACHED)
    return daemon, path


def start_app(role: str, socket: Path | None, seconds: float) -> subprocess.Popen[str]:
    rows = FOREGROUND_ROWS if role == "foreground" else BACKGROUND_ROWS
    command = [sys.executable, str(APP), role, "--rows", str(rows), "--seconds", str(seconds)]
    command += ["--direct"] if socket is None else ["--socket", str(socket)]
    if os.geteuid() == 0:
        uid = FOREGROUND_UID if role == "foreground" else BACKGROUND_UID
        command += ["--uid", str(uid), "--gid", str(SOCKET_GID)]
    elif role == "background":
        command += ["--job-priority", str(BACKGROUND_JOB_PRIORITY)]
    app = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert app.stdout is not None
    if app.stdout.readline() != "ready\n":
        raise SystemExit(f"the {role} app did not start")
    return app


def run(roles: list[str], socket: Path | None, seconds: float) -> dict[str, dict[str, Any]]:
    """Start the apps, let them go together, collect what each measured."""
    apps = {role: start_app(role, socket, seconds) for role in roles}
    for app in apps.values():
        assert app.stdin is not None
        app.stdin.write("go\n")
        app.stdin.flush()
    results = {}
    for role, app in apps.items():
        out, _ = app.communicate(timeout=seconds + 60)
        results[role] = json.loads(out.strip().splitlines()[-1])
    return results


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(seconds: float, rounds: int = 3, serve_args: list[str] | None = None) -> dict[str, Any]:
    """Every kind of run `rounds` times, and the figures of their pooled frames."""
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {"solo": [], "managed": [], "direct": []}
    with tempfile.TemporaryDirectory() as tmp:
        daemon, socket = serve(Path(tmp), serve_args or [])
        try:
            for _ in range(rounds):
                runs["solo"].append(run(["foreground"], socket, seconds))
                runs["managed"].append(run(["foreground", "background"], socket, seconds))
        finally:
            daemon.terminate()
            daemon.wait(30)
    for _ in range(rounds):
        runs["direct"].append(run(["foreground", "background"], None, seconds))
    figures: dict[str, Any] = {
        "seconds": seconds,
        "rounds": rounds,
        "separate_uids": os.geteuid() == 0,
    }
    for name, results in runs.items():
        latencies = [ms for result in results for ms in result["foreground"]["latencies_ms"]]
        figures[f"fg_{name}_frames"] = len(latencies)
        figures[f"fg_{name}_p50_ms"] = round(statistics.median(latencies), 2)
        figures[f"fg_{name}_p99_ms"] = round(percentile(latencies, 0.99), 2)
        figures[f"fg_{name}_missed_frames"] = sum(r["foreground"]["missed_frames"] for r in results)
        if "background" in results[0]:
            rates = [result["background"]["per_s"] for result in results]
            figures[f"bg_{name}_per_s"] = round(statistics.mean(rates), 1)
    figures["managed_over_solo_p99_by_round"] = [
        round(
            percentile(managed["foreground"]["latencies_ms"], 0.99)
            / percentile(solo["foreground"]["latencies_ms"], 0.99),
            2,
        )
        for solo, managed in zip(runs["solo"], runs["managed"], strict=True)
    ]
    figures["managed_over_solo_p99"] = round(
        figures["fg_managed_p99_ms"] / figures["fg_solo_p99_ms"], 2
    )
    figures["managed_over_direct_p99"] = round(
        figures["fg_managed_p99_ms"] / figures["fg_direct_p99_ms"], 2
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind, pooled")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for the daemon (repeatable), e.g. "
        "--serve-arg=--driver-option=background_idle=false",
    )
    args = parser.parse_args()
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be above 0 and --rounds at least 1")
    figures = summary(args.seconds, args.rounds, args.serve_arg)
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"foreground app, one inference every 16.7 ms, {args.rounds} runs of "
        f"{args.seconds:g} s of each kind, frames pooled:"
    )
    print(f"{'':10} {'p50 ms':>8} {'p99 ms':>8} {'missed':>7} {'bg inf/s':>9}")
    for name in ("solo", "managed", "direct"):
        bg = figures.get(f"bg_{name}_per_s", "-")
        print(
            f"{name:10} {figures[f'fg_{name}_p50_ms']:>8} {figures[f'fg_{name}_p99_ms']:>8} "
            f"{figures[f'fg_{name}_missed_frames']:>7} {bg:>9}"
        )
    print(
        f"managed p99 is {figures['managed_over_solo_p99']}x solo (target <= 1.5; by round: "
        f"{figures['managed_over_solo_p99_by_round']}) and "
        f"{figures['managed_over_direct_p99']}x direct"
    )


if __name__ == "__main__":
    main()
