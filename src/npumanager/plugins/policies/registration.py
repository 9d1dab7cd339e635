"""Registers the built-in policies through the `builtin-policies` entry point."""

from __future__ import annotations

from collections.abc import Iterable

from npumanager.core.plugins.hookspecs import hookimpl
from npumanager.schemas import PolicyRecord

from .budget import BudgetParams, budget, turn_taking
from .pressure import PressureParams, pressure
from .status_quo import status_quo


@hookimpl
def npumanager_register_policies() -> Iterable[PolicyRecord]:
    """The platform's three policies and our pressure-aware one."""
    return [
        PolicyRecord(
            name="status_quo",
            factory=status_quo,
            description="every request may load at once (the platform's default)",
        ),
        PolicyRecord(
            name="turn_taking",
            factory=turn_taking,
            description="one model at a time; equal uids take turns on work completion",
        ),
        PolicyRecord(
            name="budget",
            factory=budget,
            params_model=BudgetParams,
            description="size-class weights against a maximum budget, by uid importance",
        ),
        PolicyRecord(
            name="pressure",
            factory=pressure,
            params_model=PressureParams,
            description="bytes per device, opportunistic loads, thermal and memory pressure",
        ),
    ]
