"""A model as data: its bytes, and the files it keeps weights in (ONNX external data, an
OpenVINO IR's `.bin`) as open descriptors.

A name written inside a model is only ever looked up here, by `open_model_files`, in the
app's own process and with the app's own rights: beside the model file or below it, never
above it, never at an absolute path. Every other part of the manager (the daemon, the
drivers, the runtimes) gets descriptors and never resolves a name a model gives.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from npumanager.errors import CapacityError, IllegalArgumentError
from npumanager.schemas.limits import MAX_MODEL_SIDECARS, MAX_SIDECAR_NAME

_READ_CHUNK = 16 << 20


def sidecar_key(name: Any) -> str:
    """`name` as a model names a file of its weights, normalised: a relative path below
    the model's folder. Anything else (absolute, `..`, empty, NUL, too long) is refused."""
    if not isinstance(name, str) or not name or "\0" in name or len(name) > MAX_SIDECAR_NAME:
        raise IllegalArgumentError(
            f"a model's weights file must be named by a relative path of 1..{MAX_SIDECAR_NAME} "
            f"characters; got {name!r:.80}"
        )
    key = posixpath.normpath(name)
    if key.startswith("/") or key == ".." or key.startswith("../") or key == ".":
        raise IllegalArgumentError(
            f"a model's weights file must lie beside the model or below it; {name!r:.80} "
            "does not (no absolute paths, no '..')"
        )
    return key


class Held(NamedTuple):
    """One piece of data an ONNX model holds: a tensor, a sparse tensor, or a Constant
    node's list attribute (`kind` says which), and where in the model it is."""

    kind: str
    where: str
    value: Any


def onnx_contents(model: Any) -> Iterator[Held]:
    """Every piece of data an ONNX `ModelProto` holds: initializers and sparse
    initializers, tensor-valued attributes of every node (in the graph, its subgraphs,
    functions and training graphs) and Constant nodes' list attributes."""
    graphs: list[tuple[str, Any]] = [("graph", model.graph)]
    for n, info in enumerate(model.training_info):
        graphs += [(f"training {n} init", info.initialization), (f"training {n}", info.algorithm)]
    for function in model.functions:
        where = f"function {function.name!r}"
        for attribute in function.attribute_proto:
            yield from _attribute_data(where, "", attribute, graphs)
        for node in function.node:
            yield from _node_data(where, node, graphs)
    while graphs:
        where, graph = graphs.pop()
        for tensor in graph.initializer:
            yield Held("tensor", f"{where}: initializer {tensor.name!r}", tensor)
        for sparse in graph.sparse_initializer:
            yield Held("sparse", f"{where}: sparse initializer {sparse.values.name!r}", sparse)
        for node in graph.node:
            yield from _node_data(where, node, graphs)


def _node_data(where: str, node: Any, graphs: list[tuple[str, Any]]) -> Iterator[Held]:
    constant = node.op_type == "Constant" and node.domain in ("", "ai.onnx")
    for attribute in node.attribute:
        yield from _attribute_data(
            f"{where}: node {node.name or node.op_type!r}",
            node.op_type if constant else "",
            attribute,
            graphs,
        )


def _attribute_data(
    where: str, constant: str, attribute: Any, graphs: list[tuple[str, Any]]
) -> Iterator[Held]:
    here = f"{where} attribute {attribute.name!r}"
    if attribute.HasField("t"):
        yield Held("tensor", here, attribute.t)
    for tensor in attribute.tensors:
        yield Held("tensor", here, tensor)
    if attribute.HasField("sparse_tensor"):
        yield Held("sparse", here, attribute.sparse_tensor)
    for sparse in attribute.sparse_tensors:
        yield Held("sparse", here, sparse)
    if attribute.HasField("g"):
        graphs.append((here, attribute.g))
    graphs.extend((here, graph) for graph in attribute.graphs)
    if constant and (attribute.floats or attribute.ints or attribute.strings):
        yield Held("list", here, attribute)


def external_location(tensor: Any) -> str | None:
    """The file an ONNX tensor keeps its data in (as the model names it), or None."""
    if tensor.data_location != 1:  # TensorProto.EXTERNAL
        return None
    entries: dict[str, str] = {entry.key: entry.value for entry in tensor.external_data}
    return entries.get("location", "")


def external_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """(where, tensor) for every tensor of an ONNX model whose data lies in another file."""
    for held in onnx_contents(model):
        if held.kind == "tensor":
            parts = [(held.where, held.value)]
        elif held.kind == "sparse":
            parts = [(held.where, held.value.values), (held.where, held.value.indices)]
        else:
            continue
        for where, tensor in parts:
            if external_location(tensor) is not None:
                yield where, tensor


