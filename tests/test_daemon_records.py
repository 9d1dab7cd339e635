"""The daemon keeps one record per request, the service's: its calls go through the
service's backend interface, and a connection keeps no record of its own: its requests,
models and quotas are the service's records of its client."""

from __future__ import annotations

import ast
import inspect
import socket

from helpers.daemon_support import Daemons
from npumanager.core.client.manager import LoadedModel, ModelLoadStatusListener, NpuManager
from npumanager.core.service.service import Service
from npumanager.daemon.server import calls
from npumanager.daemon.wire.protocol import HELLO, FrameReader, LoadModel, RequestCanLoad, encode
from npumanager.schemas import ModelLoadRequest

APP_SIDE = {
    name
    for cls in (NpuManager, ModelLoadStatusListener, LoadedModel)
    for name, member in vars(cls).items()
    if callable(member) and not name.startswith("_") and name != "declare_feature"
}
"""The app's API: what the daemon must not drive the service through."""


def _receiver(node: ast.expr) -> str:
    return ast.unparse(node)


def test_the_calls_use_the_backend_interface_not_the_apps_api() -> None:
    tree = ast.parse(inspect.getsource(calls))
    methods = [
        (_receiver(node.func.value), node.func.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]
    app_side = [(on, name) for on, name in methods if name in APP_SIDE]
    assert all(on in ("self.backend", "self.service") for on, _ in app_side), app_side
    on_backend = {name for on, name in methods if on == "self.backend"}
    assert {"request_load", "load_model", "submit_work", "cancel_work"} <= on_backend


def test_a_connection_keeps_no_record_of_its_own(daemon: Daemons) -> None:
    served = daemon.on_a_thread(Service("vnpu", "status_quo", clock="real"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(served.socket_path))
        request = ModelLoadRequest.Builder(7).build()
        client.sendall(
            encode(HELLO)
            + encode(RequestCanLoad(seq=1, request=request, uses_feature=True))
            + encode(LoadModel(seq=2, request_id=7, weight_bytes=1 << 20))
        )
        reader, frames = FrameReader(), []
        while len(frames) < 4:  # welcome, decision, reply, reply
            frames += list(reader.feed(client.recv(65536)))
        (connection,) = served.connections.values()
        assert connection.manager is not None
        assert served.service.backend.holdings(connection.manager) == (1, 1)
        assert served.usage.held("requests", connection.peer.uid) == 1
        assert served.usage.held("models", connection.peer.uid) == 1
        kept = {
            name
            for name, value in vars(connection).items()
            if value and (isinstance(value, set | dict) and name not in ("events",))
        }
        assert kept == set(), kept
