"""One app of the focus example: a call with a frame deadline, or an indexer flooding the
device, each a process of its own that joins its app's cgroup before it connects.

As root (the cgroupfs launcher) it moves itself into `--cgroup` and drops to `--uid`;
launched by `systemd-run --user --scope` it is already both. It loads a real ONNX model
through the daemon (`npumanager.connect()`), says on stdout, as one JSON line, which app
the daemon found it to be, waits for `go`, runs until `stop` (both on stdin), and prints
one JSON line of what it measured:

* `deadline`: one inference a frame (16.7 ms); each frame's start (`time.monotonic()`,
  `CLOCK_MONOTONIC`, the clock the script marks its phases with) and its latency;
* `flood`: `--threads` connections running inferences back to back; each one's end.

    python app.py deadline --socket /tmp/npu.sock --rows 48
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import npumanager as npu
from npumanager.apps.identity import cgroup_of_pid
from npumanager.vendor_drivers.realexec.chain import chain_model

FRAME_S = 1 / 60
"""The call's frame: an inference every 16.7 ms, due before the next frame."""
READY_TIMEOUT_S = 120.0


def join(cgroup: str | None, uid: int | None, gid: int | None) -> None:
    """Move this process into its app's cgroup, then become the app's user (root only)."""
    if cgroup is not None:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
            procs.write("0")
    if uid is not None:
        os.setgroups([gid] if gid is not None else [])
        if gid is not None:
            os.setgid(gid)
        os.setuid(uid)


class Model:
    """One connection to the daemon with the chain model loaded through it."""

    def __init__(self, socket: str, rows: int) -> None:
        self.feeds = {"x": np.full((rows, 256), 0.5, dtype=np.float32)}
        self.manager = npu.connect(socket, uses_feature=True)
        build = npu.ModelLoadRequest.Builder(1).set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB)
        self.lease = self.manager.reserve(build.build(), timeout_s=READY_TIMEOUT_S)
        self.lease.__enter__()
        self.model = self.lease.load_model(model=chain_model())

    def run(self) -> None:
        self.model.run(self.feeds)

    def close(self) -> None:
        self.lease.__exit__(None, None, None)
        self.manager.close()


def deadline(models: list[Model], stop: threading.Event) -> dict[str, Any]:
    """A frame every `FRAME_S` until `stop`: `[start, latency_ms]` per frame."""
    (model,) = models
    frames: list[list[float]] = []
    next_frame = time.monotonic()
    while not stop.is_set():
        time.sleep(max(0.0, next_frame - time.monotonic()))
        start = time.monotonic()
        model.run()
        frames.append([start, (time.monotonic() - start) * 1000])
        next_frame = max(next_frame + FRAME_S, time.monotonic() - FRAME_S)
    return {"frames": frames}


def flood(models: list[Model], stop: threading.Event) -> dict[str, Any]:
    """Every connection runs inferences back to back until `stop`: each one's end."""
    ends: list[list[float]] = [[] for _ in models]

    def back_to_back(model: Model, into: list[float]) -> None:
        while not stop.is_set():
            model.run()
            into.append(time.monotonic())

    threads = [
        threading.Thread(target=back_to_back, args=pair, daemon=True)
        for pair in zip(models, ends, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"ends": sorted(t for one in ends for t in one)}


ROLES: dict[str, Callable[[list[Model], threading.Event], dict[str, Any]]] = {
    "deadline": deadline,
    "flood": flood,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--socket", required=True, help="the daemon's socket")
    parser.add_argument("--rows", type=int, default=48, help="rows of each inference's input")
    parser.add_argument("--threads", type=int, default=1, help="connections running at once")
    parser.add_argument("--cgroup", help="the app's cgroup v2 folder, to join first (root)")
    parser.add_argument("--uid", type=int, help="then run as this uid (root)")
    parser.add_argument("--gid", type=int, help="and in this group (the socket's)")
    args = parser.parse_args()
    join(args.cgroup, args.uid, args.gid)
    models = [Model(args.socket, args.rows) for _ in range(args.threads)]
    try:
        for model in models:
            model.run()  # warm-up, not measured
        manager = models[0].manager
        found = {"app_id": manager.app_id, "hal_uid": manager.uid}
        print(json.dumps({**found, "cgroup": cgroup_of_pid(os.getpid())}), flush=True)
        if sys.stdin.readline() != "go\n":
            return
        stop = threading.Event()

        def stop_on_stdin() -> None:
            sys.stdin.readline()  # `stop`, or end of file: the script is gone
            stop.set()

        threading.Thread(target=stop_on_stdin, daemon=True).start()
        print(json.dumps(ROLES[args.role](models, stop)), flush=True)
    finally:
        for model in models:
            model.close()


if __name__ == "__main__":
    main()
