"""The one exception type the CLI turns into a one-line message and a non-zero exit code."""

from __future__ import annotations

# Exit codes, documented in the README. 0 is a passing sign-off.
EXIT_DIFFERENT = 3
EXIT_INCONCLUSIVE = 4
EXIT_USAGE = 2
EXIT_CELL_FAILED = 5
EXIT_DOCTOR_PROBLEMS = 6  # evalparity doctor found something that does not work here (1 stays a bug's)


class EvalParityError(Exception):
    """Bad input or an unusable environment. ``str(err)`` is the whole message: what is wrong and the fix.

    Raised anywhere; ``cli.main`` prints it as one line and exits with ``exit_code``.
    """

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


def worker_main(main, argv: list[str]) -> int:
    """A worker process's ``__main__``: ``main(argv)``'s exit status, or, for an EvalParityError, its message as
    one ``error: ...`` line on stderr and exit 2, which the parent shows as the reason (``procs.run_logged``)."""
    import sys

    try:
        return main(argv)
    except EvalParityError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
