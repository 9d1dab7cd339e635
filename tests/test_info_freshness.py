"""`info` from a snapshot: never older than what the asker was told, renewed no sooner
(within its TTL) for changes the asker was not told of, so one client's calls do not make
another client's `info` flood take a snapshot per call (benchmarks/daemon_attacks.py)."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import npumanager as npu
from helpers.daemon_support import WAIT_S, daemon_on_a_thread
from npumanager.core.client.dispatch import run_inline
from npumanager.core.service.service import Service
from npumanager.daemon.server.info import InfoCache


class Counting:
    """A snapshot that says how many times it was taken."""

    def __init__(self) -> None:
        self.taken = 0

    def __call__(self) -> dict[str, Any]:
        self.taken += 1
        return {"taken": self.taken, "requests": {}, "priorities": [], "clients": []}


def test_a_change_the_viewer_saw_renews_the_snapshot_and_one_it_did_not_waits() -> None:
    snapshot = Counting()
    cache = InfoCache(snapshot, ttl_s=3600)
    cache.result_json(None, 0, 10, seen=0)
    cache.changed()
    told = cache.version
    cache.result_json(None, 0, 10, seen=0)
    assert snapshot.taken == 1, "a change the viewer was not told of waits for the TTL"
    cache.result_json(None, 0, 10, seen=told)
    assert snapshot.taken == 2, "a change the viewer was told of is in its reply"
    cache.result_json(None, 0, 10, seen=told)
    assert snapshot.taken == 2, "the snapshot holds it now"
    cache.changed()
    cache.result_json(None, 0, 10)
    assert snapshot.taken == 3, "a viewer of no version sees every change"


def test_a_stale_snapshot_is_renewed_for_every_viewer() -> None:
    snapshot = Counting()
    cache = InfoCache(snapshot, ttl_s=0.01)
    cache.result_json(None, 0, 10, seen=0)
    taken = time.monotonic()
    while time.monotonic() - taken <= 0.01:
        time.sleep(0.01)
    cache.result_json(None, 0, 10, seen=0)
    assert snapshot.taken == 2


class Decisions(npu.ModelLoadRequestCallback):
    """Each decision of the requests it was given, in order."""

    def __init__(self) -> None:
        self.seen: queue.Queue[npu.ModelLoadStatus] = queue.Queue()

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        self.seen.put(status)


def states(info: dict[str, Any], request_id: int) -> list[str]:
    """The states `info` lists a request in (the test's requests have distinct ids)."""
    return [
        state
        for state, entries in info["requests"].items()
        for entry in entries
        if entry["id"] == request_id
    ]


def test_info_holds_what_its_asker_was_told_and_not_a_snapshot_per_call_of_others(
    socket_dir: Path,
) -> None:
    """Turn taking: a waiter is told CAN_LOAD_NOW when the holder unloads; its next `info`
    shows its request granted. A watcher told nothing keeps its snapshot meanwhile."""
    service = Service("vnpu", "turn_taking", clock="real")
    path = socket_dir / "npu.sock"
    with (
        daemon_on_a_thread(service, path) as daemon,
        npu.DaemonClient(path, uses_feature=True) as holding,
        npu.DaemonClient(path, uses_feature=True) as waiting,
        npu.DaemonClient(path) as watching,
    ):
        holder, waiter = holding.manager(), waiting.manager()
        held, asked = (
            npu.ModelLoadRequest.Builder(1).build(),
            npu.ModelLoadRequest.Builder(2).build(),
        )
        holder_decisions, waiter_decisions = Decisions(), Decisions()
        holder.request_can_load_model(held, holder_decisions, run_inline)
        assert holder_decisions.seen.get(timeout=WAIT_S) == npu.NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW
        holder.load_model(held, weight_bytes=1 << 20)
        holder.listener.notify_model_loaded(held)
        watching.info()
        renewals = daemon._info.renewals

        waiter.request_can_load_model(asked, waiter_decisions, run_inline)
        waits = states(waiting.info(), 2)  # its reply comes after the request's
        assert waits and waits != ["granted"], "the asker's own call is in its reply"
        assert daemon._info.renewals == renewals + 1
        for _ in range(3):
            waiter.cancel_model_load(asked)
            waiter.request_can_load_model(asked, waiter_decisions, run_inline)
            watching.info()
        assert daemon._info.renewals == renewals + 1, "the watcher was told of none of them"
        assert states(waiting.info(), 2) == waits

        holder.listener.notify_model_unloaded(held)
        while waiter_decisions.seen.get(timeout=WAIT_S) != npu.NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW:
            pass  # its earlier requests' NOT_PRIORITIZED
        assert states(waiting.info(), 2) == ["granted"], "what it was told"
