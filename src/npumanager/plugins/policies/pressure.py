"""Our own policy: real bytes per device, opportunistic loads, thermal and memory pressure.

Capacity is each device's weight memory in bytes (from the driver, else the params, else
`DEFAULT_DEVICE_CAPACITY_BYTES`); a request weighs the bytes its client gave, else the
nominal bytes of its size class. Requests rank as under `budget` (uid priority, least
recent completion, uid, arrival), except that opportunistic ones come after all others:
they get only spare room, never wait, and are the first asked to unload.

Pressure, per device for thermal and system-wide for memory:

- thermal MODERATE and above: only NORMAL-priority models may stay or load there;
  opportunistic, then background-priority models are asked to unload (THERMAL);
- thermal SEVERE and above on any device: uids at or over `background_priority` have
  their work held back (app priority and job range pushed to the least important);
- thermal CRITICAL and above: only uids at or under `foreground_priority` keep models;
- memory level 1: opportunistic models unload (MEMORY_PRESSURE); level 2: background too.

Requests that may not load are told NOT_PRIORITIZED and stay live: they load again when
the pressure passes. Re-evaluation walks the rank-ordered candidates until the devices
are full, so it costs up to the number of tracked requests while room is left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from itertools import chain
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict

from npumanager.core.arbiter.actions import RequestState
from npumanager.core.arbiter.policy import (
    COMMITTED,
    HOLDING,
    Entry,
    Policy,
    PolicyContext,
    Rank,
    make_room,
    validate_params,
)
from npumanager.schemas import (
    Importance,
    ModelPriority,
    ModelSize,
    ThermalSeverity,
    UnloadReason,
)
from npumanager.schemas.limits import (
    DEFAULT_DEVICE_CAPACITY_BYTES,
    MAX_DEVICES,
    MAX_PRIORITY,
    MEMORY_PRESSURE_CRITICAL,
    MEMORY_PRESSURE_MODERATE,
    MIN_PRIORITY,
    NOMINAL_MODEL_BYTES,
)
from npumanager.sortedlist import SortedKeys

PositiveInt = Annotated[int, Strict(), Field(gt=0)]
PriorityInt = Annotated[int, Strict(), Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)]
Key = tuple[bool, int, int, int, int]
"""(opportunistic, priority, last completion, uid, arrival): the place of a candidate."""
_HELD_BACK = (MAX_PRIORITY, MAX_PRIORITY, MAX_PRIORITY)


class PressureParams(BaseModel):
    """Parameters of the `pressure` policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    capacity_bytes: (
        Annotated[tuple[PositiveInt, ...], Field(min_length=1, max_length=MAX_DEVICES)] | None
    ) = Field(
        default=None,
        description=(
            f"weight memory per device in bytes, 1..{MAX_DEVICES} positive ints, used until "
            f"the driver reports its own (default {list(DEFAULT_DEVICE_CAPACITY_BYTES)})"
        ),
    )
    nominal_bytes: Annotated[
        tuple[PositiveInt, ...], Field(min_length=len(ModelSize), max_length=len(ModelSize))
    ] = Field(
        default=NOMINAL_MODEL_BYTES,
        description=(
            "3 positive ints, the bytes counted per size class for a request that gave no "
            f"size (default {list(NOMINAL_MODEL_BYTES)})"
        ),
    )
    foreground_priority: PriorityInt = Field(
        default=int(Importance.FOREGROUND_SERVICE),
        description=(
            f"uids at or under this priority keep models at CRITICAL temperature "
            f"({MIN_PRIORITY}..{MAX_PRIORITY}, default {int(Importance.FOREGROUND_SERVICE)})"
        ),
    )
    background_priority: PriorityInt = Field(
        default=int(Importance.SERVICE),
        description=(
            f"uids at or over this priority are held back at SEVERE temperature "
            f"({MIN_PRIORITY}..{MAX_PRIORITY}, default {int(Importance.SERVICE)})"
        ),
    )


def _opportunistic(entry: Entry) -> bool:
    return entry.request.priority is ModelPriority.OPPORTUNISTIC


def _device_of(entry: Entry) -> int:
    return 0 if entry.device is None else entry.device