def sidecar_names(path: Path, data: bytes) -> list[str]:
    """The files a model keeps its weights in, as keys: an IR's `.bin` beside its `.xml`;
    an ONNX model's external data files (none known when the `onnx` package is missing)."""
    if path.suffix == ".xml":
        return [path.with_suffix(".bin").name]
    try:
        import onnx
    except ImportError:
        return []
    try:
        proto = onnx.load_model_from_string(data)
    except Exception:
        return []  # not ONNX: whoever opens it says so
    names: list[str] = []
    for _, tensor in external_tensors(proto):
        key = sidecar_key(external_location(tensor))
        if key not in names:
            names.append(key)
    return names


@dataclass
class ModelFiles:
    """A model file (its descriptor and bytes) and its weights files as open descriptors
    by name; `close` closes them all."""

    fd: int
    data: bytes
    sidecars: dict[str, int] = field(default_factory=dict)

    def close(self) -> None:
        """Close the model's and the weights files' descriptors."""
        for fd in (self.fd, *self.sidecars.values()):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.sidecars.clear()
        self.fd = -1

    def __enter__(self) -> ModelFiles:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_model_files(path: str | Path, limit: int) -> ModelFiles:
    """Read a model file (at most `limit` bytes) and open the files it keeps weights in,
    beside it, with the caller's own rights."""
    model = Path(os.fspath(path))
    fd = open_file(model, "the model file")
    try:
        data = read_whole(fd, limit, "the model file")
    except BaseException:
        os.close(fd)
        raise
    files = ModelFiles(fd, data)
    try:
        names = sidecar_names(model, data)
        if len(names) > MAX_MODEL_SIDECARS:
            raise IllegalArgumentError(
                f"the model keeps its weights in {len(names)} files; at most "
                f"{MAX_MODEL_SIDECARS} are taken (save its external data to one file)"
            )
        for name in names:
            files.sidecars[name] = open_file(model.parent / name, "the model's weights file")
    except BaseException:
        files.close()
        raise
    return files


def open_file(path: Path, what: str) -> int:
    """A descriptor of a regular file, or an `IllegalArgumentError` saying why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise IllegalArgumentError(f"cannot open {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IllegalArgumentError(f"{what} {path} is not a regular file")
    return fd


def file_size(fd: int, what: str) -> int:
    """The size of the regular file behind `fd` (`IllegalArgumentError` for anything else)."""
    try:
        info = os.fstat(fd)
    except OSError as exc:
        raise IllegalArgumentError(f"{what} cannot be examined: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise IllegalArgumentError(f"{what} is not a regular file: send an open file")
    return info.st_size


def read_whole(fd: int, limit: int, what: str) -> bytes:
    """A whole regular file of at most `limit` bytes (checked before reading), from its
    start, without moving the descriptor's offset."""
    size = file_size(fd, what)
    if size > limit:
        raise CapacityError(f"{what} holds {size} bytes; at most {limit} are read")
    if size == 0:
        raise IllegalArgumentError(f"{what} is empty")
    return read_span(fd, 0, size, what)


def read_span(fd: int, offset: int, length: int, what: str) -> bytes:
    """`length` bytes at `offset` of a regular file; refused unless the file holds them all."""
    size = file_size(fd, what)
    if offset < 0 or length < 0 or offset + length > size:
        raise IllegalArgumentError(
            f"{what} holds {size} bytes; the model names {length} bytes at offset {offset}"
        )
    chunks, at = [], offset
    while at < offset + length:
        try:
            chunk = os.pread(fd, min(_READ_CHUNK, offset + length - at), at)
        except OSError as exc:
            raise IllegalArgumentError(f"{what} cannot be read: {exc.strerror}") from None
        if not chunk:
            raise IllegalArgumentError(f"{what} ended early (it shrank while read)")
        chunks.append(chunk)
        at += len(chunk)
    return b"".join(chunks)


def model_file_size(fd: int, limit: int) -> int:
    """The size of the model file behind a client's descriptor, checked before anything is
    read: a regular file, not empty, of at most `limit` bytes."""
    size = file_size(fd, "the descriptor sent with load_real")
    if size > limit:
        raise CapacityError(
            f"the model file holds {size} bytes; this daemon reads at most {limit} "
            "(serve --max-model-mib)"
        )
    if size == 0:
        raise IllegalArgumentError("the model file is empty")
    return size


def read_model_file(fd: int, limit: int) -> bytes:
    """The whole model file behind a client's descriptor (`model_file_size`), read from
    its start without moving the client's offset."""
    return read_span(fd, 0, model_file_size(fd, limit), "the model file")
