"""The ``slices`` importance source: where systemd put an app says how much it matters.

systemd's desktop-environment conventions sort a user's units into three slices of the user
manager, and an app's slice (the outermost one between its unit and its systemd manager,
`npumanager.apps.identity.AppIdentity.slice`) gives an opinion:

- ``background.slice`` holds work the user does not wait for (indexers, backups, updates):
  ``CACHED`` (option ``background``), the first to give way;
- ``session.slice`` holds the session's essential services (the compositor, audio, input
  methods): ``FOREGROUND_SERVICE`` (option ``session``), because such a service (noise
  suppression, live captions) serves whatever the user does in front, so it ranks just
  below the focused app and above every app that lost the focus;
- ``app.slice`` holds every app, focused or not: the slice says nothing about which one
  matters, so no opinion (option ``app``), leaving it to ``desktop``, ``rules`` and the uid.

Each option takes an importance name or ``none``. A unit cannot change its slice while it
runs, so the source never calls back: it answers when asked.
"""

from __future__ import annotations

from npumanager.core.plugins.importance import AppView, ImportanceCallback
from npumanager.plugins.importance.options import SlicesOptions
from npumanager.schemas import Importance


class SlicesSource:
    """Answers from the app's slice alone (see the module)."""

    def __init__(self, options: SlicesOptions | None = None) -> None:
        options = options or SlicesOptions()
        self.by_slice: dict[str, Importance | None] = {
            "background.slice": options.background,
            "session.slice": options.session,
            "app.slice": options.app,
        }

    def importance(self, app: AppView) -> Importance | None:
        """The importance of the app's slice, or None (no slice, or one without)."""
        return self.by_slice.get(app.slice) if app.slice is not None else None

    def start(self, changed: ImportanceCallback) -> None:
        """Nothing to watch: a unit keeps its slice."""

    def close(self) -> None:
        """Nothing to stop."""


def slices(options: SlicesOptions) -> SlicesSource:
    """The ``slices`` source from its validated options."""
    return SlicesSource(options)
