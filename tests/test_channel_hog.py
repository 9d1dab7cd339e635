"""The channel hog (issue 29, item 4) through `npu-manager serve --driver onnxruntime`.

One app holds every channel of the device with operations that never end by themselves
(the endless model: only the runtime's cancel ends a run), one per connection; another app
of the same band then runs a tiny inference. It completes only because the hog's latest
started operation gives its channel back (restart preemption: a channel beyond an app's
first is borrowed, `realexec.preemption.borrowed`), and that operation is requeued and
starts over, not lost. Turned off (`--driver-option restart_preemption=false`), the tiny
inference waits behind the hog for as long as the hog likes.

Real daemons with model hosts (the default), real apps of their own uids; every wait is
for an event (an info field, a telemetry line) with the generous `WAIT_S`, and only the
wait that shows something does *not* happen passes a short timeout of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import npumanager as npu
from helpers.daemon_support import BACKGROUND_UID, FOREGROUND_UID, Child, DaemonProcess
from npumanager.schemas.limits import REAL_DEFAULT_CHANNELS

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving client processes their own uids needs root"
)

from helpers.real_daemon import (  # noqa: E402
    app,
    in_process_digest,
    info,
    load_endless,
    loaded_app,
    running,
    wait_for,
)

HOG_UID = BACKGROUND_UID
POLITE_UID = FOREGROUND_UID
"""Only uids here: both apps are put in the same band (`same_band`)."""
NOT_RUN_S = 2.0
"""How long the control waits to see that the tiny inference does not run (it cannot, so
however busy the machine, it times out)."""
Lifecycle = list[tuple[str, str | None]]


def same_band(daemon: DaemonProcess) -> None:
    """Both apps in the foreground, as the platform would say: one band, and one where an
    app alone may use every channel (background work leaves a channel free by itself)."""
    with npu.DaemonClient(daemon.socket) as admin:
        for uid in (HOG_UID, POLITE_UID):
            admin.set_uid_importance(uid, npu.IMPORTANCE_FOREGROUND)


def lifecycle(events: Path, work_id: int) -> Lifecycle:
    """A work's (kind, reason) in the daemon's telemetry so far (whole lines only)."""
    text = events.read_text() if events.exists() else ""
    lines = [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
    return [
        (e["kind"], e["reason"]) for e in lines if e.get("type") == "work" and e["id"] == work_id
    ]


def hog_and_polite(
    start: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path, *args: str
) -> tuple[DaemonProcess, Child, list[tuple[Child, int]], Path]:
    """A daemon (every work event in `events.jsonl`), the polite app with the chain model,
    and the hog: one connection per channel, each running the endless model, the second
    started once the first runs (so it is the latest), until every channel is the hog's."""
    events = socket_dir / "events.jsonl"
    daemon = start("--sink", f"jsonl:path={events},debounce_duration_ms=0", *args)
    assert info(daemon)["devices"][0]["channels"] == REAL_DEFAULT_CHANNELS == 2
    same_band(daemon)
    polite = loaded_app(daemon, POLITE_UID, model_file)
    hog: list[tuple[Child, int]] = []
    for _ in range(REAL_DEFAULT_CHANNELS):
        connection = app(daemon, HOG_UID)
        endless = load_endless(connection, socket_dir)
        hog.append((connection, connection.ok("real_submit", id=endless, rows=4)))
        wait_for(lambda: running(daemon) == len(hog))
    return daemon, polite, hog, events


def cancelled(hog: list[tuple[Child, int]], daemon: DaemonProcess, events: Path) -> None:
    """Cancel the hog's operations: each ends CANCELLED_USER, and the channels are free."""
    for connection, work_id in hog:
        assert connection.ok("real_cancel", work_id=work_id) == {"cancel": True, "cancelled": True}
        assert connection.ok("real_result", work_id=work_id) == {"raised": "CancelledError"}
    wait_for(lambda: running(daemon) == 0)
    for _, work_id in hog:
        wait_for(lambda work_id=work_id: bool(lifecycle(events, work_id)))
        wait_for(lambda work_id=work_id: lifecycle(events, work_id)[-1][0] == "ENDED")
        assert lifecycle(events, work_id)[-1] == ("ENDED", "CANCELLED_USER")


def test_a_tiny_inference_takes_a_channel_back_from_an_app_that_holds_every_one(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    daemon, polite, hog, events = hog_and_polite(start_onnxruntime, socket_dir, model_file)
    assert polite.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    (_, first), (_, latest) = hog
    wait_for(lambda: ("STARTED", "RESUMED") in lifecycle(events, latest))
    assert lifecycle(events, latest) == [
        ("REQUESTED", None),
        ("STARTED", "INITIAL"),
        ("ENDED", "PAUSED"),  # its channel given back: stopped with the runtime's cancel
        ("STARTED", "RESUMED"),  # requeued, and started over once the channel was free
    ]
    assert lifecycle(events, first) == [("REQUESTED", None), ("STARTED", "INITIAL")]
    wait_for(lambda: running(daemon) == REAL_DEFAULT_CHANNELS)  # the hog's again, both
    cancelled(hog, daemon, events)
    assert polite.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)


def test_turned_off_the_tiny_inference_waits_behind_the_hog(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    """The control: without restart preemption nothing takes a channel back, so the same
    setup leaves the tiny inference waiting (what the test above passes only with)."""
    daemon, polite, hog, events = hog_and_polite(
        start_onnxruntime, socket_dir, model_file, "--driver-option", "restart_preemption=false"
    )
    waited = polite.send("real_run", id=1, rows=4, value=0.5, run_timeout=NOT_RUN_S)
    assert waited.get("error") == "TimeoutError", waited
    assert running(daemon) == REAL_DEFAULT_CHANNELS
    for _, work_id in hog:
        assert ("ENDED", "PAUSED") not in lifecycle(events, work_id)
    cancelled(hog, daemon, events)
    assert polite.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
