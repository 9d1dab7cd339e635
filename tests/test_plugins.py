"""Plugin discovery through real installed distributions, and isolation of broken ones."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from npumanager import (
    DriverCapability,
    PluginError,
    PluginKind,
    PluginWarning,
    UnknownPluginError,
    WorkInfo,
    load_plugins,
)
from npumanager.core.plugins.config import Config, PluginsConfig, load_config
from npumanager.schemas.enums import PluginStatus

UsePlugins = Callable[..., Path]


def _names(registry: object, kind: PluginKind) -> set[str]:
    return {reg.name for reg in registry.registrations(kind)}  # type: ignore[attr-defined]


def test_builtins_register_through_their_own_entry_points() -> None:
    registry = load_plugins()
    memory = registry.get(PluginKind.SINK, "memory")
    assert memory.source.distribution == "npu-manager"
    assert memory.source.builtin
    assert registry.problems == []


def test_separately_installed_distribution_is_discovered(plugin_site: UsePlugins) -> None:
    plugin_site("good")
    registry = load_plugins()
    driver = registry.get(PluginKind.DRIVER, "good")
    assert driver.source.distribution == "npu-good-plugin"
    assert driver.version == "1.2.3"
    assert registry.driver("good").capabilities == {
        DriverCapability.VIRTUAL_TIME,
        DriverCapability.PREEMPTION,
    }
    assert registry.driver("good").factory(x=1).options == {"x": 1}
    # A plain dict is validated into a record; its own version wins over the distribution's.
    assert registry.get(PluginKind.POLICY, "fair").version == "9.9"
    # A generator of records is accepted.
    assert "counter" in _names(registry, PluginKind.SINK)
    assert registry.problems == []


def test_registration_hooks_go_through_pluggy_wrappers_and_ordering(
    plugin_site: UsePlugins,
) -> None:
    """A wrapper on a registration hook sees and changes its plugin's records, or rescues
    a raise; `tryfirst` runs first: pluggy's own semantics, not a hand-made call."""
    plugin_site("wrapping")
    registry = load_plugins()
    assert registry.problems == []
    assert {"wrapped-policy", "added-by-wrapper"} <= set(_names(registry, PluginKind.POLICY))
    assert {"wrapped-first", "wrapped-second"} <= set(_names(registry, PluginKind.SINK))
    seen = sys.modules["npu_wrapping_plugin"].SEEN
    assert seen.index("tryfirst") < seen.index("plain")
    assert ("wrapper saw", 1) in seen
    assert "wrapper caught" in seen
    (entry,) = [e for e in registry.entries if e.source.name == "wrapping"]
    assert entry.status is PluginStatus.LOADED


def test_configure_hook_receives_the_effective_config(plugin_site: UsePlugins) -> None:
    plugin_site("good")
    config = Config(plugins=PluginsConfig(disable=("nothing",)))
    load_plugins(config)
    assert sys.modules["npu_good_plugin"].CONFIGURED[-1] is config


def test_broken_import_is_reported_with_its_distribution_and_skipped(
    plugin_site: UsePlugins,
) -> None:
    plugin_site("good", "broken")
    with pytest.warns(PluginWarning, match=r"npu-broken-import 1\.2\.3: failed to import"):
        registry = load_plugins()
    assert "good" in _names(registry, PluginKind.DRIVER)
    assert [p.source.distribution for p in registry.problems] == ["npu-broken-import"]
    assert "this plugin cannot be imported" in registry.problems[0].message


def test_invalid_records_are_dropped_counted_and_valid_ones_kept(plugin_site: UsePlugins) -> None:
    plugin_site("invalid")
    with pytest.warns(PluginWarning) as caught:
        registry = load_plugins()
    messages = [str(w.message) for w in caught]
    assert any("invalid DriverRecord dropped: name" in m for m in messages)
    assert any("capabilities" in m and "teleportation" in m for m in messages)
    assert any("returned 42, not records" in m for m in messages)
    assert all("npu-invalid-record" in m for m in messages)
    assert {"fine", "okay", "Bad Name!"} & _names(registry, PluginKind.DRIVER) == {"fine"}
    assert registry.rejected["invalidnpu"] == 3


