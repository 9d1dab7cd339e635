"""A daemon that stops while a model host does not answer: a host that ignores the cancel
of its run (`helpers/deaf_host.py`), or one that is stopped (SIGSTOP, as the audit
throttles), must not keep the daemon from ending nor outlive it."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import npumanager as npu
from helpers.daemon_support import WAIT_S
from helpers.real_daemon import endless_model, stopped, wait_for
from npumanager.core.driver.events import EventKind, WorkEvent

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="model hosts drop to another uid, which needs root"
)

from npumanager.daemon.host.client import HostSettings  # noqa: E402
from npumanager.daemon.server.server import Daemon  # noqa: E402

DEAF_HOST = Path(__file__).parent / "helpers" / "deaf_host.py"
X = np.full((8, 256), 0.25, np.float32)


def _loaded(client: Any) -> Any:
    request = npu.ModelLoadRequest.Builder(1).set_size(0).build()
    lease = client.reserve(request, timeout_s=WAIT_S)
    lease.__enter__()
    return lease.load_model(model=endless_model())


def _run_until_it_fails(model: Any) -> None:
    with pytest.raises(npu.NpuManagerError):
        model.run({"x": X})


@pytest.mark.parametrize("path", ["lane", "runner"])
@pytest.mark.parametrize("unanswering", ["deaf", "stopped"])
def test_a_daemon_stops_though_a_host_does_not_answer_the_cancel_of_its_run(
    tmp_path: Path, unanswering: str, path: str
) -> None:
    """A run (on the lane, or on a runner: the connection's path) in a host that ignores
    its cancel, or that is stopped: the daemon's stop ends it all the same, and the host
    is killed (its app's connections are dropped)."""
    command = (sys.executable, str(DEAF_HOST)) if unanswering == "deaf" else None
    settings = HostSettings("onnxruntime", lease_us=0, **({"command": command} if command else {}))
    service = npu.Service("onnxruntime", driver_options={"channels": 1})
    events = service.add_sink("memory").sink
    daemon = Daemon(service, tmp_path / "npu.sock", hosts=settings)
    daemon.bind()
    serving = threading.Thread(target=daemon.serve_forever, daemon=True)
    serving.start()
    client = npu.connect(tmp_path / "npu.sock", uses_feature=True)
    try:
        model = _loaded(client)
        if path == "runner":
            work = model.submit({"x": X})
        else:
            threading.Thread(target=_run_until_it_fails, args=(model,), daemon=True).start()

        def started() -> bool:
            seen = [e for e in events.events if type(e) is WorkEvent]
            return any(e.kind == EventKind.STARTED for e in seen)

        wait_for(started)
        (connection,) = daemon.transport.connections.values()
        host = connection.host
        if unanswering == "stopped":
            host.pause()  # as the audit throttles it
            wait_for(lambda: stopped(host.pid))
        elif path == "runner":
            assert work.cancel()  # not heeded: the host's run goes on
        daemon.stop()
        serving.join(WAIT_S)
        assert not serving.is_alive(), "the daemon's stop waited for the host"
        wait_for(lambda: host.dead is not None)  # the host that did not answer was killed
    finally:
        client.close()
        if serving.is_alive():
            daemon.stop()
        service.close()
