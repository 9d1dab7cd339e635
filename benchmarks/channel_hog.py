"""A well-behaved app's tiny inferences while another app of its band holds every channel.

`npu-manager serve --driver onnxruntime` (two channels, each connection's models in a
model host) runs in a separate process; both apps are in the foreground, as the platform
would say (one band, where an app alone may use every channel). The well-behaved app, a
process of its own uid, times a model built in code (`ipc_inference.summing_model`, a
4 KiB input) run back to back, in rounds that alternate:

* cpu_burn, the control: a process that keeps a core busy and never calls the daemon;
* hog: an app of another uid with two connections, each running operations of about
  `--op-s` seconds back to back (a Loop whose trip count is calibrated through the daemon
  before the rounds), so that it holds both channels whenever it can. A channel beyond an
  app's first is borrowed, and is given back (the operation starts over later) when the
  well-behaved app waits with no channel (issue 29, item 4; docs: scheduling).

For each kind: the median over rounds of the round's p50 and p99 (microseconds), the
hog's p99 over the control's (target: at most 1.5, issue 29), how many operations the hog
completed a second (what the restarts cost it), and the daemon's descriptors and
resident size once the hog is gone, against the start (targets: at most 8 more
descriptors, 16 MiB more). Run as root, so that each app has a uid of its own (otherwise
both share the benchmark's, are one app, and nothing is borrowed).

Usage: python benchmarks/channel_hog.py [--json] [--quick] [--samples N] [--rounds R]
       [--op-s S]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _report import SERVE, Progress, Target, print_report  # beside this script
from daemon_attacks import MAX_MORE_FDS, MAX_MORE_RSS_MIB, SOCKET_GID, _daemon_state, cpu_burn
from ipc_inference import _loaded, _percentile, _timed
from onnx import TensorProto, helper, numpy_helper

import npumanager as npu
from npumanager.daemon.peer import answers

POLITE_UID = 20031
HOG_UID = 20032
WIDTH = 256
TINY = np.ones((4, WIDTH), dtype=np.float32)
"""The well-behaved app's input: 4 KiB."""
HOG_ROWS = 4
CALIBRATION_TRIPS = 20_000
VS_BURN_RATIO = 1.5
QUICK_SAMPLES = 200
"""`--quick`: inferences per round, one round of each kind (seconds; noisy figures)."""
WAIT_S = 60.0
"""How long the benchmark waits for an event (the daemon listening, the hog holding both
channels, its host gone) before it gives up."""
Event = Any

TARGETS = [
    Target(
        "hog_p99_vs_cpu_burn",
        "<=",
        VS_BURN_RATIO,
        why="issue 29: the channel hog vs the control (its tests: within 2x)",
    ),
    Target("most_fds_after", "<=", MAX_MORE_FDS, why="issue 29: descriptors come back"),
    Target("most_rss_mib_after", "<=", MAX_MORE_RSS_MIB, why="issue 29: memory comes back"),
]


