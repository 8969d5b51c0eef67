"""Renders the report context through the package's Jinja2 templates (``templates/``).

Two environments, one per format: HTML autoescapes every value; markdown has no autoescape, so its template
passes every value through the ``md`` filter (``markdown.md_escape``) and preformatted text through
``fence`` (``markdown.md_fence``). Undefined names raise (``StrictUndefined``): a misspelt context field is
an error, not an empty cell.
"""

from __future__ import annotations

import html
from functools import cache

from jinja2 import Environment, PackageLoader, StrictUndefined

from evalparity.report.context import ReportContext
from evalparity.report.formatting import COLORS
from evalparity.report.markdown import md_escape, md_fence


def verdict_color(text: str) -> str | None:
    """The colour of a table cell that starts with a verdict or a sign-off ('DIFFERENT -1.25' is red)."""
    return COLORS.get(text.split(" ")[0]) if text else None


@cache
def environment(fmt: str) -> Environment:
    """The Jinja2 environment for ``fmt`` ("md" or "html"), loading the templates shipped in the package."""
    env = Environment(loader=PackageLoader("evalparity.report", "templates"), autoescape=fmt == "html",
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    if fmt == "md":
        env.filters.update(md=md_escape, fence=md_fence, html=html.escape)
    else:
        env.globals.update(colors=COLORS, verdict_color=verdict_color)
    return env


def render_markdown(ctx: ReportContext) -> str:
    # Each block ends with a blank line; the file ends with one newline, whichever section comes last.
    return environment("md").get_template("report.md").render(report=ctx).rstrip("\n") + "\n"


def render_html(ctx: ReportContext) -> str:
    return environment("html").get_template("report.html").render(report=ctx)
