"""One load-test worker process: many client connections on threads, one uid, many cycles.

Started as root, it drops to its uid, opens CLIENTS connections to the daemon and runs
CYCLES cycles on each (request; then load, report loaded and unloaded, or cancel; always
until the request completes). It prints one JSON line: counts, protocol violations seen,
and every interval during which a client held a grant (for the budget check).
Usage: daemon_load.py SOCKET UID GID CLIENTS CYCLES SEED
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

import npumanager as npu

WEIGHTS = (1, 2, 4)
SIZES = (
    npu.NPU_MODEL_SIZE_LESS_THAN_1GB,
    npu.NPU_MODEL_SIZE_BETWEEN_1GB_AND_2GB,
    npu.NPU_MODEL_SIZE_GREATER_THAN_2G,
)
TIMEOUT_S = 120.0
NOT_PRIORITIZED_PATIENCE_S = 0.5
"""How long a refused client waits for its turn before it cancels."""


class Cycle(npu.ModelLoadRequestCallback):
    """One request's life, as its callbacks tell it."""

    def __init__(self, client: Client, request: npu.ModelLoadRequest) -> None:
        self.client = client
        self.request = request
        self.changed = threading.Condition()
        self.decisions: list[int] = []
        self.unload_asked = False
        self.completed: int | None = None
        self.completions = 0

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        with self.changed:
            if self.completed is not None:
                self.client.violations.append(f"decision after completion of {request.id}")
            self.decisions.append(int(status))
            self.changed.notify_all()

    def on_request_unload_model(self, request: Any, reason: Any = None) -> None:
        with self.changed:
            self.unload_asked = True
            self.changed.notify_all()

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        with self.changed:
            self.completions += 1
            self.completed = int(status)
            self.changed.notify_all()

    def turn_may_come(self, patience_s: float) -> bool:
        """Wait a while for a decision after the last one (or the end); True if one came."""
        seen = len(self.decisions)
        with self.changed:
            return self.changed.wait_for(
                lambda: len(self.decisions) > seen or self.completed is not None, patience_s
            )

    def wait(self, predicate: Any) -> None:
        with self.changed:
            if not self.changed.wait_for(predicate, TIMEOUT_S):
                raise TimeoutError(f"request {self.request.id}: no callback in {TIMEOUT_S} s")


class Client:
    """One connection running its cycles."""

    def __init__(self, socket_path: str, seed: int) -> None:
        self.connection = npu.DaemonClient(socket_path, uses_feature=True)
        self.manager = self.connection.manager()
        self.random = random.Random(seed)
        self.violations: list[str] = []
        self.intervals: list[tuple[int, int, int]] = []
        self.requests = 0
        self.completions = 0
        self.loads = 0
        self.cancels = 0
        self.waits = 0
        self.ended_by_service = 0

    def run(self, cycles: int) -> None:
        for n in range(cycles):
            self.cycle(n)
        self.connection.close()

    def cycle(self, request_id: int) -> None:
        size = self.random.randrange(3)
        request = npu.ModelLoadRequest.Builder(request_id).set_size(SIZES[size]).build()
        cycle = Cycle(self, request)
        manager = self.manager
        manager.request_can_load_model(request, cycle)
        self.requests += 1
        if self.random.random() < 0.3:
            self.cancel(cycle)
        else:
            cycle.wait(lambda: cycle.decisions or cycle.completed is not None)
            while cycle.completed is None:
                cycle.wait(lambda: cycle.decisions[-1] != 1 or cycle.completed is not None)
                if cycle.completed is not None:
                    break
                if cycle.decisions[-1] == npu.NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW:
                    self.hold(cycle, WEIGHTS[size])
                    break
                if cycle.turn_may_come(NOT_PRIORITIZED_PATIENCE_S):  # NOT_PRIORITIZED
                    continue
                self.cancel(cycle)
                break
            if 1 in cycle.decisions:
                self.waits += 1
        cycle.wait(lambda: cycle.completed is not None)
        time.sleep(0.005)  # late duplicate callbacks would arrive now
        if cycle.completions != 1:
            self.violations.append(f"request {request_id} completed {cycle.completions} times")
        self.completions += cycle.completions

    def cancel(self, cycle: Cycle) -> None:
        """Withdraw; the service may have ended the request already (the calls crossed)."""
        try:
            self.manager.cancel_model_load(cycle.request)
            self.cancels += 1
        except npu.UnknownRequestError:
            cycle.wait(lambda: cycle.completed is not None)
            self.ended_by_service += 1

    def hold(self, cycle: Cycle, weight: int) -> None:
        """Load, report loaded, report unloaded; the interval counts only if all of it went."""
        manager = self.manager
        granted = time.monotonic_ns()
        try:
            manager.load_model(cycle.request, weight_bytes=1 << 20)
            manager.listener.notify_model_loaded(cycle.request)
            self.loads += 1
            released = time.monotonic_ns()
            manager.listener.notify_model_unloaded(cycle.request)
        except npu.NpuManagerError:
            cycle.wait(lambda: cycle.completed is not None)  # the service ended it first
            self.ended_by_service += 1
            return
        self.intervals.append((granted, released, weight))


def main() -> None:
    socket_path, uid, gid, clients, cycles, seed = sys.argv[1:7]
    os.setgroups([])
    os.setgid(int(gid))
    os.setuid(int(uid))
    workers = [Client(socket_path, int(seed) * 1000 + i) for i in range(int(clients))]
    print(json.dumps({"connected": len(workers)}), flush=True)
    sys.stdin.readline()  # the go signal: every worker process is connected
    errors: list[str] = []

    def run(worker: Client) -> None:
        try:
            worker.run(int(cycles))
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary = {
        "uid": int(uid),
        "requests": sum(w.requests for w in workers),
        "completions": sum(w.completions for w in workers),
        "loads": sum(w.loads for w in workers),
        "cancels": sum(w.cancels for w in workers),
        "waits": sum(w.waits for w in workers),
        "ended_by_service": sum(w.ended_by_service for w in workers),
        "violations": [v for w in workers for v in w.violations] + errors,
        "intervals": [i for w in workers for i in w.intervals],
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
