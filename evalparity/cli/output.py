"""Where the command line's output goes: one console on stderr, and the logging handler that puts the
``evalparity`` loggers' records on it.

Modules log with ``logging.getLogger(__name__)``; only the CLI decides how a record looks, once
(``configure_logging``, from ``main``). Standard output carries only the results a script reads (the sign-off
line of ``run``/``report``/``compare``, the paths ``models prepare`` writes).
"""

from __future__ import annotations

import logging

from rich.console import Console
from rich.text import Text

console = Console(stderr=True)


class ConsoleHandler(logging.Handler):
    """evalparity's log records as plain lines on ``console``, as its messages always looked: no time, level
    or source path (the level shows only as a colour, on a terminal), never wrapped mid-line by rich, and
    never read as rich markup."""

    STYLES = {logging.DEBUG: "dim", logging.INFO: "cyan", logging.WARNING: "yellow"}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            style = self.STYLES.get(record.levelno, "red" if record.levelno > logging.WARNING else "")
            console.print(Text(self.format(record), style=style), soft_wrap=True, highlight=False)
        except Exception:  # noqa: BLE001 - logging's contract: a failing handler reports, never raises
            self.handleError(record)


def configure_logging() -> None:
    """Once per command: the ``evalparity`` loggers print INFO and above through ``console``, so that their
    lines and the progress bars share one live display, and only there: not through the root logger, where
    lm-eval, transformers or Ray may have put handlers of their own (their logs stay off the terminal)."""
    root = logging.getLogger("evalparity")
    if not any(isinstance(h, ConsoleHandler) for h in root.handlers):
        root.addHandler(ConsoleHandler())
    root.setLevel(logging.INFO)
    root.propagate = False
