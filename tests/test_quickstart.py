"""CI runs the README's quick start as written; keep that section well formed."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _extractor() -> object:
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / ".ci" / "quickstart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_has_the_two_blocks() -> None:
    blocks = _extractor().quickstart_blocks((ROOT / "README.md").read_text())  # type: ignore[attr-defined]
    assert len(blocks) >= 2
    setup, tests = blocks[0], blocks[1]
    assert "venv" in setup
    assert "pip install ." in setup
    assert setup.strip().endswith("npu-manager demo")
    assert re.search(r"\[test[,\]]", tests)
    assert "pytest" in tests


def test_ci_runs_the_blocks_it_extracts() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 .ci/quickstart.py 1" in ci
    assert "python3 .ci/quickstart.py 2" in ci
    assert "mypy --strict src" in ci
    assert "ruff check" in ci
    printed = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "quickstart.py"), "2"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "pytest" in printed


def test_extractor_refuses_a_readme_without_the_section() -> None:
    with pytest.raises(SystemExit, match="no '## Quick start' section"):
        _extractor().quickstart_blocks("# nothing here\n")  # type: ignore[attr-defined]


def test_the_readme_usage_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Using it.*?```python\n(.*?)```", text, re.DOTALL)
    assert block is not None
    namespace: dict[str, object] = {}
    exec(block.group(1), namespace)
    service = namespace["service"]
    try:
        state = service.state_of(namespace["app"], namespace["request"])  # type: ignore[attr-defined]
        assert state == "loaded"
    finally:
        service.close()  # type: ignore[attr-defined]
