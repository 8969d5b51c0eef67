"""Markdown escaping, for the report and for anything else that writes a name or a prompt into markdown.

A leaf module (standard library only): the markdown template uses these as its ``md`` and ``fence`` filters,
and the tests import ``md_escape`` to find a task name the way the report writes it.
"""

from __future__ import annotations

import html
import re


def md_escape(text: str) -> str:
    """Text for a markdown document: HTML and markdown's inline syntax escaped, so a task name, a model path
    or a prompt is shown as written and never rendered as HTML or as a link by a markdown viewer."""
    out = html.escape(str(text), quote=False)
    for ch in "\\`*_[]#|!":
        out = out.replace(ch, "\\" + ch)
    return out.replace("\n", " ")


def md_fence(text: str) -> str:
    """A fenced block longer than any run of backticks in ``text``, so the text cannot close it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}\n"
