"""Importance sources as plugins: the hook, the records, the built-ins `rules` and `slices`,
a third party's source as a really installed distribution, the config file's table, and
``NAME[:KEY=VALUE,...]`` specs built through the registry with one-line errors."""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.daemon_support import WAIT_S
from npumanager import (
    ConfigError,
    Importance,
    ImportanceSourceRecord,
    NpuManagerError,
    PluginKind,
    PluginWarning,
    UnknownPluginError,
    load_plugins,
)
from npumanager.apps.identity import AppIdentity, app_of_cgroup
from npumanager.cli.importance import DEFAULT_SOURCES, build_importance_sources, importance_specs
from npumanager.core.plugins.config import load_config
from npumanager.core.plugins.importance import build_importance_source, importance_named
from npumanager.core.plugins.importance_combine import ImportanceCombiner
from npumanager.errors import IllegalArgumentError
from npumanager.plugins.importance.desktop import DesktopSource

UsePlugins = Callable[..., Path]
ALLOWED = "FOREGROUND, FOREGROUND_SERVICE, VISIBLE, PERCEPTIBLE, SERVICE"


def app(path: str) -> AppIdentity:
    found = app_of_cgroup(path)
    assert found is not None, path
    return found


CAMERA = app("/system.slice/camera.service")
PHOTOS = app(
    "/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-org.gnome.Photos-7.scope"
)
INDEXER = app(
    "/user.slice/user-1000.slice/user@1000.service/background.slice/"
    "app-gnome-org.example.Indexer-9.scope"
)
SHELL = app(
    "/user.slice/user-1000.slice/user@1000.service/session.slice/org.gnome.Shell@wayland.service"
)


def one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_builtins_register_through_their_own_entry_point() -> None:
    registry = load_plugins()
    found = {r.name: r for r in registry.registrations(PluginKind.IMPORTANCE_SOURCE)}
    assert set(found) >= {"desktop", "slices", "rules"}
    for name in ("desktop", "slices", "rules"):
        assert found[name].source.name == "builtin-importance"
        assert found[name].source.builtin
        assert isinstance(registry.importance_source(name), ImportanceSourceRecord)
    assert registry.problems == []


def test_slices_rank_background_and_session_and_leave_apps_to_others() -> None:
    registry = load_plugins()
    _, source = build_importance_source(registry, "slices")
    assert source.importance(INDEXER) is Importance.CACHED
    assert source.importance(SHELL) is Importance.FOREGROUND_SERVICE
    assert source.importance(PHOTOS) is None
    assert source.importance(CAMERA) is None  # system.slice: no opinion
    _, tuned = build_importance_source(
        registry, ("slices", {"background": "service", "session": "none", "app": "VISIBLE"})
    )
    assert tuned.importance(INDEXER) is Importance.SERVICE
    assert tuned.importance(SHELL) is None
    assert tuned.importance(PHOTOS) is Importance.VISIBLE


def test_rules_first_match_wins_options_before_the_config_files_table(tmp_path: Path) -> None:
    config_file = tmp_path / "config.toml"
    config_file.write_text(
        '[importance.rules]\n"camera.service" = "CACHED"\n"org.gnome.*" = "PERCEPTIBLE"\n'
    )
    registry = load_plugins(load_config(config_file).config)
    _, source = build_importance_source(
        registry, ("rules", {"rules": "camera.*=FOREGROUND/org.gnome.Photos=visible"})
    )
    assert source.importance(CAMERA) is Importance.FOREGROUND
    assert source.importance(PHOTOS) is Importance.VISIBLE
    assert source.importance(SHELL) is Importance.PERCEPTIBLE  # the file's, after
    assert source.importance(INDEXER) is None
    _, from_file = build_importance_source(registry, "rules")
    assert from_file.importance(CAMERA) is Importance.CACHED
    assert from_file.importance(PHOTOS) is Importance.PERCEPTIBLE
    _, from_table = build_importance_source(
        load_plugins(), ("rules", {"rules": {"org.example.*": "GONE"}})
    )
    assert from_table.importance(INDEXER) is Importance.GONE


def test_a_bad_importance_name_in_the_config_file_is_one_line(tmp_path: Path) -> None:
    config_file = tmp_path / "config.toml"
    config_file.write_text('[importance.rules]\n"camera.service" = "URGENT"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(config_file)
    assert f"'URGENT' is not an importance; allowed: {ALLOWED}" in one_line(caught)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            ("rules", {"rules": "camera.service=URGENT"}),
            f"'URGENT' is not an importance; allowed: {ALLOWED}",
        ),
        (("rules", {"rules": "camera.service"}), "rules are GLOB=NAME separated by '/'"),
        (("rules", {"rules": "=CACHED"}), "a rule has no glob"),
        (
            ("slices", {"app": "urgent"}),
            "app: 'urgent' is not an importance; allowed: none, FOREGROUND",
        ),
        (("slices", {"apps": "none"}), "unknown option 'apps'; allowed: background, session, app"),
        (("desktop", {"bogus": 1}), "unknown option 'bogus'; allowed: root, ladder"),
        (("desktop", {"ladder": "VISIBLE@5"}), "the first step must begin at 0 s"),
        (("desktop", {"ladder": "VISIBLE@0/SERVICE@9/PERCEPTIBLE@20"}), "less important than"),
        (("desktop", {"ladder": "FOREGROUND@0"}), "less important than FOREGROUND"),
        (("desktop", {"ladder": "VISIBLE@0/CACHED@soon"}), "steps are NAME@SECONDS"),
        (
            ("desktop", {"ladder": "VISIBLE@0/URGENT@3"}),
            f"'URGENT' is not an importance; allowed: {ALLOWED}",
        ),
        (("desktop", {"root": "/no/such/folder"}), "root '/no/such/folder' is not a folder"),
        ("thermometer", "unknown importance_source 'thermometer'; available: desktop, rules"),
    ],
)
def test_bad_options_are_refused_in_one_line_naming_what_is_allowed(
    spec: object, message: str
) -> None:
    with pytest.raises(NpuManagerError) as caught:
        build_importance_source(load_plugins(), spec)  # type: ignore[arg-type]
    assert message in one_line(caught)


