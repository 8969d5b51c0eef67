"""Keep third-party libraries' logs and progress bars off the user's terminal.

A leaf module (it imports nothing of evalparity), used by ``tasks`` (lm-eval and datasets while tasks are
built) and by ``data.embedded`` (transformers while the embedded model is converted). It lived in ``tasks``,
which made the cycle tasks -> data.mirrors -> data.embedded -> tasks.
"""

from __future__ import annotations

import contextlib
import io
import logging


@contextlib.contextmanager
def quiet():
    """For the block's duration: logging at WARNING and below off, stdout and stderr into a buffer (yielded)."""
    buf = io.StringIO()
    prev = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(buf):
            yield buf
    finally:
        logging.disable(prev)
