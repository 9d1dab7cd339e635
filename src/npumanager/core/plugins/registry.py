"""Plugin discovery: entry points in, validated registrations out, broken plugins isolated.

Built-ins and third parties take the same path: each is an entry point in the
`npumanager` group whose object implements some hooks of `hookspecs`. A plugin that
fails to import, raises from a hook, returns something invalid or takes a name that is
already registered is reported (a `PluginWarning` naming its distribution) and skipped;
everything else still loads. In strict mode the first such problem raises `PluginError`.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeVar

import pluggy
from pydantic import BaseModel, ValidationError

from npumanager.core.plugins import hookspecs
from npumanager.core.plugins.config import Config, PluginsConfig
from npumanager.errors import PluginError, PluginWarning, UnknownPluginError
from npumanager.schemas import (
    DriverRecord,
    HealthSourceRecord,
    ImportanceSourceRecord,
    PluginKind,
    PluginRecord,
    PolicyRecord,
    SinkRecord,
)
from npumanager.schemas.enums import PluginStatus
from npumanager.schemas.plugins import RECORD_TYPES

_M = TypeVar("_M", bound=BaseModel)

ENTRY_POINT_GROUP = hookspecs.PROJECT_NAME
BUILTIN_DISTRIBUTION = "npu-manager"

_REGISTRATION_HOOKS: dict[PluginKind, str] = {
    PluginKind.DRIVER: "npumanager_register_drivers",
    PluginKind.POLICY: "npumanager_register_policies",
    PluginKind.SINK: "npumanager_register_sinks",
    PluginKind.HEALTH_SOURCE: "npumanager_register_health_sources",
    PluginKind.IMPORTANCE_SOURCE: "npumanager_register_importance_sources",
}
_GIVEN_CONFIG = {PluginKind.IMPORTANCE_SOURCE}
"""Registration hooks that are given the effective configuration."""


@dataclass(frozen=True)
class PluginSource:
    """Where a plugin came from: its entry-point name and its distribution."""

    name: str
    distribution: str
    version: str

    @property
    def builtin(self) -> bool:
        """True for the plugins that ship inside npu-manager itself."""
        return _normalize(self.distribution) == _normalize(BUILTIN_DISTRIBUTION)

    def describe(self) -> str:
        """How messages name the plugin: entry point and distribution."""
        return f"plugin {self.name!r} from distribution {self.distribution} {self.version}"


@dataclass(frozen=True)
class Registration:
    """One registered driver, policy, sink, health or importance source, and its plugin."""

    record: PluginRecord
    source: PluginSource

    @property
    def kind(self) -> PluginKind:
        """Driver, policy or sink."""
        return self.record.kind

    @property
    def name(self) -> str:
        """The name users select it by."""
        return self.record.name

    @property
    def version(self) -> str:
        """The record's own version, or its distribution's."""
        return self.record.version or self.source.version


@dataclass(frozen=True)
class PluginProblem:
    """A plugin (or one of its values) that was reported and skipped."""

    source: PluginSource
    message: str

    def __str__(self) -> str:
        return f"{self.source.describe()}: {self.message}"


LOADED, EMPTY, BROKEN = PluginStatus.LOADED, PluginStatus.EMPTY, PluginStatus.BROKEN
DISABLED, UNAVAILABLE = PluginStatus.DISABLED, PluginStatus.UNAVAILABLE


@dataclass(frozen=True)
class PluginEntry:
    """One entry point found, what became of it, and why."""

    source: PluginSource
    status: PluginStatus
    detail: str
    """What it registered, what broke it, the setting that disabled it, or what to install."""


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names_of(source: PluginSource) -> set[str]:
    """The names a plugin may go by: its entry point, its distribution and the distribution's
    words (`npu-zeta` is also `zeta`), normalized."""
    distribution = _normalize(source.distribution)
    return {_normalize(source.name), distribution, *distribution.split("-")}


class PluginRegistry:
    """The pluggy manager plus every validated registration, by kind and name."""

    def __init__(self, settings: PluginsConfig | None = None, config: Config | None = None):
        self.settings = settings or PluginsConfig()
        self.config = config or Config(plugins=self.settings)
        self.manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.manager.add_hookspecs(hookspecs)
        self.sources: dict[str, PluginSource] = {}
        self.problems: list[PluginProblem] = []
        self.rejected: Counter[str] = Counter()
        """Values dropped at the boundary, per plugin name."""
        self.entries: list[PluginEntry] = []
        """Every entry point found, in discovery order, with its status."""
        self.unavailable: dict[tuple[str, str], str] = {}
        """(kind, name) -> why it is not registered here (the extra to install)."""
        self._by_kind: dict[PluginKind, dict[str, Registration]] = {k: {} for k in PluginKind}

    def load_entry_points(self, entry_points: Iterable[metadata.EntryPoint] | None = None) -> None:
        """Discover, filter, import and register every plugin of the entry-point group."""
        found = list(entry_points if entry_points is not None else _group_entry_points())
        found.sort(key=lambda ep: (not _source_of(ep).builtin, _dist_name(ep), ep.name))
        for entry_point in found:
            source = _source_of(entry_point)
            if not self._allowed(source):
                self.entries.append(PluginEntry(source, DISABLED, self._disabled_by(source)))
                continue
            if source.name in self.sources:
                other = self.sources[source.name]
                self._broken(source, f"entry-point name already used by {other.describe()}")
                continue
            try:
                plugin = entry_point.load()
            except Exception as exc:
                self._broken(source, f"failed to import: {type(exc).__name__}: {exc}")
                continue
            self.register(plugin, source)
        self._check_named([_source_of(entry_point) for entry_point in found])

    def _check_named(self, sources: list[PluginSource]) -> None:
        """Warn (in strict mode: refuse) a name in `plugins.disable` or `plugins.load` that
        no installed plugin has: a typo there would otherwise disable nothing, silently."""
        known = {_normalize(s.name) for s in sources} | {
            _normalize(s.distribution) for s in sources
        }
        settings = (("disable", self.settings.disable), ("load", self.settings.load or ()))
        for key, names in settings:
            for name in names:
                if _normalize(name) in known:
                    continue
                plugins = ", ".join(sorted({s.name for s in sources})) or "none"
                distributions = ", ".join(sorted({s.distribution for s in sources}))
                message = (
                    f"plugins.{key} names {name!r}, which no installed plugin has; installed: "
                    f"{plugins} (or by distribution: {distributions or 'none'})"
                )
                if self.settings.strict:
                    raise PluginError(message)
                warnings.warn(message, PluginWarning, stacklevel=3)

    def register(self, plugin: object, source: PluginSource) -> bool:
        """Register one plugin object; False if it was reported and skipped whole."""
        before = len(self.problems)
        ok = self._register(plugin, source)
        mine = [p.message for p in self.problems[before:]]
        if not ok or mine:
            self.entries.append(PluginEntry(source, BROKEN, "; ".join(mine) or "skipped"))
            return ok
        names = [f"{r.kind} {r.name}" for r in self.registrations() if r.source == source]
        missing = [f"{k} {n} ({why})" for (k, n), why in self._unavailable_of(plugin, source)]
        if names:
            extra = f"; unavailable: {', '.join(missing)}" if missing else ""
            self.entries.append(PluginEntry(source, LOADED, ", ".join(names) + extra))
        elif missing:
            self.entries.append(PluginEntry(source, UNAVAILABLE, ", ".join(missing)))
        else:
            self.entries.append(PluginEntry(source, EMPTY, "its hooks returned no records"))
        return ok

    def _unavailable_of(
        self, plugin: object, source: PluginSource
    ) -> list[tuple[tuple[str, str], str]]:
        found = []
        for result in self._call_own_hook(plugin, source, "npumanager_unavailable", {}):
            for kind, name, why in result or ():
                found.append(((str(kind), str(name)), str(why)))
        self.unavailable.update(found)
        return found

    def _broken(self, source: PluginSource, message: str) -> None:
        self._problem(source, message)
        self.entries.append(PluginEntry(source, BROKEN, message))

    def _disabled_by(self, source: PluginSource) -> str:
        names = {_normalize(source.name), _normalize(source.distribution)}
        if names & {_normalize(n) for n in self.settings.disable}:
            return "by plugins.disable"
        return "by plugins.load (not named there)"

    def _register(self, plugin: object, source: PluginSource) -> bool:
        try:
            self.manager.register(plugin, name=source.name)
        except Exception as exc:
            self._problem(source, f"cannot be registered: {exc}")
            return False
        collected: list[Registration] = []
        ok = True
        for kind, hook_name in _REGISTRATION_HOOKS.items():
            kwargs = {"config": self.config} if kind in _GIVEN_CONFIG else {}
            for result in self._call_own_hook(plugin, source, hook_name, kwargs):
                ok = ok and result is not _FAILED
                collected.extend(self._accept_records(kind, result, source))
        if ok:
            results = self._call_own_hook(
                plugin, source, "npumanager_configure", {"config": self.config}
            )
            ok = _FAILED not in list(results)
        if not ok:
            self.manager.unregister(plugin)
            return False
        self.sources[source.name] = source
        for registration in collected:
            self._add(registration)
        return True

    def _call_own_hook(
        self, plugin: object, source: PluginSource, hook_name: str, kwargs: dict[str, Any]
    ) -> Iterator[Any]:
        """Call one plugin's implementations of a hook through pluggy's own caller, so its
        wrappers, `tryfirst`/`trylast` and ordering behave as pluggy documents; the other
        plugins are left out, so that what goes wrong is this plugin's alone."""
        others = [p for p in self.manager.get_plugins() if p is not plugin]
        caller = self.manager.subset_hook_caller(hook_name, remove_plugins=others)
        try:
            results = caller(**kwargs)
        except Exception as exc:
            self._problem(source, f"hook {hook_name} raised {type(exc).__name__}: {exc}")
            yield _FAILED
            return
        yield from results

    def _accept_records(
        self, kind: PluginKind, result: Any, source: PluginSource
    ) -> Iterator[Registration]:
        if result is None or result is _FAILED:
            return
        items = [result] if isinstance(result, PluginRecord | dict) else result
        try:
            iterator = iter(items)
        except TypeError:
            self._reject(source, f"{_REGISTRATION_HOOKS[kind]} returned {result!r}, not records")
            return
        record_type = RECORD_TYPES[kind]
        for item in iterator:
            record = self.validate(record_type, item, source)
            if record is not None:
                yield Registration(record, source)

    def validate(self, model: type[_M], value: Any, source: PluginSource) -> _M | None:
        """``value`` as a valid ``model``, or None after reporting and counting it."""
        if isinstance(value, BaseModel) and not isinstance(value, model):
            value = value.model_dump()
        try:
            return model.model_validate(value)
        except ValidationError as exc:
            detail = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']} (got {e['input']!r})"
                for e in exc.errors()
            )
            self._reject(source, f"invalid {model.__name__} dropped: {detail}")
            return None

    def _add(self, registration: Registration) -> None:
        table = self._by_kind[registration.kind]
        existing = table.get(registration.name)
        if existing is not None:
            self._problem(
                registration.source,
                f"{registration.kind} name {registration.name!r} is already registered by "
                f"{existing.source.describe()}; this one is skipped",
            )
            return
        table[registration.name] = registration

    def _allowed(self, source: PluginSource) -> bool:
        names = {_normalize(source.name), _normalize(source.distribution)}
        if names & {_normalize(n) for n in self.settings.disable}:
            return False
        allow = self.settings.load
        return allow is None or source.builtin or bool(names & {_normalize(n) for n in allow})

    def _reject(self, source: PluginSource, message: str) -> None:
        self.rejected[source.name] += 1
        self._problem(source, message)

    def _problem(self, source: PluginSource, message: str) -> None:
        problem = PluginProblem(source, message)
        if self.settings.strict:
            raise PluginError(str(problem))
        self.problems.append(problem)
        warnings.warn(str(problem), PluginWarning, stacklevel=2)

    def registrations(self, kind: PluginKind | None = None) -> list[Registration]:
        """Every registration (of one kind), built-ins first, then by name."""
        kinds = [kind] if kind is not None else list(PluginKind)
        found = [reg for k in kinds for reg in self._by_kind[k].values()]
        return sorted(found, key=lambda r: (list(PluginKind).index(r.kind), r.name))

    def get(self, kind: PluginKind, name: str) -> Registration:
        """The registration of that name, or `UnknownPluginError` listing what exists."""
        try:
            return self._by_kind[kind][name]
        except KeyError:
            known = ", ".join(sorted(self._by_kind[kind])) or "none installed"
            raise UnknownPluginError(f"{self._why_not(kind, name)}; available: {known}") from None

    def _why_not(self, kind: PluginKind, name: str) -> str:
        """Why ``name`` is not registered, when the registry knows: an extra, a setting."""
        if why := self.unavailable.get((str(kind), name)):
            return f"{kind} {name!r} is not available here: {why}"
        for entry in self.entries:
            if entry.status == DISABLED and _normalize(entry.source.name) == _normalize(name):
                plugin = entry.source.name
                return f"unknown {kind} {name!r}: plugin {plugin!r} is disabled {entry.detail}"
        for entry in self.entries:
            if entry.status == BROKEN and _normalize(name) in _names_of(entry.source):
                return f"unknown {kind} {name!r}: {entry.source.describe()} did not load: " + (
                    entry.detail
                )
        return f"unknown {kind} {name!r}"

    def driver(self, name: str) -> DriverRecord:
        """The driver record registered under ``name``."""
        record = self.get(PluginKind.DRIVER, name).record
        assert isinstance(record, DriverRecord)
        return record

    def policy(self, name: str) -> PolicyRecord:
        """The policy record registered under ``name``."""
        record = self.get(PluginKind.POLICY, name).record
        assert isinstance(record, PolicyRecord)
        return record

    def sink(self, name: str) -> SinkRecord:
        """The sink record registered under ``name``."""
        record = self.get(PluginKind.SINK, name).record
        assert isinstance(record, SinkRecord)
        return record

    def health_source(self, name: str) -> HealthSourceRecord:
        """The health-source record registered under ``name``."""
        record = self.get(PluginKind.HEALTH_SOURCE, name).record
        assert isinstance(record, HealthSourceRecord)
        return record

    def importance_source(self, name: str) -> ImportanceSourceRecord:
        """The importance-source record registered under ``name``."""
        record = self.get(PluginKind.IMPORTANCE_SOURCE, name).record
        assert isinstance(record, ImportanceSourceRecord)
        return record


_FAILED: Any = object()


def _group_entry_points() -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


def _dist_name(entry_point: metadata.EntryPoint) -> str:
    dist = entry_point.dist
    return dist.name if dist is not None else "(unknown distribution)"


def _source_of(entry_point: metadata.EntryPoint) -> PluginSource:
    dist = entry_point.dist
    version = dist.version if dist is not None else "?"
    return PluginSource(entry_point.name, _dist_name(entry_point), version)


def load_plugins(
    config: Config | None = None,
    entry_points: Iterable[metadata.EntryPoint] | None = None,
) -> PluginRegistry:
    """A registry holding every installed plugin that the configuration allows."""
    config = config or Config()
    registry = PluginRegistry(config.plugins, config)
    registry.load_entry_points(entry_points)
    return registry
