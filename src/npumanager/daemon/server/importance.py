"""Each app's importance in the daemon, and where it came from.

The order is `core.plugins.importance_combine`'s: an administrator's pin of the app id
(`set-importance APP_ID`), a pin of the app's real uid (`set-importance UID`, every app of
that uid), then the importance sources in the order they were configured
(`serve --importance`), then nobody: the importance of a uid never ranked. The winner is
told to the service under the app's HAL uid, and from there reaches the arbiter and the
configs relayed to the driver. Everything here runs on the daemon's loop; a source's
changes are posted there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from npumanager.apps.registry import App, AppRegistry
from npumanager.core.plugins.importance import ImportanceSource
from npumanager.core.plugins.importance_combine import (
    PINNED_APP,
    PINNED_UID,
    ImportanceCombiner,
)
from npumanager.schemas import Importance
from npumanager.schemas.limits import UNKNOWN_UID_PRIORITY

log = logging.getLogger(__name__)

NO_SOURCE = "none"
"""The `importance_source` of an app nothing ranks (its importance: a uid never ranked)."""

__all__ = ["NO_SOURCE", "PINNED_APP", "PINNED_UID", "AppImportance"]


class AppImportance:
    """Pins and sources' opinions by app id, combined per app and applied by HAL uid."""

    def __init__(
        self,
        apps: AppRegistry,
        apply: Callable[[int, int], None],
        sources: Sequence[tuple[str, ImportanceSource]] = (),
    ) -> None:
        self.apps = apps
        self._apply = apply
        self._sources = list(sources)
        self._combiner = ImportanceCombiner([name for name, _ in self._sources])

    @property
    def source_names(self) -> list[str]:
        """The sources, in the order they are asked."""
        return [name for name, _ in self._sources]

    def start(self, post: Callable[[Callable[[], None]], None]) -> None:
        """Start every source; each change it reports is applied on the loop (`post`)."""
        for name, source in self._sources:

            def changed(app_id: str, importance: Importance | None, name: str = name) -> None:
                def on_the_loop() -> None:
                    self.opinion(name, app_id, importance)

                post(on_the_loop)

            source.start(changed)

    def close(self) -> None:
        """Stop every source."""
        for name, source in self._sources:
            try:
                source.close()
            except Exception as exc:  # a third party's: one line, the daemon stops anyway
                log.warning("importance source %r did not close cleanly: %s", name, exc)

    def pin_app(self, app_id: str, importance: int | None) -> list[App]:
        """Pin (None: unpin) every app of this id, now and later; the apps it touched."""
        self._combiner.pin_app(app_id, importance)
        return self._refresh(self.apps.find(app_id))

    def pin_uid(self, uid: int, importance: int | None) -> list[App]:
        """Pin (None: unpin) every app of a real uid, and the uid itself as a HAL uid."""
        self._combiner.pin_uid(uid, importance)
        apps = [app for app in self.apps.apps() if app.uid == uid]
        if not any(app.hal_uid == uid for app in apps):  # as before apps: the uid itself
            self._apply(uid, UNKNOWN_UID_PRIORITY if importance is None else importance)
        return self._refresh(apps)

    def opinion(self, source: str, app_id: str, importance: int | None) -> list[App]:
        """A source's opinion of an app id changed (None: it has none)."""
        if not self._combiner.opinion(source, app_id, importance):
            return []
        return self._refresh(self.apps.find(app_id))

    def joined(self, app: App) -> None:
        """An app's process said hello: every source is asked about it, and it gets its
        importance now if anything ranks it."""
        for name, source in self._sources:
            try:
                found = source.importance(app)
            except Exception as exc:  # a third party's bug costs its opinion, not the hello
                log.warning("importance source %r failed on app %r: %s", name, app.app_id, exc)
                found = None
            self._combiner.opinion(name, app.app_id, found)
        importance, decided_by = self.effective(app)
        if decided_by != NO_SOURCE:
            self._apply(app.hal_uid, importance)

    def effective(self, app: App) -> tuple[int, str]:
        """The app's importance and what decided it."""
        found = self._combiner.effective(app.app_id, app.uid)
        return (UNKNOWN_UID_PRIORITY, NO_SOURCE) if found is None else found

    def describe(self, app: App) -> dict[str, Any]:
        """For `info` and `npu-manager apps`: who the app is, its importance and its source."""
        importance, source = self.effective(app)
        named = importance in Importance._value2member_map_ and source != NO_SOURCE
        return {
            "app_id": app.app_id,
            "kind": app.kind,
            "uid": app.uid,
            "hal_uid": app.hal_uid,
            "importance": Importance(importance).name if named else None,
            "importance_value": None if source == NO_SOURCE else importance,
            "importance_source": source,
            "pids": sorted(app.pids),
            "cgroup": app.cgroup,
            "slice": app.slice,
        }

    def _refresh(self, apps: Iterable[App]) -> list[App]:
        refreshed = list(apps)
        for app in refreshed:
            self._apply(app.hal_uid, self.effective(app)[0])
        return refreshed
