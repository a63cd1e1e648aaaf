"""The help screens as the toolkit writes them, whatever typer's rich mode would make of them.

Typer (rich markup mode) reads every help text as rich markup, so the inventory tables the
help names -- ``[smoke]``, ``[smoke.launch]``, ``[serve]`` -- were styles, and vanished;
it shows a ``<bool>`` type beside every flag, which takes no value; and only ``--help``
asks for help. ``tidy`` fixes all three on the app's click command tree, once, when the root
group is built (``envelope.EnvelopeGroup``): help texts are escaped (they are plain text,
never markup), each paragraph one line (the terminal wraps it), a flag's type column is
empty, and ``-h`` is ``--help``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

#: The help option's names: ``--help`` first, so click's "Try '... --help'" keeps its word.
HELP_NAMES = ["--help", "-h"]


def tidy(command: Any, *, markup: bool = True) -> None:
    """Escape the help texts (``markup``: typer reads them as rich markup), blank the flags'
    type column and add ``-h``: on ``command`` and every command below it."""
    from rich.markup import escape

    def plain(text: Any) -> Any:
        return escape(text) if markup and isinstance(text, str) else text

    for attr in ("help", "short_help", "epilog"):
        setattr(command, attr, plain(unwrap(getattr(command, attr, None))))
    for param in getattr(command, "params", ()):
        if hasattr(param, "help"):
            param.help = plain(param.help)
        blank_flag(param)
    # The help option is made on first use, from the context's names: made here with ours
    # (the context holds nothing else it reads), so it is the one every later use gets.
    if getattr(command, "add_help_option", False) and hasattr(command, "get_help_option"):
        blank_flag(command.get_help_option(SimpleNamespace(help_option_names=HELP_NAMES)))
    for sub in (getattr(command, "commands", None) or {}).values():
        tidy(sub, markup=markup)


def unwrap(text: Any) -> Any:
    """A docstring's paragraphs each on one line: typer keeps a paragraph's source line
    breaks, so one written over several lines wrapped there and again at the terminal's
    width. A paragraph that starts with click's ``\\b`` keeps its lines."""
    import inspect

    if not isinstance(text, str):
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n")) for p in paragraphs)


def blank_flag(param: Any) -> None:
    """A flag's type column empty: typer shows the metavar in place of its ``<bool>``."""
    if getattr(param, "is_flag", False) and param.metavar is None:
        param.metavar = ""


__all__ = ["HELP_NAMES", "blank_flag", "tidy", "unwrap"]