def test_duplicate_name_is_skipped_and_both_providers_named(plugin_site: UsePlugins) -> None:
    plugin_site("duplicate")
    with pytest.warns(PluginWarning) as caught:
        registry = load_plugins()
    (message,) = [str(w.message) for w in caught]
    assert "npu-duplicate-name" in message
    assert "already registered by plugin 'builtin-sinks' from distribution npu-manager" in message
    assert registry.get(PluginKind.SINK, "memory").source.builtin
    assert "extra" in _names(registry, PluginKind.SINK)


def test_a_raising_hook_skips_the_whole_plugin(plugin_site: UsePlugins) -> None:
    plugin_site("raising", "good")
    with pytest.warns(PluginWarning, match="driver registry on fire"):
        registry = load_plugins()
    assert "never-seen" not in _names(registry, PluginKind.SINK)
    assert "raisingnpu" not in registry.sources
    assert "good" in _names(registry, PluginKind.DRIVER)


@pytest.mark.parametrize("key", ["broken", "invalid", "duplicate", "raising"])
def test_strict_mode_turns_problems_into_errors(
    plugin_site: UsePlugins, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    plugin_site(key)
    monkeypatch.setenv("NPUMANAGER_STRICT_PLUGINS", "1")
    config = load_config().config
    with pytest.raises(PluginError, match=PLUGIN_DISTS[key]):
        load_plugins(config)


PLUGIN_DISTS = {
    "broken": "npu-broken-import",
    "invalid": "npu-invalid-record",
    "duplicate": "npu-duplicate-name",
    "raising": "npu-raising-hook",
}


@pytest.mark.parametrize("name", ["brokennpu", "npu-broken-import", "NPU_Broken_Import"])
def test_disable_by_entry_point_or_distribution_name(
    plugin_site: UsePlugins, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    plugin_site("good", "broken")
    monkeypatch.setenv("NPUMANAGER_DISABLE_PLUGINS", f"unrelated, {name}")
    registry = load_plugins(load_config().config)
    assert registry.problems == []
    assert "good" in _names(registry, PluginKind.DRIVER)


def test_disable_can_block_a_builtin() -> None:
    registry = load_plugins(Config(plugins=PluginsConfig(disable=("builtin-sinks",))))
    assert "memory" not in _names(registry, PluginKind.SINK)


def test_load_list_allows_only_named_third_parties(
    plugin_site: UsePlugins, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_site("good", "duplicate")
    monkeypatch.setenv("NPUMANAGER_LOAD_PLUGINS", "goodnpu")
    registry = load_plugins(load_config().config)
    assert "good" in _names(registry, PluginKind.DRIVER)
    assert "extra" not in _names(registry, PluginKind.SINK)
    assert "memory" in _names(registry, PluginKind.SINK), "built-ins always load"


def test_unknown_name_lists_what_is_available() -> None:
    registry = load_plugins()
    with pytest.raises(
        UnknownPluginError, match=r"unknown sink 'nope'; available: jsonl, memory, perfetto"
    ):
        registry.sink("nope")
    with pytest.raises(LookupError, match="unknown driver"):
        registry.driver("nope")


def test_validate_counts_rejections_per_plugin() -> None:
    registry = load_plugins()
    source = registry.get(PluginKind.SINK, "memory").source
    good = {
        "id": 1,
        "uid": 5,
        "originalUid": 5,
        "jobPriority": 0,
        "effectivePriority": 100,
        "timestampMs": 3,
    }
    with pytest.warns(PluginWarning, match="invalid WorkInfo dropped: jobPriority"):
        assert registry.validate(WorkInfo, {**good, "jobPriority": -1}, source) is None
    assert registry.validate(WorkInfo, good, source) is not None
    assert registry.rejected[source.name] == 1


def test_health_sources_register_like_the_other_kinds(plugin_site: UsePlugins) -> None:
    plugin_site("thermometer")
    with pytest.warns(PluginWarning) as caught:
        registry = load_plugins()
    messages = [str(w.message) for w in caught]
    assert any("invalid HealthSourceRecord dropped: name" in m for m in messages)
    assert any(
        "health_source name 'linux' is already registered by plugin 'builtin-health'" in m
        for m in messages
    )
    assert all("npu-thermometer-plugin" in m for m in messages)
    assert _names(registry, PluginKind.HEALTH_SOURCE) == {"linux", "thermometer"}
    assert registry.get(PluginKind.HEALTH_SOURCE, "linux").source.builtin
    reading = registry.health_source("thermometer").factory(temp_mc=85_000).read()
    assert reading.severity(0) == 2
