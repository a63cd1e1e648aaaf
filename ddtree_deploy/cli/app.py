"""The typer application and the one place that maps errors to exit codes.

Command modules (one per command group) register on ``app`` and wrap their
bodies with ``@handles_errors``. Diagnostics and progress go to stderr
(``err``); results go to stdout; a ``--json`` run's one document is handed to
``emit_json``, and printed inside the envelope when the run ends (cli/envelope.py).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import typer
from rich.console import Console

from ddtree_deploy.base.errors import EXIT_BAD_INPUT, EXIT_FAILED, BadInput, Changed, DeployError
from ddtree_deploy.cli import envelope

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
    # The root click group owns each run: with --json it prints the one envelope (also on
    # usage errors and crashes) once the exit code is known.
    cls=envelope.EnvelopeGroup,
    # -h as well as --help (the help option itself is made in cli/help_text.py).
    context_settings={"help_option_names": ["--help", "-h"]},
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


def _stderr_width() -> int | None:
    """The columns a line on stderr may take: COLUMNS, else the terminal's; None for a log."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stderr.isatty():
        import shutil

        return shutil.get_terminal_size().columns
    return None


def result_width() -> int | None:
    """The columns a result line on stdout may take: the terminal's (or COLUMNS); None for a
    pipe or a log, where each line stays whole (for grep)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        import shutil

        return shutil.get_terminal_size().columns
    return None


def say(line: str) -> None:
    """One result line on stdout, as plain text (host text inert: no markup; control
    characters, a newline too, shown as ``\\x0a``: host text never starts a line of its own),
    fitted to the terminal: broken between words, never mid-hash (cli/text.py)."""
    from ddtree_deploy.cli.text import fit, plain

    for part in fit(plain(line), result_width()):
        out.print(part, markup=False, highlight=False, emoji=False)


def emit_json(document: Any) -> None:
    """Hand the run's result document to the envelope (the ``--json`` contract, docs/json.md).

    Nothing is printed here: the root group prints one envelope -- ``schema``, ``command``,
    ``ok``, ``exit_code``, ``error``, ``hosts`` and this document's fields -- when the command
    has ended, so its exit code is the real one. Call it at most once per run. Outside a CLI
    run (library use) the document is printed at once, enveloped, exit code from its ``ok``.
    """
    run = envelope.current()
    if run is not None:
        run.record(document)
        return
    doc = document if isinstance(document, dict) else {"result": document}
    envelope.write(envelope.envelope(doc, command=str(doc.get("command", "")),
                                     exit_code=0 if doc.get("ok", True) is not False else EXIT_FAILED))


def emit_host(name: str, document: dict, *, ok: bool = True) -> None:
    """A one-host command's result as the ``--json`` document: the host's entry in ``hosts``
    (``host``, ``ok`` and the command's fields), the shape every host command gives, one host
    or many (docs/json.md)."""
    emit_json({"hosts": [{"host": name, "ok": ok, **{k: v for k, v in document.items() if k not in ("host", "ok")}}]})


def say_error(console: Console, message: str, hint: str | None, *, internal: bool = False,
              fields: dict | None = None, folder: object = None) -> None:
    """The one-line error on stderr, then (``fields``: the envelope's ``error`` object) the line
    saying where it failed and what it left on the host (cli/failure_line.py; ``folder``: the
    command's ``-i DIR``, for the command it names), then its hint; host text inert."""
    from ddtree_deploy.cli.failure_line import failure_lines

    label = "internal error:" if internal else "error:"
    console.print(f"[bold red]{label}[/] {_escape(message)}", highlight=False, soft_wrap=True)
    if fields:
        from ddtree_deploy.cli.text import fit, plain

        for line in failure_lines(message, host=fields.get("host"), step=fields.get("step"),
                                  changed=fields.get("changed") or "maybe", hint=hint, folder=folder):
            # Broken between words at a terminal's width (as result lines are), whole in a log.
            for part in fit(plain(line), _stderr_width()):
                console.print(_escape(part), highlight=False, soft_wrap=True)
    if hint:
        console.print(f"[dim]hint:[/] {_escape(hint)}", highlight=False, soft_wrap=True)


def handles_errors(fn: Callable) -> Callable:
    """Map errors to one line on stderr (and the envelope's ``error`` with --json) and an exit code.

    DeployError: its message, the line its host, step and ``changed`` make
    (cli/failure_line.py), its hint and exit code; with --json its ``to_json`` error. Ctrl-C:
    exit 130. Any other exception is a bug: one line (its type and text) and a hint, exit 1; ``DDTREE_DEPLOY_DEBUG=1`` re-raises
    it for the traceback. A command with ``-i/--inventory DIR`` (its ``inventory`` argument)
    reads its host files from DIR.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from ddtree_deploy.settings.inventory import inventory_folder

        run = envelope.current()
        if run is not None:
            run.note_command(kwargs)
        try:
            with inventory_folder(kwargs.get("inventory")):  # -i DIR: the command's host files
                return fn(*args, **kwargs)
        except DeployError as exc:
            error = exc.to_json()["error"]
            if run is not None:
                run.error = error
            elif kwargs.get("json_output"):  # not under the CLI's group: print the envelope now
                envelope.write(envelope.envelope(None, command="", exit_code=exc.exit_code, error=error))
            say_error(err, exc.message, exc.hint, fields=error, folder=kwargs.get("inventory"))
            raise typer.Exit(exc.exit_code)
        except typer.Exit:  # typer's own exit is a RuntimeError subclass: let it through
            raise
        except KeyboardInterrupt as exc:
            error = interrupted_error(exc)
            if run is not None:
                run.error = error
            say_error(err, error["message"], error["hint"])
            raise typer.Exit(envelope.EXIT_INTERRUPTED)
        except Exception as exc:
            if os.environ.get(envelope.DEBUG_ENV):
                raise
            error = envelope.internal_error(exc)
            if run is not None:
                run.error = error
            say_error(err, error["message"], error["hint"], internal=True)
            raise typer.Exit(EXIT_FAILED)

    return wrapper


def interrupted_error(exc: BaseException) -> dict:
    """Ctrl-C or SIGTERM as the envelope's error: one line per host that was waiting (what it
    waited for, what that leaves on the host, what to run next: ``inflight``)."""
    from ddtree_deploy.remote import inflight

    how = "SIGTERM" if isinstance(exc, inflight.Terminated) else "Ctrl-C"
    notes = inflight.notes()
    message = f"interrupted ({how})" + (": " + "; ".join(notes) if notes else "")
    hint = None if notes else "nothing was waiting on a host; rerun the command"
    # MAYBE: a Ctrl-C can land after a write was sent, between two waits as well as during one.
    return envelope.error_doc(inflight.CODE, message, hint, changed=Changed.MAYBE)


def _escape(text: str) -> str:
    from ddtree_deploy.cli.text import safe  # host text in messages: no markup, no control characters

    return safe(text)


__all__ = [
    "app",
    "err",
    "out",
    "emit_host",
    "emit_json",
    "handles_errors",
    "result_width",
    "say",
    "say_error",
    "BadInput",
    "DeployError",
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
]
