"""Models through the daemon, on the client's side: a file by its descriptor, small bytes
in the connection's shared segment, larger ones as a sealed memfd.

The daemon never opens a path for a client: `load_model(path=...)` opens the file here,
and the files it keeps weights in (ONNX external data, an IR's `.bin`, beside it), and
sends their descriptors (SCM_RIGHTS), so the daemon reads only what the client could.
A model sent as bytes brings no such files: one whose data lies elsewhere is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from npumanager.core.client.manager import LoadedModel, NpuManager
from npumanager.daemon.client.shared_memory import ClientSegment, sealed_memfd
from npumanager.daemon.wire import protocol as p
from npumanager.errors import IllegalArgumentError
from npumanager.modelfiles import open_model_files
from npumanager.schemas import ModelLoadRequest
from npumanager.schemas.limits import DEFAULT_MAX_MODEL_FILE_BYTES

SMALL_MODEL_BYTES = 1 << 20
"""Models up to this size travel in the shared segment; larger ones as a memfd."""


class Caller(Protocol):
    """The connection's calls, as `load` uses them."""

    timeout_s: float

    def call(
        self, kind: type[p.Call], *, fds: list[int] | None = None, **fields: Any
    ) -> dict[str, Any] | None: ...


def load(
    wire: Caller,
    segment: Callable[[], ClientSegment],
    manager: NpuManager,
    request: ModelLoadRequest,
    model: Any,
    path: str | Path | None,
    sram_bytes: int,
    asked: Mapping[str, Any] | None = None,
) -> LoadedModel:
    """Load a granted request's model in the daemon: a file by its descriptor, bytes in
    the segment (small) or a memfd; ``asked``: what the app asked of the runtime, as the
    wire's `LoadRealModel` takes it (``threads``, ``options``)."""
    if (model is None) == (path is None):
        raise IllegalArgumentError("give exactly one of model= (ONNX bytes) and path=")
    common: dict[str, Any] = {"request_id": request.id, "sram_bytes": sram_bytes, **(asked or {})}
    if path is not None:
        with open_model_files(path, DEFAULT_MAX_MODEL_FILE_BYTES) as files:
            result = wire.call(
                p.LoadRealModel,
                fds=[files.fd, *files.sidecars.values()],
                descriptor=True,
                sidecars=list(files.sidecars),
                **common,
            )
    else:
        data = _model_bytes(model)
        if len(data) <= SMALL_MODEL_BYTES:
            result = _in_segment(wire, segment(), data, common)
        else:
            result = _by_descriptor(wire, sealed_memfd("npu-manager-model", data), common)
    assert result is not None
    return LoadedModel(
        manager,
        request,
        int(result["model"]),
        int(result["device"]),
        weight_bytes=int(result["weight_bytes"]),
    )


def _by_descriptor(wire: Caller, fd: int, common: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return wire.call(p.LoadRealModel, fds=[fd], descriptor=True, **common)
    finally:
        os.close(fd)


def _in_segment(
    wire: Caller, segment: ClientSegment, data: bytes, common: dict[str, Any]
) -> dict[str, Any] | None:
    offset = segment.allocate(len(data), wire.timeout_s)
    try:
        segment.memory[offset : offset + len(data)] = data
        span = p.Span(offset=offset, size=len(data))
        return wire.call(p.LoadRealModel, span=span, **common)
    finally:
        segment.release(offset, len(data))


def _model_bytes(model: Any) -> bytes:
    if isinstance(model, bytes | bytearray | memoryview):
        return bytes(model)
    serialize = getattr(model, "SerializeToString", None)
    if callable(serialize):
        data = serialize()
        if isinstance(data, bytes):
            return data
    raise IllegalArgumentError(
        f"through the daemon a model is ONNX bytes, an onnx.ModelProto or path=; "
        f"got {type(model).__name__}"
    )
