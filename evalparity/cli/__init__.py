"""The command line: one module per verb (``run``, ``report``, ``plan``, ``compare``, ``drift``, ``doctor``,
``models``), none importing another's (tests/test_architecture.py); what they share in modules of its own:
the options, declared once in groups (``options``), what ``run``, ``report`` and ``compare`` end with
(``finish``), where output goes (``output``) and ``--help``'s layout (``helptext``). Each verb turns
EvalParityError into one line on stderr and its exit code (``main``), and never shows a traceback for bad
input.

Importing this package loads typer and rich, and none of torch, lm-eval, vLLM, pandas or scipy: the verbs
import what they need when they run, so ``--help`` and a bad option answer at once.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys

import typer

from evalparity import procs
from evalparity.cli import compare, doctor, drift, hidden, models, plan, report, run
from evalparity.cli.helptext import PanelCommand
from evalparity.cli.options import lmeval_hint
from evalparity.cli.output import configure_logging, console, error_line, signed_off
from evalparity.errors import EvalParityError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Does backend or dtype drift change model quality? Paired statistics over lm-eval runs.",
                  epilog="Exit codes: 0 PASS; 3 FAIL (a gating comparison DIFFERENT); 4 INCONCLUSIVE (pass "
                         "--no-fail-on-inconclusive to exit 0 then); 5 INCOMPLETE (a cell failed or is missing); "
                         "2 bad input; 130 interrupted (Ctrl-C), 143 stopped by SIGTERM, 129 by SIGHUP; 6 doctor found "
                         "a problem; 1 an internal error (a bug: please report it).")


def _version(value: bool) -> None:
    if value:
        from evalparity import __version__

        print(f"evalparity {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print evalparity's version and exit.")) -> None:
    """Does backend or dtype drift change model quality? Paired statistics over lm-eval runs."""
app.command("run", cls=PanelCommand)(run.run)
app.command("report", cls=PanelCommand)(report.report)
app.command("plan", cls=PanelCommand)(plan.plan)
app.command("compare", cls=PanelCommand)(compare.compare)
app.command("drift", cls=PanelCommand)(drift.drift)
app.command("hidden", cls=PanelCommand)(hidden.hidden)
app.command("doctor", cls=PanelCommand)(doctor.doctor)
app.add_typer(models.app, name="models")


def main() -> None:
    """The console script: runs the app without click's standalone mode, so that every way a command ends
    (its exit code, EvalParityError, a usage error, Ctrl-C, SIGTERM) is one line at most, and exits with its
    code.

    Exit codes (README "Gating CI"): the sign-off's (0, 3, 4) or an error's (2 bad input, 5 cells failed);
    130 for Ctrl-C before the sign-off, 143 for SIGTERM and 129 for SIGHUP (``Stopped``); 1 for an internal
    error (a bug: its traceback is shown, to be reported). Once the sign-off line is printed its code stands,
    whatever follows: an error, an internal one, Ctrl-C or SIGTERM (``output.sign_off``); only ``run``'s 5, for
    cells that failed under a PASS, replaces it."""
    configure_logging()
    _stop_on_signals()
    try:
        rc = app(standalone_mode=False)
        if rc == 130:  # typer turns Ctrl-C inside a command into Exit(130), which this mode returns
            _interrupted()
        _exit(rc if isinstance(rc, int) else 0)
    except EvalParityError as err:
        console.print(error_line(err), soft_wrap=True, highlight=False)
        _exit(err.exit_code if signed_off() is None else signed_off())  # after the sign-off, its code stands
    except typer.Exit as e:
        _exit(e.exit_code)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as err:  # usage errors (a bad option value, an unknown command) and the like
        if _stopped_by and isinstance(err, OSError):  # while a stop signal unwound it: a closed terminal (EIO)
            _interrupted()
        if _is_click(err, "ClickException"):
            ctx = getattr(err, "ctx", None)
            where = ctx.command_path if ctx is not None else "evalparity"
            if err.format_message():  # empty: a command group given no command, whose help is shown already
                hint = lmeval_hint(err.format_message())
                console.print(error_line(hint or f"{err.format_message()} (see `{where} --help`)"), soft_wrap=True,
                              highlight=False)
            _exit(err.exit_code)
        if _is_click(err, "Abort"):  # older typer (click) turns Ctrl-C inside a command into Abort
            _interrupted()
        if signed_off() is not None:  # a failure after the verdict was printed cannot take it back
            console.print(error_line(f"{type(err).__name__}: {err}", "internal error after the sign-off:"),
                          soft_wrap=True, highlight=False)
            _exit(signed_off())
        raise


def _exit(code: int) -> None:
    """``sys.exit(code)``; once a sign-off line is printed, with Ctrl-C, SIGTERM and SIGHUP ignored from here
    on: one while the interpreter shuts down would otherwise end the process by the signal (-2 to a parent)
    instead of with this code."""
    if signed_off() is not None:
        for sig in (signal.SIGINT, *STOP_SIGNALS):
            signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)


def _interrupted() -> None:
    if signed_off() is not None:
        console.print(f"[yellow]interrupted after the sign-off[/yellow]: exit code {signed_off()}, the "
                      "sign-off's", highlight=False)
        _exit(signed_off())
    if _stopped_by:
        name = signal.Signals(_stopped_by[0]).name
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            console.print(f"[red]stopped by {name}[/red] before the sign-off: finished cells are kept; rerun the "
                          "same command to resume", highlight=False, soft_wrap=True)
        sys.exit(128 + _stopped_by[0])
    console.print("[red]interrupted[/red]: finished cells are kept; rerun the same command to resume", soft_wrap=True)
    sys.exit(130)


STOP_SIGNALS = procs.EXIT_SIGNALS  # SIGTERM, SIGHUP: the ones procs also passes on to the children's groups
_stopped_by: list[int] = []  # the signal that stopped this command, once one has


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP before the sign-off, unwound as Ctrl-C is.

    They are how a command is stopped from outside: a CI job's time limit or cancel (GitLab and Jenkins send
    SIGTERM, GitHub Actions SIGINT then SIGTERM), ``timeout``, a batch scheduler, a closed terminal. Ended by
    the signal's default action, a run left no ``run.json`` for that invocation and no line saying what
    happened or that a rerun resumes; unwound like Ctrl-C, every ``finally`` runs: the run records its
    timings, releases its lock, and its children are stopped (``procs``, whose handler runs first). The exit
    code is the shell's for that signal, 128 + its number."""


