"""Importance sources: the contract of a source that ranks apps, and building one by name.

An importance source (a plugin, see
`~npumanager.core.plugins.hookspecs.npumanager_register_importance_sources`) says how
important an app is, as the platform's activity manager would: an `~npumanager.Importance`,
or no opinion (None). It is asked when an app appears (``importance(app)``) and reports a change
of its own (focus moved, time passed) by calling back ``changed(app_id, importance)`` from a
thread of its own. Which source wins is `importance_combine`'s business.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import BeforeValidator

from npumanager.checks import validate_options
from npumanager.core.plugins.registry import PluginRegistry
from npumanager.errors import IllegalArgumentError, NpuManagerError
from npumanager.schemas import Importance, ImportanceSourceRecord

ImportanceCallback = Callable[[str, Importance | None], None]
"""``changed(app_id, importance)``: a source's opinion of an app id changed (None: it has none
any more)."""


class AppView(Protocol):
    """What a source is told of an app: its id and where its cgroup is (both
    `npumanager.apps.identity.AppIdentity` and the daemon's apps have these)."""

    @property
    def app_id(self) -> str:
        """The app id, from the cgroup's unit name."""

    @property
    def cgroup(self) -> str | None:
        """The cgroup v2 path of the app's own unit, if known."""

    @property
    def slice(self) -> str | None:
        """The outermost slice between the app's unit and its systemd manager, if any."""


@runtime_checkable
class ImportanceSource(Protocol):
    """What every importance source has (see the hook's documentation)."""

    def start(self, changed: ImportanceCallback) -> None:
        """Begin watching; report every later change of an opinion through ``changed``."""

    def importance(self, app: AppView) -> Importance | None:
        """The source's opinion of the app now, or None; cheap and thread-safe."""

    def close(self) -> None:
        """Stop watching; ``changed`` is not called any more once this returns."""


ImportanceSpec = str | tuple[str, Mapping[str, Any]] | ImportanceSource
"""How a source is named: a registered name, a name with options, or an object."""


def importance_named(what: str, name: object) -> Importance:
    """The `~npumanager.Importance` called ``name`` (``"FOREGROUND"``, any case), or
    `~npumanager.IllegalArgumentError` listing the names allowed; ``what`` says where the name
    was given."""
    try:
        return _by_name(name)
    except ValueError as error:
        raise IllegalArgumentError(f"{what}: {error}") from None


def _by_name(name: object) -> Importance:
    if isinstance(name, Importance):
        return name
    if isinstance(name, str) and name.upper() in Importance.__members__:
        return Importance[name.upper()]
    allowed = ", ".join(Importance.__members__)
    raise ValueError(f"{name!r} is not an importance; allowed: {allowed}")


ImportanceName = Annotated[Importance, BeforeValidator(_by_name)]
"""An option that is an `~npumanager.Importance`, given by its name in any case (``CACHED``,
``cached``): use it in a source's ``options_model``."""


def build_importance_source(
    registry: PluginRegistry, spec: ImportanceSpec
) -> tuple[str, ImportanceSource]:
    """The source's name and object: a registered one built with its options, or an object.

    Options are checked against the record's ``options_model`` where it has one: an unknown
    option or a bad value is an `~npumanager.IllegalArgumentError` of one line naming the
    allowed ones.
    The source is built, not started."""
    if isinstance(spec, str):
        spec = (spec, {})
    if isinstance(spec, tuple):
        name, options = spec
        record = registry.importance_source(name)
        try:
            made = _make(record, dict(options))
        except NpuManagerError:
            raise
        except Exception as exc:
            raise IllegalArgumentError(
                f"importance source {name!r} did not start: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(made, ImportanceSource):
            raise IllegalArgumentError(
                f"importance source {name!r} built an object without start(), importance() "
                "and close()"
            )
        return name, made
    if not isinstance(spec, ImportanceSource):
        raise IllegalArgumentError(
            "an importance source is a registered name, (name, options) or an object with "
            f"start(), importance() and close(); got {type(spec).__name__}"
        )
    return type(spec).__name__, spec


def _make(record: ImportanceSourceRecord, options: dict[str, Any]) -> Any:
    model = record.options_model
    if model is None:
        return record.factory(**options)
    return record.factory(validate_options(f"importance source {record.name!r}", model, options))


class Opinions:
    """A source's opinions by app id, thread-safe, calling back each change once: a helper
    for sources that learn of apps on their own (the built-in ``desktop`` uses it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_app: dict[str, Importance] = {}
        self._changed: ImportanceCallback | None = None

    def start(self, changed: ImportanceCallback) -> None:
        """From now on, report changes to ``changed`` (what is known already, at once)."""
        with self._lock:
            self._changed = changed
            known = dict(self._by_app)
        for app_id, importance in known.items():
            changed(app_id, importance)

    def stop(self) -> None:
        """Report nothing more."""
        with self._lock:
            self._changed = None

    def get(self, app_id: str) -> Importance | None:
        """The opinion of that app id, or None."""
        with self._lock:
            return self._by_app.get(app_id)

    def snapshot(self) -> dict[str, Importance]:
        """Every opinion held now, by app id."""
        with self._lock:
            return dict(self._by_app)

    def set(self, app_id: str, importance: Importance | None) -> bool:
        """Hold this opinion of the app id (None: none); True, and a call back, if it changed.

        Called from one thread (the source's), so changes are reported in the order made."""
        with self._lock:
            if self._by_app.get(app_id) == importance:
                return False
            if importance is None:
                del self._by_app[app_id]
            else:
                self._by_app[app_id] = importance
            changed = self._changed
        if changed is not None:
            changed(app_id, importance)
        return True
