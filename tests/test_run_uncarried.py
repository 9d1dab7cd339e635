"""A model whose inputs or outputs the manager's data plane cannot carry (strings,
sequences, maps: a classifier's ZipMap), in an unmodified program under `npu-manager run`:
it runs in the program's own process with one warning line, its outputs those of a direct
run, or, with `--no-daemon refuse`, is refused with the runtime's `Fail` saying why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.daemon_support import DaemonProcess
from helpers.onnx_builders import strings_model, zipmap_model
from helpers.real_daemon import info
from helpers.run_support import ORT_APP, Program, all_lines, managed_command, python, without_hook

pytest.importorskip("onnxruntime")
Start = Callable[..., DaemonProcess]


@pytest.fixture
def models(socket_dir: Path) -> dict[str, Path]:
    paths = {}
    for kind, model in (("zipmap", zipmap_model()), ("strings", strings_model())):
        path = socket_dir / f"{kind}.onnx"
        path.write_bytes(model.SerializeToString())
        path.chmod(0o644)
        paths[kind] = path
    return paths


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
    args = (ORT_APP, "uncarried", models[kind], kind)
    direct = all_lines(python(*args), env=without_hook())
    program = Program(managed_command(daemon.socket, *python(*args)), env=without_hook())
    try:
        assert program.line("managed_session") == "managed_session False"
        outputs = program.line("outputs")
        assert program.finish() == 0, program.stderr
    finally:
        program.kill()
    assert outputs == next(line for line in direct if line.startswith("outputs"))
    warnings = [line for line in program.stderr.splitlines() if "unmanaged" in line]
    assert warnings == [
        "npu-manager run: warning: a model runs in this process, unmanaged: its "
        f"{foreign} cannot cross the manager's data plane (tensors of numbers only)"
    ]
    assert not info(daemon)["requests"]["loaded"], "nothing was asked of the daemon"


def test_where_every_model_must_be_managed_it_is_refused_saying_why(
    start_onnxruntime: Start, models: dict[str, Path]
) -> None:
    daemon = start_onnxruntime()
    command = managed_command(
        daemon.socket,
        *python(ORT_APP, "uncarried", models["zipmap"], "zipmap"),
        options=("--no-daemon", "refuse"),
    )
    program = Program(command, env=without_hook())
    try:
        refused = program.line("refused")
        assert program.finish() == 0, program.stderr
    finally:
        program.kill()
    assert refused.startswith("refused Fail [ONNXRuntimeError] : 1 : FAIL : "), refused
    assert refused.endswith(
        "npu-manager refused the model: its output 'probs' (seq(map(int64,tensor(float)))) "
        "cannot cross the manager's data plane (tensors of numbers only)"
    ), refused
