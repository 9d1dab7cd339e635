"""What a model-loading policy is: the hooks the arbiter calls and the verbs it offers.

The arbiter owns the requests, the uid priorities and the time; a policy owns only its
own indices and decides. It never builds actions itself: it calls the context's verbs
(`grant`, `wait`, `refuse`, `ask_unload`, `cancel`), which change a request's state,
record the action and tell the policy about the change through `moved`/`untrack`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from npumanager.core.arbiter.actions import RequestKey, RequestState
from npumanager.core.arbiter.states import COMMITTED, HOLDING, PENDING, Step, allows
from npumanager.errors import PolicyParamsError
from npumanager.schemas import (
    ModelLoadRequest,
    ModelPolicy,
    PolicyRecord,
    ThermalSeverity,
    UnloadReason,
)

__all__ = [
    "COMMITTED",
    "HOLDING",
    "PENDING",
    "POLICY_NAMES",
    "Entry",
    "Policy",
    "PolicyContext",
    "Rank",
    "build_policy",
    "describe_params",
    "make_room",
    "policy_name",
    "validate_params",
]

Rank = tuple[int, int, int]
"""How a uid ranks, most important first: (priority, last completion ms, uid)."""


@dataclass(slots=True, eq=False)
class Entry:
    """The arbiter's record of one live request; policies read it and never write it."""

    key: RequestKey
    uid: int
    request: ModelLoadRequest
    weight_bytes: int | None
    seq: int
    """Arrival number: unique, increasing; orders a uid's requests."""
    state: RequestState = RequestState.NEW
    device: int | None = None
    unload_deadline_ms: int | None = None


class PolicyContext(Protocol):
    """The arbiter as a policy sees it."""

    @property
    def now_ms(self) -> int:
        """The time of the input being handled."""

    @property
    def memory_pressure(self) -> int:
        """0 none, 1 moderate, 2 critical."""

    @property
    def capacities(self) -> tuple[int, ...] | None:
        """Weight memory per device in bytes, once the driver reported it."""

    @property
    def thermal_max(self) -> ThermalSeverity:
        """The hottest device's severity."""

    def thermal(self, device: int) -> ThermalSeverity:
        """One device's thermal severity."""

    def uid_priority(self, uid: int) -> int:
        """The uid's priority, 0 the most important."""

    def rank(self, uid: int) -> Rank:
        """The uid's place in the order, most important first."""

    def entries(self) -> Iterable[Entry]:
        """Every live request, in arrival order."""

    def entries_of_uid(self, uid: int) -> Iterable[Entry]:
        """The uid's live requests, in arrival order."""

    def grant(self, entry: Entry, device: int | None = None) -> None:
        """Tell the request CAN_LOAD_NOW (on `device`)."""

    def wait(self, entry: Entry, device: int | None = None) -> None:
        """Tell the request WAIT_FOR_UNLOAD; it holds its share (on `device`)."""

    def refuse(self, entry: Entry) -> None:
        """Tell the request NOT_PRIORITIZED; it holds nothing."""

    def ask_unload(self, entry: Entry, reason: UnloadReason) -> None:
        """Ask a loaded request to unload; the grace period starts."""

    def cancel(self, entry: Entry) -> None:
        """End a request that has not loaded with CANCELLED."""

    def refresh_configs(self) -> None:
        """Relay the scheduling configs that `Policy.config_override` now changes."""


