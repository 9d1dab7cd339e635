"""Each app's share of a turn of the daemon's loop, across all of its connections.

A turn gives every app one slice, `FRAMES_PER_TURN` frames or `TURN_SLICE_S`, however
many connections it opened: an app that floods on forty connections has the loop's time
of one, and another app's control frames wait for one slice of it, not forty. Before
hello a connection counts with its uid's other unnamed connections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npumanager.schemas.limits import FRAMES_PER_TURN, TURN_SLICE_S

if TYPE_CHECKING:
    from npumanager.daemon.server.connection import Connection

ShareKey = tuple[int, str | None]
"""Whose share a connection's frames come out of: its peer's uid and its app's id."""


def share_key(connection: Connection) -> ShareKey:
    """The app a connection's frames are charged to (its uid alone until hello)."""
    app = connection.app
    return connection.peer.uid, None if app is None else app.app_id


class LoopShares:
    """What each app has used of the current turn: frames handled and seconds spent."""

    def __init__(self) -> None:
        self._frames: dict[ShareKey, int] = {}
        self._seconds: dict[ShareKey, float] = {}

    def new_turn(self) -> None:
        """A turn of the loop begins: every app's slice is whole again."""
        self._frames.clear()
        self._seconds.clear()

    def left(self, key: ShareKey) -> tuple[int, float]:
        """The frames and seconds the app may still take this turn."""
        return (
            FRAMES_PER_TURN - self._frames.get(key, 0),
            TURN_SLICE_S - self._seconds.get(key, 0.0),
        )

    def has_left(self, key: ShareKey) -> bool:
        """Whether the app may take another frame this turn."""
        return (
            self._frames.get(key, 0) < FRAMES_PER_TURN
            and self._seconds.get(key, 0.0) < TURN_SLICE_S
        )

    def charge(self, key: ShareKey, frames: int, seconds: float) -> None:
        """The app's connection used `frames` frames and `seconds` of the turn."""
        self._frames[key] = self._frames.get(key, 0) + frames
        self._seconds[key] = self._seconds.get(key, 0.0) + seconds
