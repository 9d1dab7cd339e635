"""Each app's importance in the daemon, and where it came from.

In order, the first that has one decides: an administrator's pin of the app id
(`set-importance APP_ID`), a pin of the app's real uid (`set-importance UID`, every app of
that uid), then the importance sources in the order they were configured
(`serve --importance`), then nobody: the importance of a uid never ranked. The winner is
told to the service under the app's HAL uid, and from there reaches the arbiter and the
configs relayed to the driver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from npumanager.apps.registry import App, AppRegistry
from npumanager.checks import check_int
from npumanager.schemas import Importance
from npumanager.schemas.limits import MAX_PRIORITY, MIN_PRIORITY, UNKNOWN_UID_PRIORITY

PINNED_APP = "pinned app"
PINNED_UID = "pinned uid"
NO_SOURCE = "none"
"""The `importance_source` of an app nothing ranks (its importance: a uid never ranked)."""


class AppImportance:
    """Pins and sources' opinions by app id, combined per app and applied by HAL uid."""

    def __init__(
        self,
        apps: AppRegistry,
        apply: Callable[[int, int], None],
        sources: Sequence[str] = (),
    ) -> None:
        self.apps = apps
        self._apply = apply
        self._sources = tuple(sources)
        self._lock = threading.Lock()
        self._app_pins: dict[str, int] = {}
        self._uid_pins: dict[int, int] = {}
        self._opinions: dict[str, dict[str, int]] = {name: {} for name in self._sources}

    def pin_app(self, app_id: str, importance: int | None) -> list[App]:
        """Pin (None: unpin) every app of this id, now and later; the apps it touched."""
        self._check(importance)
        with self._lock:
            if importance is None:
                self._app_pins.pop(app_id, None)
            else:
                self._app_pins[app_id] = importance
        return self._refresh(self.apps.find(app_id))

    def pin_uid(self, uid: int, importance: int | None) -> list[App]:
        """Pin (None: unpin) every app of a real uid, and the uid itself as a HAL uid."""
        self._check(importance)
        apps = [app for app in self.apps.apps() if app.uid == uid]
        if not any(app.hal_uid == uid for app in apps):  # as before apps: the uid itself
            self._set(uid, UNKNOWN_UID_PRIORITY if importance is None else importance)
        with self._lock:
            if importance is None:
                self._uid_pins.pop(uid, None)
            else:
                self._uid_pins[uid] = importance
        return self._refresh(apps)

    def _check(self, importance: int | None) -> None:
        if importance is not None:
            check_int("importance", importance, MIN_PRIORITY, MAX_PRIORITY)

    def opinion(self, source: str, app_id: str, importance: int | None) -> list[App]:
        """A source's opinion of an app id changed (None: it has none)."""
        with self._lock:
            opinions = self._opinions[source]
            if importance is None:
                opinions.pop(app_id, None)
            else:
                opinions[app_id] = importance
        return self._refresh(self.apps.find(app_id))

    def joined(self, app: App) -> None:
        """An app's process said hello: it gets its importance now if anything ranks it."""
        importance, source = self.effective(app)
        if source != NO_SOURCE:
            self._set(app.hal_uid, importance)

    def effective(self, app: App) -> tuple[int, str]:
        """The app's importance and what decided it."""
        with self._lock:
            if app.app_id in self._app_pins:
                return self._app_pins[app.app_id], PINNED_APP
            if app.uid in self._uid_pins:
                return self._uid_pins[app.uid], PINNED_UID
            for name in self._sources:
                found = self._opinions[name].get(app.app_id)
                if found is not None:
                    return found, name
        return UNKNOWN_UID_PRIORITY, NO_SOURCE

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
            self._set(app.hal_uid, self.effective(app)[0])
        return refreshed

    def _set(self, hal_uid: int, importance: int) -> None:
        self._apply(hal_uid, importance)
