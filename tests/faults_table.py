"""The fault-injection suite's table of cases and outcomes, printed at the end of the test session."""

from __future__ import annotations

ROWS: list[tuple[str, str]] = []


def record(case: str, outcome: str) -> None:
    ROWS.append((case, outcome))


def render() -> str:
    if not ROWS:
        return ""
    w = max(len(c) for c, _ in ROWS)
    lines = [f"{'case'.ljust(w)} | outcome", f"{'-' * w}-|--------"]
    lines += [f"{c.ljust(w)} | {o}" for c, o in ROWS]
    return "\n".join(lines)
