"""What the arbiter knows of each uid: its priority, last completion, access, relayed config.

A uid's priority is its process importance (pinned for root and the system uid, the least
important for a uid never ranked); with the policy's override and the access flags it
makes the `SchedulingConfig` the driver is told. `UidTable` remembers the last config
relayed for each uid, so only changes are relayed again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from npumanager.core.arbiter.actions import RelayConfigs
from npumanager.core.arbiter.policy import Policy, Rank
from npumanager.schemas import SchedulingConfig
from npumanager.schemas.limits import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    PINNED_PRIORITY,
    ROOT_UID,
    SYSTEM_UID,
    UNKNOWN_UID_PRIORITY,
)

PINNED = frozenset({ROOT_UID, SYSTEM_UID})
"""Uids whose priority and access no input changes."""


class UidTable:
    """Priorities, completion times and access overrides by uid, and the configs relayed."""

    def __init__(self, attribution_uids: frozenset[int]) -> None:
        self.attribution_uids = attribution_uids
        self.priority: dict[int, int] = {}
        self.last_completed: dict[int, int] = {}
        self.access: dict[int, tuple[bool, bool]] = {}
        self.configs: dict[int, SchedulingConfig] = {}

    def uid_priority(self, uid: int) -> int:
        """The uid's priority: pinned for root and system, 1000 for uids never ranked."""
        if uid in PINNED:
            return PINNED_PRIORITY
        return self.priority.get(uid, UNKNOWN_UID_PRIORITY)

    def rank(self, uid: int) -> Rank:
        """(priority, last completion ms, uid): the order policies rank uids by."""
        return (self.uid_priority(uid), self.last_completed.get(uid, 0), uid)

    def known_uids(self) -> Iterator[int]:
        """Every uid the driver holds a config for: pinned, attributing, ranked, overridden."""
        yield from PINNED
        yield from self.attribution_uids - PINNED
        yield from (uid for uid in self.priority if uid not in self.attribution_uids)
        yield from (
            uid
            for uid in self.access
            if uid not in self.priority and uid not in self.attribution_uids
        )

    def config_for(self, uid: int, policy: Policy) -> SchedulingConfig:
        """The config the uid should have now under `policy`."""
        priority = self.uid_priority(uid)
        app, low, high = policy.config_override(uid, priority) or (
            priority,
            MIN_PRIORITY,
            MAX_PRIORITY,
        )
        direct, attribute = self.access.get(uid, (True, uid in self.attribution_uids))
        return SchedulingConfig(
            uid=uid,
            app_priority=app,
            min_priority=low,
            max_priority=high,
            has_direct_access=direct,
            can_attribute_other_uid=attribute,
        )

    def relay(self, uids: Iterable[int], policy: Policy) -> RelayConfigs | None:
        """The configs of `uids` that changed since last relayed (now remembered), or None."""
        changed = []
        for uid in uids:
            config = self.config_for(uid, policy)
            if self.configs.get(uid) != config:
                self.configs[uid] = config
                changed.append(config)
        return RelayConfigs(tuple(changed), replace_all=False) if changed else None

    def scheduling_configs(self) -> list[SchedulingConfig]:
        """Every config the driver holds, by uid."""
        return [self.configs[uid] for uid in sorted(self.configs)]

    def scheduling_config(self, uid: int, policy: Policy) -> SchedulingConfig:
        """The config the driver holds (or would hold) for the uid."""
        return self.configs.get(uid) or self.config_for(uid, policy)