def test_an_object_is_a_source_as_it_is_and_anything_else_is_refused() -> None:
    class Mine:
        def start(self, changed: object) -> None:
            pass

        def importance(self, app: object) -> Importance | None:
            return None

        def close(self) -> None:
            pass

    mine = Mine()
    assert build_importance_source(load_plugins(), mine) == ("Mine", mine)
    with pytest.raises(IllegalArgumentError, match="start\\(\\), importance\\(\\) and close\\(\\)"):
        build_importance_source(load_plugins(), object())  # type: ignore[arg-type]


def test_a_third_party_source_installed_as_a_distribution(plugin_site: UsePlugins) -> None:
    plugin_site("kiosk")
    with pytest.warns(PluginWarning):
        registry = load_plugins()
    problems = "\n".join(map(str, registry.problems))
    assert "npu-kiosk-plugin" in problems
    assert "Not A Name" in problems  # an invalid record is dropped...
    assert "'desktop' is already registered by plugin 'builtin-importance'" in problems
    assert registry.get(PluginKind.IMPORTANCE_SOURCE, "desktop").source.builtin  # ...a taken name
    assert registry.get(PluginKind.IMPORTANCE_SOURCE, "kiosk").source.distribution == (
        "npu-kiosk-plugin"
    )
    built = build_importance_sources(
        registry, ["kiosk:background=org.gnome.Photos", "lamp:level=CACHED", "slices"]
    )
    assert [name for name, _ in built] == ["kiosk", "lamp", "slices"]
    (_, kiosk), (_, lamp), _ = built
    assert kiosk.importance(PHOTOS) is Importance.CACHED
    assert lamp.importance(CAMERA) is Importance.CACHED
    with pytest.raises(IllegalArgumentError) as caught:
        build_importance_sources(registry, ["lamp:level=URGENT"])
    assert "importance source 'lamp': level:" in one_line(caught)
    # Its changes reach a combiner through the callback, in the configured order.
    combiner = ImportanceCombiner([name for name, _ in built])
    for name, source in built:
        for one in (CAMERA, PHOTOS, INDEXER):
            combiner.opinion(name, one.app_id, source.importance(one))
    changes: queue.Queue[tuple[str, Importance | None]] = queue.Queue()
    kiosk.start(lambda app_id, importance: changes.put((app_id, importance)))
    assert combiner.effective(CAMERA.app_id, 1000) == (Importance.FOREGROUND, "kiosk")
    kiosk.send_to_back(CAMERA.app_id)  # type: ignore[attr-defined]
    app_id, importance = changes.get(timeout=WAIT_S)
    combiner.opinion("kiosk", app_id, importance)
    assert combiner.effective(CAMERA.app_id, 1000) == (Importance.CACHED, "kiosk")
    for _, source in built:
        source.close()


def test_specs_parse_like_health_and_default_where_cgroup_v2_is() -> None:
    assert importance_specs(["none"]) == []
    assert importance_specs([], cgroup_v2=lambda: Path("/sys/fs/cgroup")) == [
        (name, {}) for name in DEFAULT_SOURCES
    ]
    assert importance_specs([], cgroup_v2=lambda: None) == [("rules", {})]
    assert importance_specs(["desktop:root=/x,ladder=VISIBLE@0/CACHED@60", "slices"]) == [
        ("desktop", {"root": "/x", "ladder": "VISIBLE@0/CACHED@60"}),
        ("slices", {}),
    ]
    for given, message in [
        (["desktop", "none"], "--importance none turns importance sources off; give it alone"),
        ([":root=/"], "name an importance source first"),
        (["desktop:root"], "options are KEY=VALUE separated by commas"),
        (["desktop:root=/,root=/x"], "option 'root' given twice"),
        (["slices", "desktop", "slices"], "'slices' given twice"),
    ]:
        with pytest.raises(NpuManagerError) as caught:
            importance_specs(given)
        assert message in one_line(caught)


def test_nothing_is_left_built_when_a_later_spec_is_bad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[bytes] = []
    monkeypatch.setattr(DesktopSource, "close", lambda self: closed.append(self.root))
    with pytest.raises(UnknownPluginError):
        build_importance_sources(load_plugins(), [f"desktop:root={tmp_path}", "nonesuch"])
    assert closed == [bytes(tmp_path)]


def test_importance_names_are_the_platforms() -> None:
    assert importance_named("x", "cached") is Importance.CACHED
    assert importance_named("x", Importance.VISIBLE) is Importance.VISIBLE
    with pytest.raises(
        IllegalArgumentError, match=f"x: 400 is not an importance; allowed: {ALLOWED}"
    ):
        importance_named("x", 400)
