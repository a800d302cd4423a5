"""The error type of everything a user hands the command line, and one-line error messages."""

from __future__ import annotations


class FrontendError(ValueError):
    """A problem with the user's model, target, inputs or library; its message is one line."""


def first_line(err: BaseException) -> str:
    """The first meaningful line of an exception's message (TVM errors span several lines)."""
    for line in str(err).splitlines():
        line = line.strip()
        if line and not line.startswith("Traceback"):
            return line
    return type(err).__name__
