"""Renders the report context through the package's Jinja2 templates (``templates/``).

Two environments, one per format: HTML autoescapes every value; markdown has no autoescape, so its template
passes every value through the ``md`` filter (``markdown.md_escape``) and preformatted text through
``fence`` (``markdown.md_fence``). In both, every printed value has its control characters written out
first (``shown``, Jinja2's ``finalize``): HTML escaping leaves an ANSI escape or a bidirectional override in a
task name as it is. Undefined names raise (``StrictUndefined``): a misspelt context field is an error, not an
empty cell.
"""

from __future__ import annotations

import html
from functools import cache

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from evalparity.printable import visible
from evalparity.report.context import ReportContext
from evalparity.report.formatting import SIGN_OFF_TONES, TONES, tone_class, tone_of
from evalparity.report.markdown import md_escape, md_fence


def shown(value):
    """A value as the templates print it: text with its control characters written out (its lines kept, for
    prompts), anything else as it is. Markup (already escaped, e.g. a macro's output) stays Markup, so it is
    not escaped twice."""
    if isinstance(value, Markup):
        return Markup(visible(value, keep_newlines=True))
    return visible(value, keep_newlines=True) if isinstance(value, str) else value


@cache
def environment(fmt: str) -> Environment:
    """The Jinja2 environment for ``fmt`` ("md" or "html"), loading the templates shipped in the package."""
    env = Environment(loader=PackageLoader("evalparity.report", "templates"), autoescape=fmt == "html",
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                      finalize=shown)
    if fmt == "md":
        env.filters.update(md=md_escape, fence=md_fence, html=html.escape)
    else:
        env.globals.update(palette=TONES | SIGN_OFF_TONES, tone_class=tone_class, tone_of=tone_of)
    return env


def render_markdown(ctx: ReportContext) -> str:
    # Each block ends with a blank line; the file ends with one newline, whichever section comes last.
    return environment("md").get_template("report.md").render(report=ctx).rstrip("\n") + "\n"


def render_html(ctx: ReportContext) -> str:
    return environment("html").get_template("report.html").render(report=ctx)
