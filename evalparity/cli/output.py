"""Where the command line's output goes: one console on stderr, and the logging handler that puts the
``evalparity`` loggers' records on it; the escaping of the text users control; and the sign-off line.

Modules log with ``logging.getLogger(__name__)``; only the CLI decides how a record looks, once
(``configure_logging``, from ``main``). Standard output carries only the results a script reads (the sign-off
line of ``run``/``report``/``compare``, the paths ``models prepare`` writes).

User text (paths, model, task, metric and cell names, error messages that quote them) goes through ``safe``
before it is put in a console line: rich would read ``[/]`` or ``[bold]`` in a folder's name as markup (and
fail, or print a different path), and a terminal would obey an ANSI escape or a carriage return in a task
name. ``printable.visible`` is the control-character half alone, for plain ``print`` to stdout.

A log in a file or a CI system has no clock of its own: within ``timestamped_log`` (``run``, from its first
line to its sign-off), when stderr is no terminal, every line of the command's log (``log``, and every log
record) starts with the time, the same clock as the progress lines (``runlog.stamp``); results (tables, the
sign-off, warnings and errors) keep their first words where scripts and people look for them. On a terminal
the live bars carry the one clock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from evalparity.printable import visible
from evalparity.runlog import stamp

console = Console(stderr=True, emoji=False)  # ':smile:' in a task name stays as typed
_timestamped = False  # inside ``timestamped_log``


def safe(text: object) -> str:
    """``text`` for a console line that may hold rich markup: control characters visible and markup
    escaped, so it prints as written, whatever brackets it holds. Backslashes at its end are doubled (rich's
    own ``escape`` gets two or more wrong, and three make the line's next tag a MarkupError): right before a
    tag they print as written, before plain text twice; a line that ends with user text is better built as a
    ``Text``, never parsed (``error_line``)."""
    shown = visible(text)
    body = shown.rstrip("\\")
    return escape(body) + "\\" * (2 * (len(shown) - len(body)))


def error_line(message: object, label: str = "error:") -> Text:
    """The one line an error prints: ``label`` in red, then ``message`` as plain text (never read as markup,
    control characters visible), exactly as written."""
    return Text.assemble((label, "red"), " ", visible(message))


@contextlib.contextmanager
def timestamped_log() -> Iterator[None]:
    """Within it, when the console is no terminal, ``log`` lines and log records start with the time."""
    global _timestamped
    before, _timestamped = _timestamped, True
    try:
        yield
    finally:
        _timestamped = before


def when() -> str:
    """The time a log line starts with (``runlog.stamp`` and two spaces), or "" on a terminal and outside
    ``timestamped_log``."""
    return f"{stamp()}  " if _timestamped and not console.is_interactive else ""


def log(message: str | Text, **kw) -> None:
    """A line of the command's log: ``message`` as ``console.print`` takes it (a str is read as rich markup,
    so user text in it goes through ``safe``; a ``Text`` is printed as written), after the time where
    ``when`` gives one. A timestamped line is never wrapped: a continuation line would have no time."""
    prefix = when()
    if not prefix:
        console.print(message, **kw)
        return
    kw["soft_wrap"] = True
    console.print(Text.assemble(prefix, message) if isinstance(message, Text) else prefix + message, **kw)


class ConsoleHandler(logging.Handler):
    """evalparity's log records as plain lines on ``console``, as its messages always looked: no level or
    source path (the level shows only as a colour, on a terminal), the time only where ``when`` gives one,
    never wrapped mid-line by rich, never read as rich markup, and with control characters shown, not
    obeyed."""

    STYLES = {logging.DEBUG: "dim", logging.INFO: "cyan", logging.WARNING: "yellow"}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            style = self.STYLES.get(record.levelno, "red" if record.levelno > logging.WARNING else "")
            prefix = when()  # on each line of a record of several
            line = visible(self.format(record), keep_newlines=True).replace("\n", "\n" + prefix)
            console.print(Text.assemble(prefix, (line, style)), soft_wrap=True, highlight=False)
        except Exception:  # noqa: BLE001 - logging's contract: a failing handler reports, never raises
            self.handleError(record)


def print_table(table) -> None:
    """A wide table (``plan``'s) in full. On a terminal rich fits it to the terminal; piped, as in a CI log, the
    console is 80 columns wide, and rich shortened the numbers to fit (``4,…`` for 4,000): there it is printed
    at its own width, as a log line can be as long as it needs."""
    natural = console.measure(table, options=console.options.update(max_width=10_000)).maximum
    if console.is_terminal or natural <= console.width:
        console.print(table)
        return
    # console.print(width=...) is capped at the console's width: a console of the table's width, same stream
    Console(file=console.file, width=natural, emoji=False, no_color=console.no_color).print(table)


def configure_logging() -> None:
    """Once per command: the ``evalparity`` loggers print INFO and above through ``console``, so that their
    lines and the progress bars share one live display, and only there: not through the root logger, where
    lm-eval, transformers or Ray may have put handlers of their own (their logs stay off the terminal)."""
    root = logging.getLogger("evalparity")
    if not any(isinstance(h, ConsoleHandler) for h in root.handlers):
        root.addHandler(ConsoleHandler())
    root.setLevel(logging.INFO)
    root.propagate = False


# ---------------------------------------------------------------- the sign-off
_signed_off: int | None = None  # the sign-off's exit code, once its line is printed


def sign_off(status: str, reason: str, report: object, code: int) -> None:
    """Print the sign-off: a coloured line and the report's path on the console, and ``STATUS: reason`` on
    stdout, the line CI reads. From here on the verdict is final: nothing the console does can keep the
    stdout line from being printed, and Ctrl-C no longer changes the exit code (``signed_off``): a first
    interrupt is noted and the command finishes its cleanup (the lock, the run's Ray instance), a second one
    stops it at once, with the sign-off's code still (``cli.main``)."""
    global _signed_off
    _signed_off = code
    try:
        signal.signal(signal.SIGINT, _interrupt_after_sign_off)
    except ValueError:  # not the main thread (a test calling in): no handler to change
        pass
    try:
        style = {"PASS": "green", "FAIL": "red"}.get(status, "yellow")
        console.print(Text.assemble((f"sign-off: {visible(status)}", f"bold {style}"), f" ({visible(reason)})"),
                      soft_wrap=True, highlight=False)
        console.print(Text(f"report: {visible(report)}"), soft_wrap=True, highlight=False)
    except Exception:  # noqa: BLE001 - the console is a courtesy; the stdout line below is the result
        pass
    try:
        print(f"{visible(status)}: {visible(reason)}", flush=True)
    except OSError:  # stdout closed (a reader that went away): the exit code still says it
        pass


def signed_off() -> int | None:
    """The exit code of the sign-off printed by this command, or None when none was printed (yet)."""
    return _signed_off


def _interrupt_after_sign_off(signum, frame) -> None:
    """SIGINT once the sign-off is out: the first is noted (os.write: safe inside a signal handler, where
    the console may be mid-line), and the cleanup carries on; the next raises KeyboardInterrupt as usual."""
    try:
        os.write(2, b"\ninterrupt: the sign-off above is final; finishing up (Ctrl-C again to stop now, with "
                    b"the same exit code)\n")
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
