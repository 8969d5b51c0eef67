"""Markdown escaping, for the report and for anything else that writes a name or a prompt into markdown.

A leaf module (standard library and ``printable`` only): the markdown template uses these as its ``md`` and
``fence`` filters, and the tests import ``md_escape`` to find a task name the way the report writes it. Both
write control characters out first (``printable.visible``): an ANSI escape in a task name would otherwise
reach the terminal of whoever runs ``cat report.md``.
"""

from __future__ import annotations

import html
import re

from evalparity.printable import visible


def md_escape(text: str) -> str:
    """Text for a markdown document: control characters written out, HTML and markdown's inline syntax
    escaped, so a task name, a model path or a prompt is shown as written and never rendered as HTML, as a
    link or as struck-through text by a markdown viewer."""
    out = html.escape(visible(text, keep_newlines=True), quote=False)
    for ch in "\\`*_[]#|!~":
        out = out.replace(ch, "\\" + ch)
    return out.replace("\n", " ")


def md_fence(text: str) -> str:
    """A fenced block longer than any run of backticks in ``text``, so the text cannot close it; control
    characters written out (its lines kept)."""
    text = visible(text, keep_newlines=True)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}\n"
