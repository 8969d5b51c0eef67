"""Text that users control (paths, model, task, metric and cell names, prompts), made safe to show: every
control character written out instead of obeyed.

Why: a terminal obeys an ANSI escape (ESC ``[31m``, or the one-character CSI U+009B), a carriage return
overwrites the line it is on, and a newline starts one that can pass for a result line; a bidirectional
override makes text read in another order than it is stored. A task name, a folder name or a prompt may
hold any of them. A leaf module (standard library only): the console (``cli/output.py``), the markdown and
HTML reports (``report/markdown.py``, ``report/render.py``) and the figures' labels all use ``visible``.
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls, the Unicode line and paragraph separators, and the bidirectional
# embeddings, overrides and isolates.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _written_out(m: re.Match) -> str:
    ch = m.group(0)
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def visible(text: object, *, keep_newlines: bool = False) -> str:
    """``str(text)`` with every control character written out as Python writes it in a string literal (ESC
    -> ``\\x1b``, CR -> ``\\r``), so that it is shown, not obeyed; newlines too, unless ``keep_newlines``
    (text of several lines by design, such as a prompt or a log message)."""
    s = str(text)
    if keep_newlines:
        return "\n".join(CONTROL.sub(_written_out, line) for line in s.split("\n"))
    return CONTROL.sub(_written_out, s)
