"""Result objects shared by the tests, in the style of ``scipy.stats`` results."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfidenceInterval:
    """A two-sided interval, like ``scipy.stats._result_classes.ConfidenceInterval``."""

    low: float
    high: float
