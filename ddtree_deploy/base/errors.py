"""The one failure model of the toolkit.

Core modules raise these; only the CLI maps them to exit codes and messages
(one table, in ``cli/app.py``). Each error carries a one-line message that names
the file / line / thing that is wrong, and an optional hint saying what to do.
"""

from __future__ import annotations

from typing import Any

from ddtree_deploy.base.codes import Code

EXIT_OK = 0
EXIT_FAILED = 1  # a check or a deploy step failed
EXIT_BAD_INPUT = 2  # bad input or usage; nothing was changed anywhere


class DeployError(Exception):
    """A step failed (exit 1). ``code`` is a stable machine-readable slug."""

    exit_code = EXIT_FAILED
    code = Code.FAILED

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "hint": self.hint}}


class BadInput(DeployError):
    """Bad input or usage (exit 2): a malformed patch, series, inventory, path..."""

    exit_code = EXIT_BAD_INPUT
    code = Code.BAD_INPUT


# Messages are built from nested prefixes (``<host>: <step>: <the agent's reason>``). Each
# layer says what it knows once: these two keep a segment the inner message already says
# from being said again (``h: lock: lock: No space left on device``).


def prefixed(message: str, *context: str) -> str:
    """``<context>: ...: <message>``, leaving out each context part (a host, a step) that the
    message already starts with: ("h", "lock") and "lock: No space left" -> "h: lock: No
    space left"."""
    for part in reversed(context):
        if message != part and not message.startswith(f"{part}: "):
            message = f"{part}: {message}"
    return message


def clause(exc: DeployError, host: str) -> str:
    """``exc``'s message as a clause of a line that already names ``host`` (without the
    ``<host>: `` it starts with)."""
    return exc.message.removeprefix(f"{host}: ")