class PressurePolicy(Policy):
    """Capacity in bytes per device, placement, opportunistic loads and pressure rules."""

    name = "pressure"

    def __init__(self, params: PressureParams | None = None) -> None:
        super().__init__()
        self.params: PressureParams = params or PressureParams()
        self._nominal = self.params.nominal_bytes
        self._entries: dict[int, Entry] = {}
        self._keys: dict[int, Key] = {}
        self._candidates: SortedKeys[Key] = SortedKeys()
        self._held: dict[int, Entry] = {}
        self._held_on: Counter[int] = Counter()
        self._committed_on: Counter[int] = Counter()
        self._held_back = False

    def capacities(self) -> tuple[int, ...]:
        """Bytes per device in force: the driver's, else the params', else the default."""
        return self.ctx.capacities or self.params.capacity_bytes or DEFAULT_DEVICE_CAPACITY_BYTES

    def committed_bytes(self, device: int) -> int:
        """Bytes of granted, loaded and unloading requests on the device."""
        return self._committed_on[device]

    def weight(self, entry: Entry) -> int:
        """The bytes the client gave, else the nominal bytes of its size class."""
        if entry.weight_bytes is not None:
            return entry.weight_bytes
        return self._nominal[entry.request.size]

    def attach(self, ctx: PolicyContext) -> None:
        """Take over the live requests and the current thermal state."""
        super().attach(ctx)
        self._held_back = ctx.thermal_max >= ThermalSeverity.SEVERE

    def config_override(self, uid: int, priority: int) -> tuple[int, int, int] | None:
        """At SEVERE, background uids' work runs last whatever its job priority."""
        if self._held_back and priority >= self.params.background_priority:
            return _HELD_BACK
        return None

    # ---------------------------------------------------------------- indices

    def track(self, entry: Entry) -> None:
        """Index a live request."""
        self._entries[entry.seq] = entry
        self._enter(entry, entry.state, _device_of(entry), index=True)

    def untrack(self, entry: Entry) -> None:
        """Forget an ended request."""
        self._leave(entry, entry.state, _device_of(entry), index=True)
        del self._entries[entry.seq]

    def moved(self, entry: Entry, old_state: RequestState, old_device: int | None) -> None:
        """Follow a change of state or device."""
        old = 0 if old_device is None else old_device
        new = _device_of(entry)
        if old_state is entry.state and old == new:
            return
        index = (old_state is RequestState.UNLOADING) != (entry.state is RequestState.UNLOADING)
        self._leave(entry, old_state, old, index=index)
        self._enter(entry, entry.state, new, index=index)

    def rank_changed(self, uid: int, old_rank: Rank) -> None:
        """Re-key the uid's candidates."""
        rank = self.ctx.rank(uid)
        for entry in self.ctx.entries_of_uid(uid):
            old_key = self._keys.get(entry.seq)
            if old_key is not None:
                key = (old_key[0], *rank, entry.seq)
                self._keys[entry.seq] = key
                self._candidates.remove(old_key)
                self._candidates.add(key)

    def _enter(self, entry: Entry, state: RequestState, device: int, *, index: bool) -> None:
        if index and state is not RequestState.UNLOADING:
            key = (_opportunistic(entry), *self.ctx.rank(entry.uid), entry.seq)
            self._keys[entry.seq] = key
            self._candidates.add(key)
        if state in HOLDING:
            self._held[entry.seq] = entry
            self._held_on[device] += self.weight(entry)
            if state in COMMITTED:
                self._committed_on[device] += self.weight(entry)

    def _leave(self, entry: Entry, state: RequestState, device: int, *, index: bool) -> None:
        if index and state is not RequestState.UNLOADING:
            self._candidates.remove(self._keys.pop(entry.seq))
        if state in HOLDING:
            del self._held[entry.seq]
            self._held_on[device] -= self.weight(entry)
            if state in COMMITTED:
                self._committed_on[device] -= self.weight(entry)

    # -------------------------------------------------------------- decisions

    def _blocked(self, entry: Entry, device: int) -> UnloadReason | None:
        """Why the request may not hold a model on the device now, or None."""
        ctx = self.ctx
        severity = ctx.thermal(device)
        priority = entry.request.priority
        if severity >= ThermalSeverity.MODERATE and priority is not ModelPriority.NORMAL:
            return UnloadReason.THERMAL
        if (
            severity >= ThermalSeverity.CRITICAL
            and ctx.uid_priority(entry.uid) > self.params.foreground_priority
        ):
            return UnloadReason.THERMAL
        memory = ctx.memory_pressure
        if memory >= MEMORY_PRESSURE_MODERATE and priority is ModelPriority.OPPORTUNISTIC:
            return UnloadReason.MEMORY_PRESSURE
        if memory >= MEMORY_PRESSURE_CRITICAL and priority is ModelPriority.BACKGROUND:
            return UnloadReason.MEMORY_PRESSURE
        return None

    def _rank_key(self, entry: Entry) -> tuple[Rank, int]:
        return (self.ctx.rank(entry.uid), entry.seq)

    def admit(self, entry: Entry) -> None:
        """Place it where it fits; else make room from opportunistic and lesser loads."""
        ctx, caps = self.ctx, self.capacities()
        weight = self.weight(entry)
        devices = [
            d for d in range(len(caps)) if weight <= caps[d] and self._blocked(entry, d) is None
        ]
        fitting = [d for d in devices if self._held_on[d] + weight <= caps[d]]
        if fitting:
            ctx.grant(entry, min(fitting, key=lambda d: (caps[d] - self._held_on[d], d)))
            return
        if not devices or _opportunistic(entry):
            ctx.refuse(entry)
            return
        best: tuple[int, list[Entry]] | None = None
        for device in devices:
            victims = self._victims(entry, device, self._held_on[device] + weight - caps[device])
            if victims is not None and (best is None or len(victims) < len(best[1])):
                best = (device, victims)
        if best is None:
            ctx.refuse(entry)
            return
        device, victims = best
        if make_room(ctx, victims, ctx.refuse):
            ctx.wait(entry, device)
        else:
            ctx.grant(entry, device)

    def _victims(self, entry: Entry, device: int, needed: int) -> list[Entry] | None:
        """Holders on the device to free `needed` bytes: unloading, opportunistic, lesser."""
        priority, last, uid = self.ctx.rank(entry.uid)
        unloading, opportunistic, lesser = [], [], []
        for other in self._held.values():
            if other is entry or _device_of(other) != device:
                continue
            if other.state is RequestState.UNLOADING:
                unloading.append(other)
            elif _opportunistic(other):
                opportunistic.append(other)
            elif other.uid != uid:
                other_priority, other_last, _ = self.ctx.rank(other.uid)
                if other_priority > priority or (other_priority == priority and last < other_last):
                    lesser.append(other)
        opportunistic.sort(key=self._rank_key, reverse=True)
        lesser.sort(key=self._rank_key, reverse=True)
        victims = []
        for other in chain(unloading, opportunistic, lesser):
            victims.append(other)
            needed -= self.weight(other)
            if needed <= 0:
                return victims
        return None

    def reevaluate(self, cause: UnloadReason | None = None) -> None:
        """Choose the loads that should hold room, then unload, refuse and grant to match."""
        ctx, caps = self.ctx, self.capacities()
        chosen = self._choose(caps)
        outside = [
            h
            for h in self._held.values()
            if h.state is not RequestState.UNLOADING and h.seq not in chosen
        ]
        outside.sort(key=lambda h: (h.request.priority, ctx.rank(h.uid), h.seq), reverse=True)
        for other in outside:
            if other.state is RequestState.LOADED:
                ctx.ask_unload(other, cause or self._reason(other, caps))
            else:
                ctx.refuse(other)
        for seq, device in chosen.items():
            entry = self._entries[seq]
            if entry.state is RequestState.LOADED or entry.state is RequestState.GRANTED:
                continue
            if self._committed_on[device] + self.weight(entry) <= caps[device]:
                ctx.grant(entry, device)
            elif _opportunistic(entry):
                ctx.refuse(entry)
            else:
                ctx.wait(entry, device)

    def _choose(self, caps: tuple[int, ...]) -> dict[int, int]:
        """The ideal placement, arrival number -> device, in rank order."""
        room = list(caps)
        left = sum(room)
        chosen: dict[int, int] = {}
        for key in self._candidates:
            if left <= 0:
                break
            entry = self._entries[key[-1]]
            weight = self.weight(entry)
            if entry.state is not RequestState.NOT_PRIORITIZED:
                device = _device_of(entry)
                if (
                    device < len(room)
                    and room[device] >= weight
                    and self._blocked(entry, device) is None
                ):
                    chosen[entry.seq] = device
                    room[device] -= weight
                    left -= weight
                    continue
                if entry.state is not RequestState.WAITING:
                    continue
            best: tuple[bool, int, int] | None = None
            for device, free in enumerate(room):
                if free >= weight and self._blocked(entry, device) is None:
                    preference = (self._held_on[device] + weight > caps[device], free, device)
                    if best is None or preference < best:
                        best = preference
            if best is not None:
                device = best[2]
                chosen[entry.seq] = device
                room[device] -= weight
                left -= weight
        return chosen

    def _reason(self, entry: Entry, caps: tuple[int, ...]) -> UnloadReason:
        device = _device_of(entry)
        blocked = self._blocked(entry, device) if device < len(caps) else None
        return blocked or UnloadReason.HIGHER_PRIORITY_REQUEST

    def pressure_changed(self) -> None:
        """Relay held-back priorities if SEVERE began or ended, then re-evaluate."""
        held_back = self.ctx.thermal_max >= ThermalSeverity.SEVERE
        if held_back is not self._held_back:
            self._held_back = held_back
            self.ctx.refresh_configs()
        self.reevaluate()


def pressure(params: PressureParams | Mapping[str, Any] | None) -> PressurePolicy:
    """The `pressure` policy from its parameters (validated here if they are not yet)."""
    validated = validate_params("pressure", PressureParams, params)
    assert isinstance(validated, PressureParams)
    return PressurePolicy(validated)
