"""The exceptions a user of npu-manager may catch; the CLI prints these as one line."""

from __future__ import annotations


class NpuManagerError(Exception):
    """Base of every error that reports a user's or a plugin's mistake, not a bug."""


class ConfigError(NpuManagerError, ValueError):
    """A configuration file or environment variable holds a value that is not allowed."""


class PluginError(NpuManagerError):
    """A plugin failed to load or registered something invalid (raised in strict mode)."""


class UnknownPluginError(NpuManagerError, LookupError):
    """A driver, policy or sink name that no installed plugin registered."""


class PluginWarning(UserWarning):
    """A broken plugin was skipped; the message names its distribution."""
