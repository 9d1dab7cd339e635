"""The configuration file: location, validation, environment overrides, sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from npumanager import ConfigError
from npumanager.core.plugins.config import default_config_path, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults_when_no_file() -> None:
    loaded = load_config(environ={})
    assert not loaded.file_found
    assert loaded.config.plugins.strict is False
    assert all(source == "default" for _, _, source in loaded.rows())


def test_default_path_is_the_per_user_config_dir(tmp_path: Path) -> None:
    path = default_config_path({})
    assert path.name == "config.toml"
    assert path.parent.name == "npu-manager"
    assert (
        default_config_path({"NPUMANAGER_CONFIG": str(tmp_path / "x.toml")}) == tmp_path / "x.toml"
    )


def test_env_variable_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[plugins]\nstrict = true\n")
    loaded = load_config(environ={"NPUMANAGER_CONFIG": str(path)})
    assert loaded.config.plugins.strict is True
    assert dict((k, s) for k, _, s in loaded.rows())["plugins.strict"] == f"file {path}"


def test_missing_file_named_by_env_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(environ={"NPUMANAGER_CONFIG": str(tmp_path / "nope.toml")})


def test_file_values_and_env_overrides_with_sources(tmp_path: Path) -> None:
    path = write(tmp_path, '[plugins]\ndisable = ["a", "b"]\nload = ["c"]\n')
    loaded = load_config(path, environ={"NPUMANAGER_LOAD_PLUGINS": "x, y"})
    assert loaded.config.plugins.disable == ("a", "b")
    assert loaded.config.plugins.load == ("x", "y")
    sources = {key: source for key, _, source in loaded.rows()}
    assert sources == {
        "plugins.strict": "default",
        "plugins.disable": f"file {path}",
        "plugins.load": "env NPUMANAGER_LOAD_PLUGINS",
        "importance.rules": "default",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[plugins]\nstrict = 1\n", "plugins.strict: Input should be a valid boolean; got 1"),
        (
            "[plugins]\nstrikt = true\n",
            "plugins.strikt: unknown key; allowed here: strict, disable, load",
        ),
        ("[plugin]\n", "plugin: unknown key; allowed here: plugins"),
        ('[plugins]\ndisable = "a"\n', "plugins.disable: Input should be a valid tuple"),
        ("[plugins\n", "not valid TOML"),
    ],
)
def test_bad_file_names_file_key_and_what_is_allowed(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_strict_env_true(value: str) -> None:
    loaded = load_config(environ={"NPUMANAGER_STRICT_PLUGINS": value})
    assert loaded.config.plugins.strict is True


def test_strict_env_rejects_nonsense() -> None:
    with pytest.raises(ConfigError, match="NPUMANAGER_STRICT_PLUGINS: must be 1 or 0"):
        load_config(environ={"NPUMANAGER_STRICT_PLUGINS": "maybe"})


def test_a_missing_file_is_an_error_however_it_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match=r"missing.toml: no such file \(named by --config\)"):
        load_config(missing, environ={})
    with pytest.raises(ConfigError, match=r"no such file \(named by NPUMANAGER_CONFIG\)"):
        load_config(environ={"NPUMANAGER_CONFIG": str(missing)})


def test_a_directory_is_an_error_however_it_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory, not a TOML file"):
        load_config(tmp_path, environ={})
    with pytest.raises(ConfigError, match="is a directory, not a TOML file"):
        load_config(environ={"NPUMANAGER_CONFIG": str(tmp_path)})


def test_no_home_and_no_passwd_entry_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    from npumanager.telemetry.jsonl import default_path

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    for var in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(ConfigError, match="no home directory .* set HOME, or NPUMANAGER_CONFIG"):
        load_config(environ={})
    with pytest.raises(ConfigError, match=r"set HOME, or give the sink a path"):
        default_path()
