"""The command line: each command, its JSON form, and its error paths."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from npumanager.cli.program import main
from npumanager.schemas import SCHEMA_MODELS


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def console(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    script = Path(sys.executable).with_name("npu-manager")
    return subprocess.run(
        [str(script), *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_plugins_json_lists_builtins_with_their_distribution() -> None:
    result = console("plugins", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    memory = next(p for p in document["plugins"] if p["name"] == "memory")
    assert memory == {
        "kind": "sink",
        "name": "memory",
        "distribution": "npu-manager",
        "version": memory["version"],
        "plugin": "builtin-sinks",
        "builtin": True,
        "capabilities": [],
        "description": "keeps events in memory",
    }
    assert document["problems"] == []


def test_plugins_table_shows_a_third_party_and_warns_about_a_broken_one(
    installed_plugins: object,
) -> None:
    site = installed_plugins.site("good", "broken")  # type: ignore[attr-defined]
    result = console("plugins", env={"PYTHONPATH": str(site)})
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "CAPABILITIES"]
    good = next(line for line in lines if " good " in f" {line} ")
    assert good.split() == ["driver", "good", "npu-good-plugin", "1.2.3", "preemption,virtual_time"]
    (warning,) = result.stderr.splitlines()
    assert warning.startswith("npu-manager: warning: plugin 'brokennpu' from distribution")
    assert "npu-broken-import" in warning
    assert "Traceback" not in result.stderr


def test_strict_plugins_error_is_one_line_exit_2(installed_plugins: object) -> None:
    site = installed_plugins.site("broken")  # type: ignore[attr-defined]
    result = console("plugins", env={"PYTHONPATH": str(site), "NPUMANAGER_STRICT_PLUGINS": "1"})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("npu-manager: error: plugin 'brokennpu'")


def test_schema_all_and_one() -> None:
    code, out, _ = run("schema")
    assert code == 0
    document = json.loads(out)
    assert set(document) == set(SCHEMA_MODELS)
    assert "appPriority" in document["SchedulingConfig"]["properties"]
    code, out, _ = run("schema", "workinfo")
    assert code == 0
    work = json.loads(out)
    assert list(work["properties"])[:3] == ["id", "groupId", "uid"]
    assert work["properties"]["timestampMs"]["maximum"] == 2**63 - 1
    assert work["additionalProperties"] is False


def test_unknown_schema_is_an_error_listing_the_names() -> None:
    code, out, err = run("schema", "Nope")
    assert (code, out) == (2, "")
    assert err == (
        "npu-manager: error: unknown schema 'Nope'; available: " + ", ".join(SCHEMA_MODELS) + "\n"
    )


def test_config_shows_values_and_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[plugins]\ndisable = ["x"]\n')
    monkeypatch.setenv("NPUMANAGER_STRICT_PLUGINS", "0")
    code, out, _ = run("--config", str(path), "config")
    assert code == 0
    assert out.splitlines()[0] == f"config file: {path}"
    rows = {line.split()[0]: line.split(maxsplit=2)[1:] for line in out.splitlines()[3:]}
    assert rows["plugins.disable"] == ["x", f"file {path}"]
    assert rows["plugins.strict"] == ["false", "env NPUMANAGER_STRICT_PLUGINS"]
    assert rows["plugins.load"] == ["(unset)", "default"]
    code, out, _ = run("--config", str(path), "config", "--json")
    document = json.loads(out)
    assert document["settings"]["plugins.disable"] == {"value": ["x"], "source": f"file {path}"}
    assert document["file_found"] is True


def test_bad_config_file_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[plugins]\nstrict = 'very'\n")
    result = console("config", env={"NPUMANAGER_CONFIG": str(path)})
    assert result.returncode == 2
    assert result.stderr == (
        f"npu-manager: error: {path}: plugins.strict: Input should be a valid boolean; got 'very'\n"
    )
    # Every command reads the config, so each reports it the same way.
    assert console("plugins", env={"NPUMANAGER_CONFIG": str(path)}).stderr == result.stderr


def test_usage_errors_exit_2() -> None:
    result = console()
    assert result.returncode == 2
    assert "the following arguments are required: COMMAND" in result.stderr
    assert console("frobnicate").returncode == 2


def test_help_and_version() -> None:
    result = console("--help")
    assert result.returncode == 0
    for command in ("demo", "plugins", "schema", "config"):
        assert command in result.stdout
    assert console("--version").stdout.startswith("npu-manager ")
