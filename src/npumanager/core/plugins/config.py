"""The configuration file: where it is, what it may hold, and where each value came from.

The file is TOML at `platformdirs.user_config_dir("npu-manager")/config.toml`, or the
path in `NPUMANAGER_CONFIG` or `--config`. A file named either way must exist; the
per-user one may be missing (defaults apply). Environment variables override the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from npumanager.core.plugins.tomlfile import file_kind, read_toml
from npumanager.errors import ConfigError
from npumanager.schemas import Importance
from npumanager.userdirs import user_dir

APP_NAME = "npu-manager"
CONFIG_ENV = "NPUMANAGER_CONFIG"
CONFIG_FILE_NAME = "config.toml"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class PluginsConfig(_Section):
    """Which plugins load, and whether a broken one is an error."""

    strict: bool = False
    """Raise instead of warning when a plugin fails to load or registers something invalid."""
    disable: tuple[str, ...] = Field(default=(), strict=False)
    """Plugins never loaded, by entry-point or distribution name."""
    load: tuple[str, ...] | None = Field(default=None, strict=False)
    """If set, the only third-party plugins loaded; the built-ins always load."""


class ImportanceConfig(_Section):
    """What the importance sources read from the file."""

    rules: dict[str, str] = {}
    """The `rules` source's table, ``[importance.rules]``: app-id globs to importance names
    (``"camera.service" = "FOREGROUND"``), in the file's order; the first match wins."""

    @field_validator("rules")
    @classmethod
    def _names(cls, rules: dict[str, str]) -> dict[str, str]:
        allowed = list(Importance.__members__)
        for glob, name in rules.items():
            if name.upper() not in allowed:
                raise ValueError(
                    f"{glob!r} = {name!r} is not an importance; allowed: {', '.join(allowed)}"
                )
        return rules


class Config(_Section):
    """The whole configuration file."""

    plugins: PluginsConfig = PluginsConfig()
    importance: ImportanceConfig = ImportanceConfig()


ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "NPUMANAGER_STRICT_PLUGINS": ("plugins", "strict"),
    "NPUMANAGER_DISABLE_PLUGINS": ("plugins", "disable"),
    "NPUMANAGER_LOAD_PLUGINS": ("plugins", "load"),
}
"""Environment variable -> (section, key) it overrides."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class LoadedConfig:
    """The effective configuration, the file it was read from, and each value's source."""

    config: Config
    path: Path
    file_found: bool
    sources: Mapping[str, str]

    def rows(self) -> list[tuple[str, Any, str]]:
        """(dotted key, value, source) for every setting, in declaration order."""
        rows = []
        for section_name in Config.model_fields:
            section = getattr(self.config, section_name)
            for key in type(section).model_fields:
                dotted = f"{section_name}.{key}"
                rows.append((dotted, getattr(section, key), self.sources.get(dotted, "default")))
        return rows


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """`NPUMANAGER_CONFIG` if set, else the per-user config file."""
    env = os.environ if environ is None else environ
    if override := env.get(CONFIG_ENV):
        return Path(override)
    return user_dir(platformdirs.user_config_dir, f"{CONFIG_ENV} or --config") / CONFIG_FILE_NAME


def load_config(path: Path | None = None, environ: Mapping[str, str] | None = None) -> LoadedConfig:
    """Read, merge and validate the configuration; a bad value raises `ConfigError`."""
    env = os.environ if environ is None else environ
    named_by = "--config" if path is not None else CONFIG_ENV if env.get(CONFIG_ENV) else None
    path = path or default_config_path(env)
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    file_found = file_kind(path) != "missing"
    if file_found:
        data = read_toml(path)
        for section, values in data.items():
            if isinstance(values, dict):
                for key in values:
                    sources[f"{section}.{key}"] = f"file {path}"
    elif named_by is not None:
        raise ConfigError(f"{path}: no such file (named by {named_by})")
    try:
        Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from None
    for var, (section, key) in ENV_OVERRIDES.items():
        if var in env:
            value = _parse_env(var, env[var], key)
            section_data = data.setdefault(section, {})
            section_data[key] = value
            sources[f"{section}.{key}"] = f"env {var}"
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"environment: {_describe(exc)}") from None
    return LoadedConfig(config, path, file_found, sources)


def _parse_env(var: str, raw: str, key: str) -> Any:
    if key == "strict":
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"{var}: must be 1 or 0 (or true/false); got {raw!r}")
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def _describe(exc: ValidationError) -> str:
    """One line: the dotted key of the first error, and what is allowed there."""
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(error["loc"][:-1])
        return f"{key}: unknown key; allowed here: {', '.join(allowed)}"
    return f"{key}: {error['msg']}; got {error['input']!r}"


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = Config
    for part in loc:
        annotation = model.model_fields[str(part)].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        model = annotation
    return list(model.model_fields)
