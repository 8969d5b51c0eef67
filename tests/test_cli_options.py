"""Each option declared once (issue 27, item 6): verbs take groups of options (``cli.options.verb``), so the
statistics and outputs options that ``run``, ``report``, ``compare`` and ``plan`` share live in one
declaration each, and ``run``'s own in one group per concern."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from evalparity.cli import app, compare, options, plan, report, run


@dataclass(frozen=True)
class Size:
    width: Annotated[int, typer.Option(help="Width.")] = 3
    tall: Annotated[bool, typer.Option(help="Tall or not.")] = False


@dataclass(frozen=True)
class Name:
    name: Annotated[str, typer.Option(help="A name.")] = "x"


@dataclass(frozen=True)
class Wide:
    width: Annotated[int, typer.Option(help="Width again.")] = 1


def group_types(function) -> dict[str, type]:
    """The verb's own parameters (before ``verb`` spreads them) and their types."""
    return typing.get_type_hints(inspect.unwrap(function), include_extras=True)


def test_a_verb_gets_its_groups_built_from_the_flags():
    seen = {}

    @options.verb
    def make(thing: Annotated[str, typer.Argument()], *, size: Size, label: Name) -> None:
        seen.update(thing=thing, size=size, label=label)

    tiny = typer.Typer()
    tiny.command()(make)
    tiny.command("other")(lambda: None)  # two commands: typer then takes the first word as the command's name
    result = CliRunner().invoke(tiny, ["make", "box", "--width", "7", "--tall"])
    assert result.exit_code == 0, result.output
    assert seen == {"thing": "box", "size": Size(width=7, tall=True), "label": Name("x")}
    assert list(inspect.signature(make).parameters) == ["thing", "width", "tall", "name"]


def test_an_option_declared_twice_is_refused_at_import():
    def twice(*, size: Size, wide: Wide) -> None: ...

    with pytest.raises(TypeError, match="width"):
        options.verb(twice)

    def clash(*, name: Size, label: Name) -> None: ...  # a group named like an option of another

    with pytest.raises(TypeError, match="name"):
        options.verb(clash)


@pytest.mark.parametrize("function", [run.run, report.report, compare.compare, plan.plan])
def test_the_statistics_options_come_from_one_group(function):
    """Each verb that takes the statistics options takes the group, not options of its own."""
    own = {k: v for k, v in group_types(function).items() if k != "return"}
    stats = [name for name, kind in own.items() if options.is_group(kind) and issubclass(kind, options.Statistics)]
    assert len(stats) == 1, own
    fields = {f.name for f in dataclasses.fields(options.Statistics)}
    assert not fields & set(own), sorted(fields & set(own))


def test_every_flag_of_run_belongs_to_one_group():
    own = {k: v for k, v in group_types(run.run).items() if k != "return"}
    assert all(options.is_group(kind) for kind in own.values()), own
    flags = [f.name for kind in own.values() for f in dataclasses.fields(kind)]
    assert len(flags) == len(set(flags)) == len(inspect.signature(run.run).parameters)


def test_compare_keeps_its_own_reference_and_the_rest_of_the_statistics():
    params = {p.name: p for p in typer.main.get_command(app).commands["compare"].params}
    assert params["reference"].default is None and params["margin"].default == options.MARGIN
    report_params = {p.name: p for p in typer.main.get_command(app).commands["report"].params}
    assert params["reference"].help != report_params["reference"].help
    assert params["margin"].help == report_params["margin"].help
