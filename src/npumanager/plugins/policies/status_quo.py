"""The platform's default policy: every request may load at once, nothing is ever unloaded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npumanager.core.arbiter.actions import RequestState
from npumanager.core.arbiter.policy import PENDING, Entry, Policy, validate_params
from npumanager.schemas import UnloadReason


class StatusQuoPolicy(Policy):
    """Grant every request at once; never ask for an unload.

    Requests still waiting or refused when this policy takes over from another are
    granted at its first re-evaluation.
    """

    name = "status_quo"

    def __init__(self) -> None:
        super().__init__()
        self._pending: dict[int, Entry] = {}

    def track(self, entry: Entry) -> None:
        """Remember a request that still waits for its grant."""
        if entry.state in PENDING:
            self._pending[entry.seq] = entry

    def untrack(self, entry: Entry) -> None:
        """Forget an ended request."""
        self._pending.pop(entry.seq, None)

    def moved(self, entry: Entry, old_state: RequestState, old_device: int | None) -> None:
        """Keep the waiting set current."""
        if entry.state in PENDING:
            self._pending[entry.seq] = entry
        else:
            self._pending.pop(entry.seq, None)

    def admit(self, entry: Entry) -> None:
        """CAN_LOAD_NOW."""
        self.ctx.grant(entry)

    def reevaluate(self, cause: UnloadReason | None = None) -> None:
        """Grant whatever another policy left waiting, in arrival order."""
        for seq in sorted(self._pending):
            self.ctx.grant(self._pending[seq])


def status_quo(params: Mapping[str, Any] | None) -> StatusQuoPolicy:
    """The `status_quo` policy; it takes no parameters."""
    validate_params("status_quo", None, params)
    return StatusQuoPolicy()
