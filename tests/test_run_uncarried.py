"""A model whose inputs or outputs the manager's data plane cannot carry (strings,
sequences, maps: a classifier's ZipMap), in an unmodified program under `npu-manager run`:
it runs in the program's own process with one warning line, its outputs those of a direct
run, or, with `--no-daemon refuse`, is refused with the runtime's error saying why; for
ONNX Runtime and for OpenVINO."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import run_support as programs
from helpers.daemon_support import DaemonProcess
from helpers.onnx_builders import strings_model, zipmap_model
from helpers.real_daemon import info

pytest.importorskip("onnxruntime")
Start = Callable[..., DaemonProcess]
REFUSE = ("--no-daemon", "refuse")
WHY = "cannot cross the manager's data plane (tensors of numbers only)"


@pytest.fixture
def models(socket_dir: Path) -> dict[str, Path]:
    paths = {}
    for kind, model in (("zipmap", zipmap_model()), ("strings", strings_model())):
        path = socket_dir / f"{kind}.onnx"
        path.write_bytes(model.SerializeToString())
        path.chmod(0o644)
        paths[kind] = path
    return paths


def _managed(
    daemon: DaemonProcess, args: tuple[object, ...], *prefixes: str, refuse: bool = False
) -> tuple[list[str], str]:
    """The lines starting with `prefixes` of a program under `npu-manager run`, which must
    exit 0, and its stderr."""
    command = programs.managed_command(
        daemon.socket, *programs.python(*map(str, args)), options=REFUSE if refuse else ()
    )
    program = programs.Program(command, env=programs.without_hook())
    try:
        lines = [program.line(prefix) for prefix in prefixes]
        assert program.finish() == 0, program.stderr
    finally:
        program.kill()
    return lines, program.stderr


def _direct(args: tuple[object, ...], prefix: str) -> str:
    lines = programs.all_lines(programs.python(*map(str, args)), env=programs.without_hook())
    return next(line for line in lines if line.startswith(prefix))


@pytest.mark.parametrize(
    ("kind", "foreign"),
    [
        ("zipmap", "output 'probs' (seq(map(int64,tensor(float))))"),
        ("strings", "input 's' (tensor(string))"),
    ],
)
def test_a_model_the_data_plane_cannot_carry_runs_unmanaged_as_directly(
    start_onnxruntime: Start, models: dict[str, Path], kind: str, foreign: str
) -> None:
    daemon = start_onnxruntime()
    args = (programs.ORT_APP, "uncarried", models[kind], kind)
    (managed, outputs), stderr = _managed(daemon, args, "managed_session", "outputs")
    assert managed == "managed_session False"
    assert outputs == _direct(args, "outputs")
    warnings = [line for line in stderr.splitlines() if "unmanaged" in line]
    assert warnings == [
        f"npu-manager run: warning: a model runs in this process, unmanaged: its {foreign} {WHY}"
    ]
    assert not info(daemon)["requests"]["loaded"], "nothing was asked of the daemon"


def test_where_every_model_must_be_managed_it_is_refused_saying_why(
    start_onnxruntime: Start, models: dict[str, Path]
) -> None:
    daemon = start_onnxruntime()
    args = (programs.ORT_APP, "uncarried", models["zipmap"], "zipmap")
    (refused,), _ = _managed(daemon, args, "refused", refuse=True)
    assert refused.startswith("refused Fail [ONNXRuntimeError] : 1 : FAIL : "), refused
    assert refused.endswith(
        f"npu-manager refused the model: its output 'probs' (seq(map(int64,tensor(float)))) {WHY}"
    ), refused


def test_an_openvino_model_of_strings_runs_unmanaged_as_directly(
    start_onnxruntime: Start, models: dict[str, Path]
) -> None:
    pytest.importorskip("openvino")
    daemon = start_onnxruntime()
    args = (programs.OV_APP, models["strings"], "strings")
    (managed, outputs), stderr = _managed(daemon, args, "managed_model", "outputs")
    assert managed == "managed_model False"
    assert outputs == _direct(args, "outputs")
    assert f"unmanaged: its input 's' (string) {WHY}" in stderr
    (refused,), _ = _managed(daemon, args, "refused", refuse=True)
    assert refused == f"refused npu-manager refused the model: its input 's' (string) {WHY}"