def looping_model() -> bytes:
    """`y = x + trips` on `x: float32[rows, 256]`, one Add a trip of a Loop: an operation
    as long as its `trips` input says (`int64[1]`: a 0-d input reaches the daemon as
    `[1]`, so the graph makes it the Loop's scalar)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["going"], ["still_going"]),
            helper.make_node("Add", ["v", "one"], ["v_next"]),
        ],
        "trip",
        [
            helper.make_tensor_value_info("trip", TensorProto.INT64, []),
            helper.make_tensor_value_info("going", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, ["rows", WIDTH]),
        ],
        [
            helper.make_tensor_value_info("still_going", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_next", TensorProto.FLOAT, ["rows", WIDTH]),
        ],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Squeeze", ["trips", "axis"], ["count"]),
            helper.make_node("Loop", ["count", "go", "x"], ["y"], body=body),
        ],
        "looping",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", WIDTH]),
            helper.make_tensor_value_info("trips", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", WIDTH])],
        [
            numpy_helper.from_array(np.array(True), "go"),
            numpy_helper.from_array(np.array([0], np.int64), "axis"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def _feeds(trips: int) -> dict[str, np.ndarray]:
    return {"x": np.zeros((HOG_ROWS, WIDTH), np.float32), "trips": np.array([trips], np.int64)}


def _loop_model(manager: npu.NpuManager, request_id: int = 1) -> npu.LoadedModel:
    request = npu.ModelLoadRequest.Builder(request_id).set_size(0).build()
    lease = manager.reserve(request, timeout_s=WAIT_S)
    lease.__enter__()
    return lease.load_model(model=looping_model())


def calibrate(path: Path, op_s: float) -> tuple[int, float]:
    """The trip count of an operation of about `op_s` seconds through the daemon (scaled
    from the fastest of three short runs, then from one run of that count), and how long
    one run of it took."""
    with npu.connect(path, uses_feature=True) as manager:
        model = _loop_model(manager)

        def took_s(trips: int) -> float:
            return _timed(lambda: model.run(_feeds(trips)), 1)[0] / 1e6

        fastest = min(took_s(CALIBRATION_TRIPS) for _ in range(3))
        trips = max(1, int(CALIBRATION_TRIPS * op_s / fastest))
        trips = max(1, int(trips * op_s / took_s(trips)))
        return trips, took_s(trips)


def _own_uid(uid: int) -> None:
    """Become `uid` (in the socket's group) when run as root, as a launched app would be."""
    if os.geteuid() == 0:
        os.setgroups([SOCKET_GID])
        os.setgid(uid)
        os.setuid(uid)


def _polite(path: str, conn: Any) -> None:
    """The well-behaved app: for each number it is sent, that many timed tiny inferences
    back to back, their microseconds sent back; None ends it."""
    _own_uid(POLITE_UID)
    manager = npu.connect(path, uses_feature=True)
    model = _loaded(manager)
    _timed(lambda: model.run({"x": TINY}), 20)  # warm: its host started, its model opened
    conn.send("ready")
    while (samples := conn.recv()) is not None:
        conn.send(_timed(lambda: model.run({"x": TINY}), samples))
    manager.close()


def _hog(path: str, trips: int, stop: Event, ready: Event, done: Any) -> None:
    """The hog: two connections of one uid, each running `trips`-long operations back to
    back until `stop`; `done` counts the operations that completed."""
    _own_uid(HOG_UID)
    models = [_loop_model(npu.connect(path, uses_feature=True)) for _ in range(2)]

    def back_to_back(model: npu.LoadedModel) -> None:
        while not stop.is_set():
            model.run(_feeds(trips))
            with done.get_lock():
                done.value += 1

    for model in models:
        threading.Thread(target=back_to_back, args=(model,), daemon=True).start()
    ready.set()
    stop.wait()
    os._exit(0)  # its connections and hosts go with it, mid-operation


def _burner(stop: Event, ready: Event) -> None:
    ready.set()
    cpu_burn("", stop)


def _info(path: Path) -> dict[str, Any]:
    with npu.DaemonClient(path) as admin:
        return admin.info()


def _wait_for(what: str, predicate: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"channel_hog: {what} did not happen within {WAIT_S:g} s")
        time.sleep(0.05)


def _serve(path: Path) -> subprocess.Popen[bytes]:
    command = [*SERVE, "--socket", str(path)]
    options = ["--driver", "onnxruntime", "--socket-group", str(SOCKET_GID)]
    daemon = subprocess.Popen(
        [*command, *options, "--log-level", "error"], stderr=subprocess.DEVNULL
    )
    _wait_for("the daemon listening", lambda: answers(path))
    return daemon


def _hog_holds(path: Path) -> bool:
    return bool(_info(path)["devices"][0]["running"] == 2)


def _hog_gone(path: Path) -> bool:
    document = _info(path)
    hosts = [c for c in document["clients"] if c["uid"] == HOG_UID]
    return not hosts and document["devices"][0]["running"] == 0


class Rounds:
    """The daemon, the well-behaved app and the rounds played beside it."""

    def __init__(self, path: Path, daemon: subprocess.Popen[bytes], trips: int) -> None:
        self.path, self.daemon, self.trips = path, daemon, trips
        self.context = multiprocessing.get_context("fork")
        self.figures: dict[str, list[tuple[float, float]]] = {"cpu_burn": [], "hog": []}
        self.after: list[tuple[int, float]] = []
        self.completed, self.hog_seconds = 0, 0.0
        self.conn, theirs = self.context.Pipe()
        self.polite = self.context.Process(target=_polite, args=(str(path), theirs), daemon=True)
        self.polite.start()
        if not self.conn.poll(WAIT_S) or self.conn.recv() != "ready":
            raise SystemExit("channel_hog: the well-behaved app did not start")
        self.start = _daemon_state(daemon.pid)

    def play(self, kind: str, samples: int) -> None:
        """One round: the control or the hog beside the app's `samples` inferences."""
        stop, ready, done = self.context.Event(), self.context.Event(), self.context.Value("i", 0)
        hog = kind == "hog"
        if hog:
            args: tuple[Any, ...] = (str(self.path), self.trips, stop, ready, done)
            other = self.context.Process(target=_hog, args=args, daemon=True)
        else:
            other = self.context.Process(target=_burner, args=(stop, ready), daemon=True)
        other.start()
        ready.wait(WAIT_S)
        if hog:  # both channels its own before the first sample
            _wait_for("the hog holding both channels", lambda: _hog_holds(self.path))
        began = time.monotonic()
        self.conn.send(samples)
        times = self.conn.recv()
        self.figures[kind].append((_percentile(times, 0.5), _percentile(times, 0.99)))
        if hog:
            self.hog_seconds += time.monotonic() - began
            self.completed += done.value
        stop.set()
        other.join(WAIT_S)
        if other.is_alive():
            other.kill()
        if hog:
            _wait_for("the hog's hosts gone", lambda: _hog_gone(self.path))
            time.sleep(1.0)  # memory handed back
            self.after.append(_daemon_state(self.daemon.pid))

    def close(self) -> None:
        if self.polite.is_alive():
            self.conn.send(None)
            self.polite.join(WAIT_S)
        if self.polite.is_alive():
            self.polite.kill()

    def result(self) -> dict[str, Any]:
        """Medians over rounds of each kind's p50 and p99, and what the hog left behind."""
        result: dict[str, Any] = {
            "hog_ops_completed_per_s": round(self.completed / self.hog_seconds, 2)
        }
        for kind, rows in self.figures.items():
            result[f"{kind}_p50_us"] = round(statistics.median(r[0] for r in rows), 1)
            result[f"{kind}_p99_us"] = round(statistics.median(r[1] for r in rows), 1)
        result["hog_p99_vs_cpu_burn"] = round(result["hog_p99_us"] / result["cpu_burn_p99_us"], 2)
        result["most_fds_after"] = max(fds - self.start[0] for fds, _ in self.after)
        result["most_rss_mib_after"] = round(max(rss - self.start[1] for _, rss in self.after), 1)
        return result


def measure(samples: int, rounds: int, op_s: float) -> dict[str, Any]:
    """Rounds of the control and of the hog in turn; medians of per-round percentiles."""
    progress = Progress("a tiny inference beside a channel hog", 1 + rounds * 2)
    progress.step("the daemon, the apps and the hog's operation calibrated")
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        path = Path(tmp) / "npu.sock"
        daemon = _serve(path)
        try:
            with npu.DaemonClient(path) as admin:  # one band: both in the foreground
                for uid in (POLITE_UID, HOG_UID):
                    admin.set_uid_importance(uid, npu.IMPORTANCE_FOREGROUND)
            trips, op_took = calibrate(path, op_s)
            played = Rounds(path, daemon, trips)
            try:
                for round_number in range(rounds):
                    for kind in ("cpu_burn", "hog"):
                        progress.step(f"round {round_number + 1} of {rounds}, {kind}")
                        played.play(kind, samples)
            finally:
                played.close()
            progress.done()
        finally:
            daemon.terminate()
            daemon.wait(WAIT_S)
    return {
        "samples_per_round": samples,
        "rounds": rounds,
        "apps_have_own_uids": os.geteuid() == 0,
        "hog_trips": trips,
        "hog_op_s": round(op_took, 2),
        **played.result(),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the figures beside their targets, as JSON with `--json`, else as a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--samples", type=int, default=1000, help="inferences per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind")
    parser.add_argument("--op-s", type=float, default=0.9, help="the hog's operation, seconds")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_SAMPLES} inferences, one round of each (seconds; noisy)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.rounds = QUICK_SAMPLES, 1
    print_report(measure(args.samples, args.rounds, args.op_s), TARGETS, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