class Policy:
    """The base of every model-loading policy; the defaults track nothing and decide nothing.

    Subclasses implement `admit` at least. The hooks `track`, `untrack`, `moved` and
    `rank_changed` keep a policy's indices in step with the arbiter's requests.
    """

    name: str = "policy"
    params: BaseModel | None = None

    def __init__(self) -> None:
        self._ctx: PolicyContext | None = None

    @property
    def ctx(self) -> PolicyContext:
        """The arbiter this policy is attached to."""
        if self._ctx is None:
            raise RuntimeError(f"policy {self.name!r} is not attached to an arbiter")
        return self._ctx

    @property
    def attached(self) -> bool:
        """True while an arbiter uses this policy."""
        return self._ctx is not None

    def attach(self, ctx: PolicyContext) -> None:
        """Start serving `ctx`, taking over its live requests."""
        self._ctx = ctx
        for entry in ctx.entries():
            self.track(entry)

    def detach(self) -> None:
        """Stop serving; the policy forgets every request."""
        for entry in self.ctx.entries():
            self.untrack(entry)
        self._ctx = None

    def weight(self, entry: Entry) -> int:
        """What the request counts against the policy's limit (0 when there is none)."""
        return 0

    def track(self, entry: Entry) -> None:
        """A request is live (a new one in state NEW, or one taken over at attach)."""

    def untrack(self, entry: Entry) -> None:
        """A request ended; `entry.state` is the state it ended in."""

    def moved(self, entry: Entry, old_state: RequestState, old_device: int | None) -> None:
        """A request changed state or device."""

    def rank_changed(self, uid: int, old_rank: Rank) -> None:
        """A uid's priority or last completion changed."""

    def admit(self, entry: Entry) -> None:
        """Decide a new request (state NEW); it must leave that state."""
        raise NotImplementedError

    def reevaluate(self, cause: UnloadReason | None = None) -> None:
        """Bring the loads in line with the policy; `cause` overrides unload reasons."""

    def work_completed(self, uid: int) -> None:
        """The uid completed work (its rank already reflects it)."""

    def pressure_changed(self) -> None:
        """Thermal severity, memory pressure or device capacity changed."""

    def config_override(self, uid: int, priority: int) -> tuple[int, int, int] | None:
        """(app, min job, max job) priorities to relay for the uid instead of its own."""
        return None


def describe_params(model: type[BaseModel]) -> str:
    """Each key of a params model with what it allows, for error messages."""
    return "; ".join(
        f"{name}: {field.description or 'see the policy'}"
        for name, field in model.model_fields.items()
    )


def validate_params(
    policy: str, model: type[BaseModel] | None, params: Mapping[str, Any] | BaseModel | None
) -> BaseModel | None:
    """`params` as the policy's validated model, or `PolicyParamsError` saying what is allowed."""
    if model is None:
        if params:
            keys = ", ".join(sorted(params if isinstance(params, Mapping) else dict(params)))
            raise PolicyParamsError(f"policy {policy!r} takes no parameters; got {keys}")
        return None
    if isinstance(params, model):
        return params
    raw = params.model_dump() if isinstance(params, BaseModel) else dict(params or {})
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"][:1]) or "params"
            if error["type"] == "extra_forbidden":
                problems.append(f"unknown key {key!r}")
            else:
                problems.append(f"{key}: {error['msg']} (got {error['input']!r})")
        raise PolicyParamsError(
            f"policy {policy!r}: {'; '.join(problems)}. Allowed: {describe_params(model)}"
        ) from None


def build_policy(
    record: PolicyRecord, params: Mapping[str, Any] | BaseModel | None = None
) -> Policy:
    """A new policy object from its registration and raw parameters."""
    validated = validate_params(record.name, record.params_model, params)
    policy = record.factory(validated)
    if not isinstance(policy, Policy):
        raise TypeError(f"policy {record.name!r} factory returned {policy!r}, not a Policy")
    return policy


def make_room(
    ctx: PolicyContext, victims: Iterable[Entry], displace: Callable[[Entry], None]
) -> bool:
    """Free what `victims` hold for a new request; True if the caller must wait.

    Loaded victims are asked to unload, unloading ones are already going, the rest
    (not yet loaded) are displaced by `displace` (cancelled, or refused for later).
    """
    must_wait = False
    for other in victims:
        if allows(other.state, Step.ASK_UNLOAD):
            ctx.ask_unload(other, UnloadReason.HIGHER_PRIORITY_REQUEST)
            must_wait = True
        elif other.state is RequestState.UNLOADING:
            must_wait = True
        else:
            displace(other)
    return must_wait


POLICY_NAMES: dict[ModelPolicy, str] = {
    ModelPolicy.STATUS_QUO: "status_quo",
    ModelPolicy.TURN_TAKING: "turn_taking",
    ModelPolicy.BUDGET: "budget",
}
"""The platform's policy constants by the plugin name that implements each."""


def policy_name(policy: str | ModelPolicy | int) -> str:
    """The plugin name for a policy given by name or by the platform's constant."""
    if isinstance(policy, str):
        return policy.replace("-", "_")
    try:
        return POLICY_NAMES[ModelPolicy(policy)]
    except ValueError:
        allowed = ", ".join(f"{p.name}={p.value}" for p in ModelPolicy)
        raise PolicyParamsError(f"unknown policy {policy!r}; allowed: {allowed}") from None
