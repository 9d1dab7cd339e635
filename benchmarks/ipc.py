"""The daemon's request-to-decision round trip against a raw Unix-socket echo, same run.

* echo: a separate process runs the plainest Python echo server (blocking `recv` and
  `sendall`); the client sends a frame the size of a request and waits for it back.
* rpc: `npu-manager serve` (status quo policy, vnpu on the real clock) in a separate
  process; the client calls `request_can_load_model` and the time runs until its
  `on_can_load_model` is called. The callback runs on the connection's reader thread
  (an inline executor), so this is the protocol's cost; `rpc_dispatch_*` is the same
  with the default executor, one more thread hop to the dispatcher. Each request is
  cancelled before the next (not timed).
* raw: the same request sent by a single-threaded client that speaks the protocol
  itself (no reader thread, no callbacks): the daemon's and the kernel's share of rpc.
* floor: the raw client against the decision floor (benchmarks/decision_floor.py), the
  least a Python server can do per request: the protocol's parser, the same arbiter and
  the protocol's encoders on a bare socket, in a process of its own. On a VM the wake-ups
  of a round trip that does any work cost more than the echo's, so the issue's 5x over
  the echo is also judged over this floor (`rpc_over_floor_p50`), which cannot meet it
  itself where `floor_p50_ratio` is above 5.

Rounds alternate echo and rpc so both see the same machine; figures are medians over
rounds of per-round percentiles.

* idle flood: the raw round trip while another uid holds 1,000 connections that said
  hello and say nothing, against raw rounds on the same daemon without them (target:
  p99 within 2x).
* death: under turn taking, a holder process is killed with SIGKILL while this process
  waits; the time from the kill until this process's `on_can_load_model(CAN_LOAD_NOW)`
  (target: within 100 ms).

* real inference (benchmarks/ipc_inference.py): the round trip of one inference through
  the daemon against the same model run in process, for 4 KiB and 1 MiB inputs (targets:
  overhead p50 <= 100 us, p99 <= 300 us at 1 MiB), and the two-process example's
  foreground p99 managed against solo (target: within 1.5x).

Usage: python benchmarks/ipc.py [--json] [--quick] [--samples N] [--rounds R] [--deaths D]
       [--infer-samples N] [--seconds S] [--example-rounds E]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipc_inference
from _report import SERVE, Progress, Target, print_report
from decision_floor import DecisionFloor

import npumanager as npu
from npumanager.core.client.dispatch import run_inline
from npumanager.daemon.wire import protocol as wire

TARGETS = [
    Target("p50_ratio", "<=", 2.5, why="issue 6: request to decision, p50 vs the echo"),
    Target("p99_ratio", "<=", 4, why="issue 6: request to decision, p99 vs the echo"),
    Target(
        "rpc_over_floor_p50",
        "<=",
        1.5,
        why="issue 40: at most 5x the echo, judged over the Python decision floor",
    ),
    Target("idle_flood_p99_ratio", "<=", 2, why="issue 11: 1,000 idle connections"),
    Target("death_to_grant_max_ms", "<=", 100, why="issue 6: a holder killed with SIGKILL"),
    *ipc_inference.TARGETS,
]

_ECHO_FRAME_BYTES = len(
    wire.encode(
        wire.RequestCanLoad(
            seq=1, request=npu.ModelLoadRequest.Builder(1).build(), uses_feature=True
        )
    )
)


def _echo_server(path: str, ready: Any) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    ready.set()
    conn, _ = listener.accept()
    while True:
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def echo_round(sock: socket.socket, samples: int) -> list[float]:
    """Round trips of one request-sized frame through the echo server, in microseconds."""
    frame = b"x" * _ECHO_FRAME_BYTES
    out = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        sock.sendall(frame)
        got = 0
        while got < len(frame):
            got += len(sock.recv(65536))
        out.append((time.perf_counter_ns() - start) / 1000)
    return out


class _Timed(npu.ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.decided = threading.Event()
        self.at = 0

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        self.at = time.perf_counter_ns()
        self.decided.set()


def rpc_round(
    manager: npu.NpuManager, samples: int, first_id: int, executor: Callable[..., Any] | None
) -> list[float]:
    """Request-to-decision times through the daemon, in microseconds."""
    out = []
    for i in range(samples):
        request = npu.ModelLoadRequest.Builder(first_id + i).build()
        callback = _Timed()
        start = time.perf_counter_ns()
        manager.request_can_load_model(request, callback, executor)
        callback.decided.wait(10)
        out.append((callback.at - start) / 1000)
        manager.cancel_model_load(request)
    return out


def raw_round(sock: socket.socket, samples: int, first_id: int) -> list[float]:
    """Request-to-decision times with the protocol spoken directly, in microseconds."""
    reader = wire.FrameReader()
    waiting: list[object] = []

    def take(count: int) -> None:
        while len(waiting) < count:
            waiting.extend(wire.parse_daemon(body) for body in reader.feed(sock.recv(65536)))
        del waiting[:count]

    out = []
    for i in range(first_id, first_id + samples):
        request = wire.RequestCanLoad(
            seq=2 * i + 1, request=npu.ModelLoadRequest.Builder(i).build(), uses_feature=True
        )
        start = time.perf_counter_ns()
        sock.sendall(wire.encode(request))
        take(1)  # the decision comes first, then the reply
        out.append((time.perf_counter_ns() - start) / 1000)
        take(1)
        sock.sendall(wire.encode(wire.CancelLoad(seq=2 * i + 2, request_id=i)))
        take(2)
    return out


_HOLDER = """
import sys, time, npumanager as npu
m = npu.connect(sys.argv[1], uses_feature=True)
class Hold(npu.ModelLoadRequestCallback):
    def on_can_load_model(self, request, status, listener):
        m.load_model(request, weight_bytes=1 << 20)
        listener.notify_model_loaded(request)
        print("held", flush=True)
