"""Magika, unmodified, under `npu-manager run` against a real daemon: its model loads through
the manager and its answers are exactly those of a direct run."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.daemon_support import DaemonProcess
from helpers.real_daemon import info
from helpers.run_support import Program, all_lines, managed_command, python, without_hook

MAGIKA_APP = Path(__file__).parent / "helpers" / "run_programs" / "magika_app.py"
pytest.importorskip("magika")


def samples(folder: Path) -> list[str]:
    """A few files of kinds Magika tells apart: this test's source, a JSON and a CSV file."""
    (folder / "data.json").write_text('{"apps": [' + ", ".join(['{"id": 1}'] * 50) + "]}\n")
    (folder / "table.csv").write_text("name,size\n" + "model,3163737\n" * 60)
    source = folder / "source.py"
    source.write_text(inspect.getsource(samples) * 5)
    return [str(folder / name) for name in ("data.json", "table.csv", "source.py")]


def test_magika_unmodified_answers_as_directly(
    start_onnxruntime: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    files = samples(tmp_path)
    daemon = start_onnxruntime()
    program = Program(managed_command(daemon.socket, *python(MAGIKA_APP, *files)))
    try:
        pid = int(program.line("loaded").split()[1])
        document = info(daemon)
        mine = {c["client"] for c in document["clients"] if c["pid"] == pid}
        assert [r for r in document["requests"]["loaded"] if r["client"] in mine], document
        program.send()
        program.line("done")
        assert program.finish() == 0, program.stderr
    finally:
        program.kill()
    direct = all_lines(python(MAGIKA_APP, *files), env=without_hook())
    managed = program.seen
    assert [x for x in managed if not x.startswith("loaded")] == [
        x for x in direct if not x.startswith("loaded")
    ]
    assert len([x for x in managed if x.startswith("file")]) == 2 * len(files)
