"""``--help`` that reads at 80 columns: the options in their panels (``rich_help_panel``), each with its flag
(and ``--no-`` form) on lines of their own in a narrow first column and its help, env var and default in a
second column that takes the rest of the width; nothing cut with "…" (a word longer than its column folds).

Why not typer's own layout: it gives the flag, its ``--no-`` form and its type a column each, which at 80
columns left the help about 20 characters and cut the flags, the help's long words and the defaults
("[default: no-apply-chat-temp…"). Usage, panels and colours stay typer's; only the table is laid out anew.
Each verb's command is made with ``cls=PanelCommand`` (``cli/__init__``).
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from typing import TYPE_CHECKING

from rich.console import Console
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer import rich_utils
from typer.core import TyperCommand

if TYPE_CHECKING:  # click's classes, or the copy of click that newer typer versions carry
    import click

NAMES_MAX = 26  # the flag column's widest: the longest flags of `run` fit; a longer one folds, never cut
ARGUMENTS, OPTIONS = "Arguments", "Options"
TYPE_WORDS = {"str": "TEXT", "text": "TEXT", "int": "INTEGER", "integer": "INTEGER", "float": "FLOAT",
              "path": "PATH", "bool": "", "boolean": ""}


class PanelCommand(TyperCommand):
    """A typer command whose ``--help`` is laid out by ``render``; in the list of commands (``evalparity
    --help``, typer's) its help's first paragraph as one line, rewrapped to the width (typer keeps a
    docstring's line breaks there)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.help and not self.short_help:
            self.short_help = " ".join(inspect.cleandoc(self.help).split("\n\n")[0].split())

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        render(self, ctx, Console(width=rich_utils.MAX_WIDTH, force_terminal=rich_utils.FORCE_TERMINAL,
                                  color_system=rich_utils.COLOR_SYSTEM, highlight=False, emoji=False))


def render(command: click.Command, ctx: click.Context, console: Console) -> None:
    """Usage, the command's help, one panel per ``rich_help_panel`` (arguments first, in the order their
    parameters come), the epilog."""
    console.print(Padding(Text(command.get_usage(ctx), style="bold"), 1))
    if command.help:
        console.print(Padding(Text(" ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())), (0, 1, 1, 1)))
        for paragraph in inspect.cleandoc(command.help).split("\n\n")[1:]:
            console.print(Padding(Text(" ".join(paragraph.split()), style="dim"), (0, 1, 1, 1)))
    panels: dict[str, list[click.Parameter]] = defaultdict(list)
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    for p in sorted(params, key=lambda p: not is_argument(p)):  # stable: arguments first
        default = ARGUMENTS if is_argument(p) else OPTIONS
        panels[getattr(p, "rich_help_panel", None) or default].append(p)
    rows = {name: [(names(p, ctx), description(p)) for p in members] for name, members in panels.items()}
    width = min(NAMES_MAX, max(len(line) for r in rows.values() for n, _ in r for line in n.plain.splitlines()))
    for name, members in rows.items():  # one flag column's width for all, so that the panels line up
        console.print(panel(name, members, width))
    if command.epilog:
        console.print(Padding(Text(" ".join(command.epilog.split())), 1))


def panel(name: str, rows: list[tuple[Text, Text]], width: int) -> Panel:
    """One panel: a row per parameter, its names on the left (``width`` wide), what it does on the right."""
    table = Table(show_header=False, box=None, padding=(0, 1), pad_edge=False, expand=True)
    table.add_column(width=width, overflow="fold")
    table.add_column(ratio=1, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return Panel(table, title=name, title_align="left", border_style="dim")


def is_argument(p: click.Parameter) -> bool:
    """A positional argument (click's, or the copy of click that newer typer versions carry)."""
    return getattr(p, "param_type_name", "") == "argument"


def names(p: click.Parameter, ctx: click.Context) -> Text:
    """``--flag TYPE`` (its ``--no-`` form on the next line), or an argument's NAME."""
    if is_argument(p):
        shown = (p.metavar or (p.name or "").upper()) + ("..." if p.nargs != 1 else "")
        return Text(shown, style="bold cyan")
    kind = metavar(p)
    out = Text.assemble((", ".join(p.opts), "bold cyan"), (f" {kind}", "yellow") if kind else "")
    if p.secondary_opts:
        out.append("\n" + ", ".join(p.secondary_opts), style="bold magenta")
    return out


def metavar(p: click.Parameter) -> str:
    """The word that stands for an option's value: its metavar, else its type's name (none for a flag)."""
    if getattr(p, "is_flag", False):
        return ""
    if p.metavar:
        return p.metavar
    kind = getattr(p, "type", None)
    name = getattr(kind, "name", None) or (p.bare_type() if hasattr(p, "bare_type") else "")  # typer's own types
    name = str(name).lower().removeprefix("list[").removesuffix("]")
    return TYPE_WORDS.get(name, name.upper())


def description(p: click.Parameter) -> Text:
    """The help text, then the env var and the default each on a line of its own, whole."""
    out = Text(" ".join((getattr(p, "help", None) or "").split()))
    envvar = p.envvar if isinstance(p.envvar, str) else ", ".join(p.envvar or ())
    if envvar and getattr(p, "show_envvar", False):
        out.append(f"\n[env var: {envvar}]", style="dim yellow")
    shown = default(p)
    if shown:
        out.append(f"\n[default: {shown}]", style="dim")
    if p.required:
        out.append("\n[required]", style="dim red")
    return out


def default(p: click.Parameter) -> str:
    """An option's default as a user would type it; "" when there is none worth showing (None, a list not
    given, a plain flag that is off, or ``show_default`` off)."""
    if is_argument(p) or getattr(p, "show_default", True) is False:
        return ""
    if isinstance(getattr(p, "show_default", None), str):
        return str(p.show_default)
    value = p.default
    if getattr(p, "is_flag", False):
        if value is None or (not value and not p.secondary_opts):
            return ""
        return p.opts[0] if value else p.secondary_opts[0]
    if value is None or value == () or value == []:
        return ""
    return str(value)
