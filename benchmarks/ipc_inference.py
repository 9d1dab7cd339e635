"""Real inference through the daemon against the same model run in process, same run.

* overhead: a model built in code (the input summed along its rows: the output is small,
  so the figure is the cost of moving the input and the round trip) with inputs of 4 KiB
  and 1 MiB, run by an app in the foreground (its importance set as the platform would,
  here and in the daemon). In process, a `Service` on the onnxruntime driver runs
  `LoadedModel.run`;
  through the daemon, `npu-manager serve --driver onnxruntime` in another process and
  `npumanager.connect()`, the same call. Rounds alternate the two; the overhead of a
  round is its p50 (p99) less the in-process round's p50 (p99) beside it, and the
  figure is the median over rounds. Targets: p50 <= 100 us, p99 <= 300 us at 1 MiB.
* in place: the same through the daemon with the input in a `shared_array` (the app
  wrote it into the segment: no copy); `in_place_overhead_*`.
* hosted: the same two through a daemon started with `--model-hosts` (the model runs in a
  host process: one more hop); `hosted_*_vs_floor` is its overhead over the floor's.
  Targets (issue 29): 4 KiB p50 at most 2x the floor, 1 MiB `shared_array` p50 at most
  1.5x. The floor crosses one process boundary each way and a hosted run two (client to
  daemon, daemon to host).
* floor: a bare round trip with no framework (benchmarks/ipc_floor.py: a memfd, a
  socketpair and a process blocked in recv running the same model's session) less the
  same session run here, in the same rounds: what moving the input to another process
  and back costs on this machine before any of npu-manager runs.
* relay floor: the same with a third bare process in the middle that passes each message
  on and its answer back, as a host's hop does (`floor_relay_*`): what two crossings cost
  with no code of ours; `hosted_*_vs_relay` is a hosted run's overhead over that.
* two processes: examples/two_processes/run.py (a foreground app with a 16.7 ms frame
  beside a background flood, through the daemon and direct), 3 rounds of each kind of run
  with their frames pooled (1 with `--quick`). Target: the foreground's managed p99
  within 1.5x its solo p99.

Run by benchmarks/ipc.py with the raw Unix-socket echo, or alone:
python benchmarks/ipc_inference.py [--json] [--quick] [--samples N] [--rounds R] [--seconds S]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _report import SERVE, Progress, Target, print_report
from ipc_floor import BareRoundTrip
from ipc_floor import session as floor_session
from onnx import TensorProto, helper

import npumanager as npu

SIZES = {"4kib": 4 << 10, "1mib": 1 << 20}
WIDTH = 256
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "two_processes" / "run.py"


def summing_model() -> bytes:
    """`y = sum(x, axis=1)` on `x: float32[rows, 256]`: output 1/256 of the input."""
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [node],
        "sum_rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows"])],
        [axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _loaded(manager: npu.NpuManager) -> npu.LoadedModel:
    request = npu.ModelLoadRequest.Builder(1).set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB).build()
    lease = manager.reserve(request, timeout_s=30)
    lease.__enter__()
    return lease.load_model(model=summing_model())


def _timed(call: Callable[[], object], samples: int) -> list[float]:
    """Microseconds each of `samples` calls took."""
    times = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


def _serve(path: Path, *extra: str) -> subprocess.Popen[bytes]:
    command = [*SERVE, "--driver", "onnxruntime", *extra]
    daemon = subprocess.Popen([*command, "--socket", str(path), "--log-level", "warning"])
    deadline = time.monotonic() + 30
    while not path.exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the daemon did not start listening within 30 s")
        time.sleep(0.05)
    return daemon


KINDS = (
    "in_process",
    "daemon",
    "in_place",
    "hosted",
    "hosted_in_place",
    "crossed",
    "relayed",
    "bare",
)
"""What each round times: `LoadedModel.run` in process and through the daemon (a plain
input, copied into the segment), through the daemon with a `shared_array` input (read in
place), the same two through a daemon with `--model-hosts`, the floor's bare round trip,
the same through a bare relay, and the bare session here."""


def overhead(samples: int, rounds: int) -> dict[str, Any]:
    """Per-size medians over rounds of the daemon's p50/p99 less the in-process ones."""
    rows: dict[str, list[dict[str, tuple[float, float]]]] = {size: [] for size in SIZES}
    service = npu.Service("onnxruntime")
    floor = BareRoundTrip(summing_model())
    relay = BareRoundTrip(summing_model(), relay=True)
    session = floor_session(summing_model())
    with tempfile.TemporaryDirectory() as tmp:
        daemon = _serve(Path(tmp) / "npu.sock", "--no-model-hosts")
        hosting = _serve(Path(tmp) / "hosts.sock", "--model-hosts")
        try:
            # The app is in the foreground, as the platform would say, in every place.
            service.set_uid_importance(10001, npu.IMPORTANCE_FOREGROUND)
            for name in ("npu.sock", "hosts.sock"):
                with npu.DaemonClient(Path(tmp) / name) as admin:
                    admin.set_uid_importance(os.getuid(), npu.IMPORTANCE_FOREGROUND)
            local = _loaded(service.manager(10001, uses_feature=True))
            remote_manager = npu.connect(Path(tmp) / "npu.sock", uses_feature=True)
            remote = _loaded(remote_manager)
            hosted_manager = npu.connect(Path(tmp) / "hosts.sock", uses_feature=True)
            hosted = _loaded(hosted_manager)
            for _ in range(rounds):
                for size, nbytes in SIZES.items():
                    x = np.ones((nbytes // (4 * WIDTH), WIDTH), dtype=np.float32)
                    shared = remote_manager.shared_array(x.shape)
                    shared[:] = x
                    shared_hosted = hosted_manager.shared_array(x.shape)
                    shared_hosted[:] = x
                    calls = {
                        "in_process": lambda x=x: local.run({"x": x}),
                        "daemon": lambda x=x: remote.run({"x": x}),
                        "in_place": lambda s=shared: remote.run({"x": s}),
                        "hosted": lambda x=x: hosted.run({"x": x}),
                        "hosted_in_place": lambda s=shared_hosted: hosted.run({"x": s}),
                        "crossed": lambda x=x: [floor.run(x)],
                        "relayed": lambda x=x: [relay.run(x)],
                        "bare": lambda x=x: session.run(None, {"x": x}),
                    }
                    first = [call()[0] for call in calls.values()]
                    assert all(np.array_equal(first[0], other) for other in first[1:])
                    rows[size].append(
                        {
                            kind: (_percentile(times, 0.5), _percentile(times, 0.99))
                            for kind, call in calls.items()
                            for times in [_timed(call, samples)]
                        }
                    )
            remote_manager.close()
            hosted_manager.close()
        finally:
            for process in (daemon, hosting):
                process.terminate()
                process.wait(30)
            service.close()
            floor.close()
            relay.close()
    result: dict[str, Any] = {}
    for size, figures in rows.items():
        result[f"in_process_{size}_p50_us"] = _median(figures, "in_process", None, 0)
        result[f"daemon_{size}_p50_us"] = _median(figures, "daemon", None, 0)
        for name, kind, base in (
            ("infer_overhead", "daemon", "in_process"),
            ("in_place_overhead", "in_place", "in_process"),
            ("hosted_overhead", "hosted", "in_process"),
            ("hosted_in_place_overhead", "hosted_in_place", "in_process"),
            ("floor", "crossed", "bare"),
            ("floor_relay", "relayed", "bare"),
        ):
            result[f"{name}_{size}_p50_us"] = _median(figures, kind, base, 0)
            result[f"{name}_{size}_p99_us"] = _median(figures, kind, base, 1)
        floor = max(result[f"floor_{size}_p50_us"], 1.0)
        for name in ("infer_overhead", "in_place_overhead", "hosted_overhead"):
            result[f"{name}_{size}_p50_vs_floor"] = round(
                result[f"{name}_{size}_p50_us"] / floor, 2
            )
        hosted_in_place = result[f"hosted_in_place_overhead_{size}_p50_us"]
        result[f"hosted_in_place_{size}_p50_vs_floor"] = round(hosted_in_place / floor, 2)
        relayed = max(result[f"floor_relay_{size}_p50_us"], 1.0)
        result[f"floor_relay_{size}_p50_vs_floor"] = round(relayed / floor, 2)
        result[f"hosted_overhead_{size}_p50_vs_relay"] = round(
            result[f"hosted_overhead_{size}_p50_us"] / relayed, 2
        )
        result[f"hosted_in_place_{size}_p50_vs_relay"] = round(hosted_in_place / relayed, 2)
    return result


def _median(
    figures: list[dict[str, tuple[float, float]]], kind: str, base: str | None, at: int
) -> float:
    """The median over rounds of a kind's p50 (`at` 0) or p99 (1), less `base`'s."""
    return round(
        statistics.median(f[kind][at] - (f[base][at] if base else 0.0) for f in figures), 1
    )


QUICK_SERVE_ARGS = ("--serve-arg=--driver-option=background_idle=false",)
"""A quick run's daemon runs its background work at the normal OS priority: beside busy
programs (the test suite, CI's spinners) one `SCHED_IDLE` run of the background app can
wait past the example's time limit, and a quick run only shows the report."""


def two_processes(seconds: float, rounds: int = 3, *, quick: bool = False) -> dict[str, Any]:
    """The two-process example's figures (its own JSON): `rounds` runs of each kind of
    `seconds` each, frames pooled (`quick`: with `QUICK_SERVE_ARGS`)."""
    command = [sys.executable, str(EXAMPLE), "--seconds", str(seconds), "--json"]
    command += QUICK_SERVE_ARGS if quick else ()
    out = subprocess.run(
        [*command, "--rounds", str(rounds)],
        capture_output=True,
        text=True,
        check=True,
        timeout=rounds * (seconds * 10 + 60) + 60,
    ).stdout
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return {f"two_process_{key}": value for key, value in figures.items()}


TARGETS = [
    Target("hosted_overhead_4kib_p50_vs_floor", "<=", 2.0, why="issue 29: a host's hop, 4 KiB"),
    Target(
        "hosted_in_place_1mib_p50_vs_floor", "<=", 1.5, why="issue 29: a host's hop, 1 MiB shared"
    ),
    Target("infer_overhead_1mib_p50_us", "<=", 100, why="issue 16: 1 MiB inputs, p50"),
    Target("infer_overhead_1mib_p99_us", "<=", 300, why="issue 16: 1 MiB inputs, p99"),
    Target(
        "two_process_managed_over_solo_p99", "<=", 1.5, why="issue 16: foreground p99, two apps"
    ),
]


def main(argv: list[str] | None = None) -> int:
    """Print the figures with their targets, as one JSON object with `--json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a short, noisy run")
    parser.add_argument("--samples", type=int, default=500, help="inferences per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each kind")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each example run")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.rounds, args.seconds = 100, 1, 0.5
    progress = Progress("ipc_inference", [args.rounds, 3])
    progress.step(f"inference through the daemon vs in process, {args.rounds} rounds")
    result = overhead(args.samples, args.rounds)
    example_rounds = 1 if args.quick else 3
    progress.step(
        f"the two-process example, {example_rounds} rounds of 3 runs of {args.seconds:g} s"
    )
    result |= two_processes(args.seconds, example_rounds, quick=args.quick)
    progress.done()
    print_report(result, TARGETS, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
