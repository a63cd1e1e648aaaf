"""The typer application and the one place that maps errors to exit codes.

Command modules (one per command group) register on ``app`` and wrap their
bodies with ``@handles_errors``. Diagnostics and progress go to stderr
(``err``); results and ``--json`` documents go to stdout (``emit_json``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any, Callable

import typer
from rich.console import Console

from ddtree_deploy.errors import EXIT_BAD_INPUT, EXIT_FAILED, BadInput, DeployError

EXIT_CODES_HELP = (
    "Exit codes: 0 success; 1 a check or deploy step failed; "
    "2 bad input or usage (nothing was changed anywhere)."
)

app = typer.Typer(
    name="ddtree-deploy",
    help="Deploy the DDTree patch series into SGLang on GPU hosts. " + EXIT_CODES_HELP,
    no_args_is_help=True,
    # --install-completion / --show-completion (bash, zsh, fish, PowerShell): typer's own.
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    # The installed distribution's version (a wheel or an editable checkout alike).
    if value:
        from importlib.metadata import version

        sys.stdout.write(f"ddtree-deploy {version('ddtree-deploy')}\n")
        raise typer.Exit(0)


@app.callback()
def _main(
    show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                      help="Print the toolkit's version and exit."),
) -> None:
    pass


def _log_width() -> int | None:
    """Terminals report their width; logs and pipes get 120 columns (rich's 80 folds the
    check table and the step lines), unless COLUMNS says otherwise."""
    if sys.stderr.isatty() or os.environ.get("COLUMNS"):
        return None
    return 120


#: Diagnostics, tables meant for people, progress: stderr.
err = Console(stderr=True, width=_log_width())
#: Machine-readable results: stdout.
out = Console(highlight=False, soft_wrap=True)


def emit_json(document: Any) -> None:
    """Print one JSON document to stdout (the ``--json`` contract)."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def handles_errors(fn: Callable) -> Callable:
    """Map DeployError to one line on stderr (and a JSON error with --json) and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DeployError as exc:
            if kwargs.get("json_output"):
                emit_json(exc.to_json())
            line = f"[bold red]error:[/] {_escape(exc.message)}"
            err.print(line, highlight=False, soft_wrap=True)
            if exc.hint:
                err.print(f"[dim]hint:[/] {_escape(exc.hint)}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code)
        except typer.Exit:  # typer's own exit is a RuntimeError subclass: let it through
            raise
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]")
            raise typer.Exit(130)
        except Exception:
            if os.environ.get("DDTREE_DEPLOY_DEBUG"):
                raise
            err.print_exception(max_frames=8)
            raise typer.Exit(EXIT_FAILED)

    return wrapper


def _escape(text: str) -> str:
    from ddtree_deploy.cli.text import safe  # host text in messages: no markup, no control characters

    return safe(text)


__all__ = [
    "app",
    "err",
    "out",
    "emit_json",
    "handles_errors",
    "BadInput",
    "DeployError",
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
]
