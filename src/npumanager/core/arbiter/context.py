"""The arbiter as its policy sees it: the conditions, the requests, and the verbs.

`ArbiterContext` is the `PolicyContext` the arbiter attaches its policy to. Its queries
read what the arbiter was last told (`Conditions`) and the uids' ranks; its verbs move
requests through the `Ledger`, which follows the state table and records the actions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from npumanager.core.arbiter.ledger import Ledger
from npumanager.core.arbiter.policy import Entry, Rank
from npumanager.core.arbiter.states import Step
from npumanager.core.arbiter.uids import UidTable
from npumanager.schemas import ThermalSeverity, UnloadReason
from npumanager.schemas.limits import MEMORY_PRESSURE_NONE


@dataclass
class Conditions:
    """What the arbiter was last told: the input's time, memory pressure, devices' state."""

    now_ms: int = 0
    memory_pressure: int = MEMORY_PRESSURE_NONE
    capacities: tuple[int, ...] | None = None
    thermal: dict[int, ThermalSeverity] = field(default_factory=dict)
    thermal_max: ThermalSeverity = ThermalSeverity.NONE


class ArbiterContext:
    """Queries and verbs for the policy; verbs record actions, nothing else calls out."""

    __slots__ = ("_conditions", "_grace_ms", "_ledger", "_uids")

    def __init__(
        self, ledger: Ledger, conditions: Conditions, uids: UidTable, unload_grace_ms: int
    ) -> None:
        self._ledger = ledger
        self._conditions = conditions
        self._uids = uids
        self._grace_ms = unload_grace_ms

    @property
    def now_ms(self) -> int:
        """The time of the input being handled."""
        return self._conditions.now_ms

    @property
    def memory_pressure(self) -> int:
        """0 none, 1 moderate, 2 critical."""
        return self._conditions.memory_pressure

    @property
    def capacities(self) -> tuple[int, ...] | None:
        """Weight memory per device, once reported."""
        return self._conditions.capacities

    @property
    def thermal_max(self) -> ThermalSeverity:
        """The hottest device's severity."""
        return self._conditions.thermal_max

    def thermal(self, device: int) -> ThermalSeverity:
        """One device's thermal severity."""
        return self._conditions.thermal.get(device, ThermalSeverity.NONE)

    def uid_priority(self, uid: int) -> int:
        """The uid's priority."""
        return self._uids.uid_priority(uid)

    def rank(self, uid: int) -> Rank:
        """(priority, last completion ms, uid)."""
        return self._uids.rank(uid)

    def entries(self) -> Iterable[Entry]:
        """Every live request, in arrival order."""
        return self._ledger.entries.values()

    def entries_of_uid(self, uid: int) -> Iterable[Entry]:
        """The uid's live requests, in arrival order."""
        return self._ledger.by_uid.get(uid, {}).values()

    def grant(self, entry: Entry, device: int | None = None) -> None:
        """Tell the request CAN_LOAD_NOW."""
        self._ledger.grant(entry, device)

    def wait(self, entry: Entry, device: int | None = None) -> None:
        """Tell the request WAIT_FOR_UNLOAD; a waiting one only moves its reservation."""
        self._ledger.wait(entry, device)

    def refuse(self, entry: Entry) -> None:
        """Tell the request NOT_PRIORITIZED."""
        self._ledger.refuse(entry)

    def ask_unload(self, entry: Entry, reason: UnloadReason) -> None:
        """Ask a loaded request to unload; it is revoked if still unloading at the deadline."""
        self._ledger.ask_unload(entry, reason, self._conditions.now_ms + self._grace_ms)

    def cancel(self, entry: Entry) -> None:
        """End the request with CANCELLED."""
        self._ledger.end(entry, Step.CANCEL)

    def refresh_configs(self) -> None:
        """Relay every known uid's config that differs from what was last relayed."""
        uids = self._uids
        relay = uids.relay(sorted(uids.known_uids()), self._ledger.policy)
        if relay is not None:
            self._ledger.out.append(relay)
