"""One app of the two-process example: a foreground app with a frame deadline, or a
background flood, each running a real ONNX model in its own process.

Managed, the app asks the daemon (`npumanager.connect()`), loads the model through it and
runs `LoadedModel.run`, the same calls as in process. With `--direct` it calls
onnxruntime itself, as apps did before a manager existed. It prints one JSON line of
what it measured when its time is up.

    python app.py foreground --socket /tmp/npu.sock --rows 48 --seconds 3
    python app.py background --direct --rows 512 --seconds 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]

import npumanager as npu
from npumanager.vendor_drivers.realexec.chain import chain_model

PERIOD_S = 1 / 60
"""The foreground app's frame: one inference every 16.7 ms, due before the next frame."""


class Runner:
    """Runs one inference of `rows` rows, through the daemon or on onnxruntime directly."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.feeds = {"x": np.full((args.rows, 256), 0.5, dtype=np.float32)}
        self.job_priority = args.job_priority
        self.manager: npu.NpuManager | None = None
        if args.direct:
            self.session = ort.InferenceSession(chain_model(), providers=["CPUExecutionProvider"])
            return
        self.manager = npu.connect(args.socket, uses_feature=True)
        request = npu.ModelLoadRequest.Builder(1).set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB)
        self.lease = self.manager.reserve(request.build(), timeout_s=30)
        self.lease.__enter__()
        self.model = self.lease.load_model(model=chain_model())

    def run(self) -> None:
        if self.manager is None:
            self.session.run(None, self.feeds)
        else:
            self.model.run(self.feeds, job_priority=self.job_priority)

    def close(self) -> None:
        if self.manager is not None:
            self.lease.__exit__(None, None, None)
            self.manager.close()


def foreground(runner: Runner, seconds: float) -> dict[str, Any]:
    """One inference a frame; its submit-to-outputs latency and whether it made the frame."""
    latencies, missed = [], 0
    next_frame = time.perf_counter()
    ends = next_frame + seconds
    while next_frame < ends:
        time.sleep(max(0.0, next_frame - time.perf_counter()))
        start = time.perf_counter()
        runner.run()
        took = time.perf_counter() - start
        latencies.append(took * 1000)
        missed += took > PERIOD_S
        next_frame += PERIOD_S
    return {"latencies_ms": latencies, "missed_frames": missed}


def background(runner: Runner, seconds: float) -> dict[str, Any]:
    """Inferences back to back until the time is up."""
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        runner.run()
        count += 1
    return {"inferences": count, "per_s": count / (time.perf_counter() - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["foreground", "background"])
    parser.add_argument("--socket", help="the daemon's socket (not with --direct)")
    parser.add_argument("--direct", action="store_true", help="call onnxruntime directly")
    parser.add_argument("--rows", type=int, default=48, help="rows of each inference's input")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--job-priority", type=int, default=0, help="higher is less important (default 0)"
    )
    parser.add_argument("--uid", type=int, help="run as this uid (the script is root)")
    parser.add_argument("--gid", type=int, help="and in this group (the socket's)")
    args = parser.parse_args()
    if args.uid is not None:
        os.setgroups([args.gid] if args.gid is not None else [])
        if args.gid is not None:
            os.setgid(args.gid)
        os.setuid(args.uid)
    runner = Runner(args)
    try:
        runner.run()  # warm-up, not measured
        print("ready", flush=True)
        sys.stdin.readline()  # everyone starts together
        measure = foreground if args.role == "foreground" else background
        print(json.dumps({"role": args.role, **measure(runner, args.seconds)}), flush=True)
    finally:
        runner.close()


if __name__ == "__main__":
    main()