m.request_can_load_model(npu.ModelLoadRequest.Builder(1).build(), Hold())
time.sleep(3600)
"""


class _Granted(npu.ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.granted = threading.Event()
        self.at = 0

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == npu.NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW:
            self.at = time.monotonic_ns()
            self.granted.set()


def death_to_grant_ms(path: Path, trials: int) -> list[float]:
    """Kill a holder with SIGKILL; milliseconds until the waiter is told CAN_LOAD_NOW."""
    out = []
    manager = npu.connect(path, uses_feature=True)
    for trial in range(trials):
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        request = npu.ModelLoadRequest.Builder(trial).build()
        waiter = _Granted()
        manager.request_can_load_model(request, waiter, run_inline)
        time.sleep(0.05)
        assert not waiter.granted.is_set(), "the waiter was granted while the holder held"
        killed = time.monotonic_ns()
        holder.kill()
        if not waiter.granted.wait(10):
            raise SystemExit("the waiter was never granted after the holder died")
        out.append((waiter.at - killed) / 1e6)
        holder.wait()
        manager.load_model(request, weight_bytes=1 << 20)
        manager.listener.notify_model_unloaded(request)
    manager.close()
    return out


def _wait_for(path: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the daemon exited early: {process.stderr.read().decode()}")  # type: ignore[union-attr]
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            return
        except OSError:
            time.sleep(0.05)
        finally:
            probe.close()
    raise SystemExit("the daemon did not start listening within 30 s")


def _serve(path: Path, *args: str) -> subprocess.Popen[bytes]:
    command = [*SERVE, "--socket", str(path)]
    daemon = subprocess.Popen([*command, "--log-level", "warning", *args], stderr=subprocess.PIPE)
    _wait_for(path, daemon)
    return daemon


def _start_echo(tmp: str) -> tuple[multiprocessing.Process, socket.socket]:
    path = os.path.join(tmp, "echo.sock")
    ready = multiprocessing.Event()
    echo = multiprocessing.Process(target=_echo_server, args=(path, ready), daemon=True)
    echo.start()
    ready.wait(10)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return echo, sock


def _raw_client(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.sendall(wire.encode(wire.HELLO))
    sock.recv(65536)  # the welcome
    return sock


def latency_rounds(tmp: str, samples: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(p50, p99) of every round of each kind, the kinds taking turns."""
    echo, echo_sock = _start_echo(tmp)
    daemon_path = Path(tmp) / "npu.sock"
    daemon = _serve(daemon_path)
    floor = DecisionFloor(tmp)
    rows: dict[str, list[tuple[float, float]]] = {
        "echo": [],
        "rpc": [],
        "dispatch": [],
        "raw": [],
        "floor": [],
    }
    try:
        manager = npu.connect(daemon_path, uses_feature=True)
        raw = _raw_client(daemon_path)
        echo_round(echo_sock, samples)  # warm-up
        rpc_round(manager, samples, 0, run_inline)
        raw_round(floor.sock, samples, 2 * 10**9)
        next_id = samples
        for _ in range(rounds):
            for name, figures in rows.items():
                if name == "echo":
                    times = echo_round(echo_sock, samples)
                elif name == "raw":
                    times = raw_round(raw, samples, 10**9 + next_id)
                elif name == "floor":
                    times = raw_round(floor.sock, samples, 3 * 10**9 + next_id)
                else:
                    executor = run_inline if name == "rpc" else None
                    times = rpc_round(manager, samples, next_id, executor)
                next_id += samples
                figures.append((_percentile(times, 0.5), _percentile(times, 0.99)))
        manager.close()
        raw.close()
    finally:
        daemon.terminate()
        daemon.wait(10)
        echo_sock.close()
        echo.terminate()
        floor.close()
    return rows