def _stop_on_signals() -> None:
    """Install ``_on_stop_signal`` for SIGTERM and SIGHUP, from the main thread; a signal ignored on purpose
    (``nohup``) stays ignored."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_IGN, None):
            continue
        signal.signal(sig, _on_stop_signal)


def _on_stop_signal(signum, frame) -> None:
    """The first SIGTERM/SIGHUP raises Stopped, or once the sign-off is out is noted and the cleanup carries
    on (its code stands, as for Ctrl-C); a second one ends the process at once: by the signal's default
    action, or with the sign-off's code once there is one."""
    name = signal.Signals(signum).name
    if signed_off() is not None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _exit_now_with_the_sign_off)
        with contextlib.suppress(OSError):
            os.write(2, f"\n{name}: the sign-off above is final; finishing up\n".encode())
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    _stopped_by.append(signum)
    raise Stopped(name)


def _exit_now_with_the_sign_off(signum, frame) -> None:
    """A second SIGTERM/SIGHUP after the sign-off: out at once, the sign-off's code still."""
    os._exit(signed_off() or 0)


def _is_click(err: BaseException, name: str) -> bool:
    """Is ``err`` click's exception ``name``? Recent typer vendors click as ``typer._click``, older typer
    raises ``click``'s own classes; usage errors come from whichever is in use."""

    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(err, cls):
            return True
    return False
