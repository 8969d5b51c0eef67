"""Result objects shared by the tests, in the style of ``scipy.stats`` results."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfidenceInterval:
    """A two-sided interval, like ``scipy.stats._result_classes.ConfidenceInterval``."""

    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def within(self, margin: float) -> bool:
        """True when the whole interval lies strictly inside (-margin, +margin)."""
        return -margin < self.low and self.high < margin