_IDLE_FLOOD = """
import os, socket, sys
from npumanager.daemon.wire import protocol as wire
if os.geteuid() == 0:
    os.setgroups([20000]); os.setgid(20021); os.setuid(20021)
held = []
for _ in range(1000):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1]); sock.sendall(wire.encode(wire.HELLO)); sock.recv(65536)
    held.append(sock)
print("ready", flush=True)
sys.stdin.read()
"""


def idle_flood_rounds(tmp: str, samples: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(p50, p99) of raw rounds without and with 1,000 idle connections of another uid."""
    path = Path(tmp) / "flood.sock"
    daemon = _serve(path, "--socket-group", "20000", "--max-connections-per-uid", "1100")
    os.chmod(tmp, 0o755)
    rows: dict[str, list[tuple[float, float]]] = {"raw_quiet": [], "raw_idle_flood": []}
    try:
        raw = _raw_client(path)
        next_id = 0
        for _ in range(rounds):
            for name, figures in rows.items():
                flood = None
                if name == "raw_idle_flood":
                    flood = subprocess.Popen(
                        [sys.executable, "-c", _IDLE_FLOOD, str(path)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    assert flood.stdout is not None and flood.stdout.readline() == "ready\n"
                times = raw_round(raw, samples, next_id)
                next_id += samples
                figures.append((_percentile(times, 0.5), _percentile(times, 0.99)))
                if flood is not None:
                    flood.communicate("", timeout=30)
        raw.close()
    finally:
        daemon.terminate()
        daemon.wait(10)
    return rows


def measure(
    samples: int,
    rounds: int,
    trials: int,
    infer_samples: int,
    seconds: float,
    example_rounds: int = 3,
    quick: bool = False,
) -> dict[str, Any]:
    """Latency rounds, the death trials and real inference; medians of the per-round p50
    and p99."""
    progress = Progress("ipc", [4, 2, 1, 3, 3])
    with tempfile.TemporaryDirectory() as tmp:
        progress.step(f"request round trips, {rounds} rounds of echo, rpc, dispatch and raw")
        rows = latency_rounds(tmp, samples, rounds)
        progress.step(f"raw round trips beside 1,000 idle connections, {rounds} rounds")
        rows |= idle_flood_rounds(tmp, samples, rounds)
        progress.step(f"{trials} holders killed with SIGKILL")
        turn_path = Path(tmp) / "turn.sock"
        daemon = _serve(turn_path, "--policy", "turn_taking")
        try:
            deaths = death_to_grant_ms(turn_path, trials)
        finally:
            daemon.terminate()
            daemon.wait(10)
    progress.step(f"inference through the daemon vs in process, {rounds} rounds")
    inference = ipc_inference.overhead(infer_samples, rounds)
    progress.step(f"the two-process example, {example_rounds} rounds of 3 runs of {seconds:g} s")
    inference |= ipc_inference.two_processes(seconds, example_rounds, quick=quick)
    progress.done()

    def med(name: str, index: int) -> float:
        return round(statistics.median(r[index] for r in rows[name]), 1)

    result: dict[str, Any] = {
        "samples_per_round": samples,
        "rounds": rounds,
        "frame_bytes": _ECHO_FRAME_BYTES,
        "echo_p50_us": med("echo", 0),
        "echo_p99_us": med("echo", 1),
        "rpc_p50_us": med("rpc", 0),
        "rpc_p99_us": med("rpc", 1),
        "rpc_dispatch_p50_us": med("dispatch", 0),
        "rpc_dispatch_p99_us": med("dispatch", 1),
        "raw_protocol_p50_us": med("raw", 0),
        "raw_protocol_p99_us": med("raw", 1),
        "decision_floor_p50_us": med("floor", 0),
        "decision_floor_p99_us": med("floor", 1),
    }
    result["raw_idle_flood_p50_us"] = med("raw_idle_flood", 0)
    result["raw_idle_flood_p99_us"] = med("raw_idle_flood", 1)
    result["idle_flood_p99_ratio"] = round(result["raw_idle_flood_p99_us"] / med("raw_quiet", 1), 2)
    result["p50_ratio"] = round(result["rpc_p50_us"] / result["echo_p50_us"], 2)
    result["p99_ratio"] = round(result["rpc_p99_us"] / result["echo_p99_us"], 2)
    result["raw_p50_ratio"] = round(result["raw_protocol_p50_us"] / result["echo_p50_us"], 2)
    result["floor_p50_ratio"] = round(result["decision_floor_p50_us"] / result["echo_p50_us"], 2)
    result["rpc_over_floor_p50"] = round(result["rpc_p50_us"] / result["decision_floor_p50_us"], 2)
    result["raw_over_floor_p50"] = round(
        result["raw_protocol_p50_us"] / result["decision_floor_p50_us"], 2
    )
    result["death_trials"] = trials
    result["death_to_grant_p50_ms"] = round(statistics.median(deaths), 2)
    result["death_to_grant_max_ms"] = round(max(deaths), 2)
    return result | inference


def main(argv: list[str] | None = None) -> int:
    """Print the figures with their targets, as one JSON object with `--json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a short, noisy run")
    parser.add_argument("--samples", type=int, default=2000, help="round trips per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each kind")
    parser.add_argument("--deaths", type=int, default=20, help="kill -9 trials")
    parser.add_argument("--infer-samples", type=int, default=500, help="inferences per round")
    parser.add_argument("--seconds", type=float, default=3.0, help="each two-process run")
    parser.add_argument(
        "--example-rounds", type=int, default=3, help="rounds of the two-process example"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.rounds, args.deaths = 200, 1, 2
        args.infer_samples, args.seconds, args.example_rounds = 100, 0.5, 1
    result = measure(
        args.samples,
        args.rounds,
        args.deaths,
        args.infer_samples,
        args.seconds,
        args.example_rounds,
        quick=args.quick,
    )
    print_report(result, TARGETS, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
