"""A client app in its own process, for the daemon tests, driven by JSON lines on stdin.

Started as root, it imports what it needs, drops to the uid and groups it is given (as a
daemon-launched app would be), connects, says `{"ready": {...}}` on stdout, then runs
commands (one JSON object a line) and reports each result and every callback as a JSON
line. Usage: daemon_child.py SOCKET UID GID [GROUP,...]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import npumanager as npu

# Before the uid drops (the interpreter's files are root's): path= reads models with it.
with contextlib.suppress(ImportError):
    import onnx  # noqa: F401
import npumanager.core.client.lease
import npumanager.core.service.snapshot

_out_lock = threading.Lock()
SHARED_BYTES = 256 << 20
"""The child's shared segment: room for one long inference (the daemon's default limit)."""
RESULT_WAIT_S = 100.0
"""How long `real_result` waits for an inference: only a hung one outlasts it. Less than
the test's wait for the reply (`daemon_support.WAIT_S`), so that the test hears why."""


def say(**fields: Any) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


class App(npu.ModelLoadRequestCallback):
    """Reports every callback; unloads when asked if `auto_unload` is on."""

    def __init__(self, manager: npu.NpuManager) -> None:
        self.manager = manager
        self.auto_unload = True
        self.models: dict[int, npu.LoadedModel] = {}
        self.work: dict[int, Any] = {}
        """Real inferences submitted, by work id."""

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        say(event="decision", id=request.id, status=int(status), at_ns=time.monotonic_ns())

    def on_request_unload_model(self, request: Any, reason: Any = None) -> None:
        say(event="unload", id=request.id, reason=None if reason is None else int(reason))
        if self.auto_unload:
            self.models.pop(request.id, None)
            try:
                self.manager.listener.notify_model_unloaded(request)
            except npu.NpuManagerError as exc:
                say(event="unload_failed", id=request.id, error=type(exc).__name__)

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        say(event="complete", id=request.id, status=int(status))


def _request(body: dict[str, Any]) -> npu.ModelLoadRequest:
    return (
        npu.ModelLoadRequest.Builder(body["id"])
        .set_size(body.get("size", 0))
        .set_priority(body.get("priority", 0))
        .build()
    )


def run_on_models(app: App, command: dict[str, Any]) -> tuple[bool, Any]:
    """The commands that act on loaded models beyond the first: (handled, result)."""
    op = command["op"]
    if op == "load_more":
        model = app.manager.load_model(_request(command), weight_bytes=command["weight_bytes"])
        return True, {"model": model.handle, "device": model.device}
    if op == "cancel_work":
        app.models[command["id"]].cancel(command["work_id"])
        return True, None
    return False, None


def digest(outputs: list[Any]) -> dict[str, Any]:
    """What the test compares of real outputs: shapes, dtypes and a hash of the bytes."""
    return {
        "shapes": [list(o.shape) for o in outputs],
        "dtypes": [str(o.dtype) for o in outputs],
        "sha256": hashlib.sha256(b"".join(o.tobytes() for o in outputs)).hexdigest(),
    }


def chain_feeds(command: dict[str, Any]) -> dict[str, Any]:
    rows, width = command.get("rows", 8), command.get("width", 256)
    return {"x": np.full((rows, width), command.get("value", 0.5), dtype=np.float32)}


def run_real(app: App, command: dict[str, Any]) -> tuple[bool, Any]:
    """The commands of real inference through the daemon: (handled, result)."""
    op = command["op"]
    if op == "real_load":
        request = _request(command)
        threads = command.get("threads")
        if command.get("as_bytes"):  # the file's bytes, not its path: no sidecar travels
            data = Path(command["path"]).read_bytes()
            model = app.manager.load_model(request, model=data, threads=threads)
        else:
            model = app.manager.load_model(request, path=command["path"], threads=threads)
        app.manager.listener.notify_model_loaded(request)
        app.models[request.id] = model
        return True, {"model": model.handle, "weight_bytes": model.weight_bytes}
    if op == "real_run":
        outputs = app.models[command["id"]].run(
            chain_feeds(command), timeout=command.get("run_timeout")
        )
        return True, digest(outputs)
    if op == "real_submit":
        future = app.models[command["id"]].submit(chain_feeds(command))
        app.work[future.work_id] = future
        return True, future.work_id
    if op == "real_result":
        future = app.work.pop(command["work_id"])
        try:
            return True, digest(future.result(command.get("timeout", RESULT_WAIT_S)))
        except BaseException as exc:
            return True, {"raised": type(exc).__name__}
    if op == "real_cancel":
        future = app.work[command["work_id"]]
        return True, {"cancel": future.cancel(), "cancelled": future.cancelled()}
    if op == "real_flood":
        model = app.models[command["id"]]

        def flood() -> None:
            while True:
                try:
                    model.run(chain_feeds(command))
                except Exception as exc:
                    say(event="flood_ended", error=type(exc).__name__)
                    return

        threading.Thread(target=flood, daemon=True).start()
        return True, None
    return False, None


def run(app: App, client: npu.DaemonClient, command: dict[str, Any]) -> Any:  # noqa: PLR0912
    for commands in (run_on_models, run_real):
        handled, result = commands(app, command)
        if handled:
            return result
    manager = app.manager
    op = command["op"]
    if op == "request":
        manager.request_can_load_model(
            _request(command), app, weight_bytes=command.get("weight_bytes")
        )
        return None
    if op == "load":
        request = _request(command)
        model = manager.load_model(request, weight_bytes=command["weight_bytes"])
        manager.listener.notify_model_loaded(request)
        app.models[request.id] = model
        return {"model": model.handle, "device": model.device}
    if op == "submit":
        model = app.models[command["id"]]
        return model.submit(
            command.get("cost_cycles", 1000), original_uid=command.get("original_uid")
        )
    if op == "submit_to":
        foreign = npu.LoadedModel(manager, _request(command), command["model"], 0)
        return foreign.submit(1000)
    if op == "unloaded":
        manager.listener.notify_model_unloaded(_request(command))
        return None
    if op == "cancel":
        manager.cancel_model_load(_request(command))
        return None
    if op == "auto_unload":
        app.auto_unload = bool(command["on"])
        return None
    if op == "set_policy":
        return client.set_policy(command["policy"], command.get("params"))
    if op == "set_importance":
        client.set_uid_importance(command["uid"], command["importance"])
        return None
    if op == "set_access":
        client.set_uid_access(command["uid"], can_attribute_other_uid=command["attribute"])
        return None
    if op == "info":
        return client.info()
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    socket_path, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    groups = [int(g) for g in sys.argv[4].split(",")] if len(sys.argv) > 4 and sys.argv[4] else []
    if len(sys.argv) > 5:  # a cgroup to join first, as root: the app this process belongs to
        with open(os.path.join(sys.argv[5], "cgroup.procs"), "w") as procs:
            procs.write("0")
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    try:
        client = npu.DaemonClient(socket_path, uses_feature=True, shared_bytes=SHARED_BYTES)
    except npu.NpuManagerError as exc:
        say(connect_error=type(exc).__name__, message=str(exc))
        return
    app = App(client.manager())
    say(
        ready={
            "uid": client.uid,
            "pid": client.pid,
            "os_pid": os.getpid(),
            "os_uid": os.getuid(),
            "app_id": client.app_id,
            "hal_uid": client.hal_uid,
        }
    )
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "exit":
            break
        try:
            say(reply=command["op"], result=run(app, client, command))
        except Exception as exc:
            say(reply=command["op"], error=type(exc).__name__, message=str(exc))
    client.close()


if __name__ == "__main__":
    main()
