"""The built-in model-loading policies: the platform's three and our `pressure`."""

from __future__ import annotations

from .budget import BudgetParams, BudgetPolicy, NaiveBudgetPolicy
from .pressure import PressureParams, PressurePolicy
from .status_quo import StatusQuoPolicy

__all__ = [
    "BudgetParams",
    "BudgetPolicy",
    "NaiveBudgetPolicy",
    "PressureParams",
    "PressurePolicy",
    "StatusQuoPolicy",
]
