"""The one JSON document of a ``--json`` run (docs/json.md, docs/json-schema.json).

Every ``ddtree-deploy ... --json`` run prints exactly one JSON object on stdout:

    {"schema": "ddtree-deploy/2", "command": "lock status", "ok": true, "exit_code": 0,
     "error": null, "hosts": [{"host": "ct200", "ok": true}], ...the command's own fields...}

How: the run's document is not printed where a command produces it. ``emit_json`` (cli/app.py)
records it in the run's holder (``Run``); ``handles_errors`` records the error that ended the
command; the root click group (``EnvelopeGroup``) owns the run, so it sees what no command body
sees -- usage errors (click parses before any body runs), the exit code a command raises *after*
it emitted (``check``, ``matrix``, ``port``, a failed smoke), crashes outside a body -- and
prints the one envelope when the command has ended, with the real exit code.

The group is the app's own click class (``typer.Typer(cls=EnvelopeGroup)``), so the console
script and typer's ``CliRunner`` (which calls the same ``main``) behave alike.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from typer.core import TyperGroup

try:  # newer typer carries its own copy of click: its groups raise that copy's exceptions
    from typer._click.core import Context
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # older typer runs on click itself
    from click import ClickException, Context, UsageError  # type: ignore[no-redef]
from typer.exceptions import Abort

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import Changed

SCHEMA = "ddtree-deploy/2"
#: The envelope's own keys, in print order; a command's fields follow them.
ENVELOPE_KEYS = ("schema", "command", "ok", "exit_code", "error", "hosts")
EXIT_INTERRUPTED = 130
DEBUG_ENV = "DDTREE_DEPLOY_DEBUG"
INTERNAL_HINT = f"a bug in ddtree-deploy: rerun with {DEBUG_ENV}=1 for the traceback, and report it"


def error_doc(code: str, message: str, hint: str | None = None, *, changed: Changed, host: str | None = None,
              step: str | None = None, evidence: dict | None = None) -> dict:
    """The envelope's ``error`` for a failure that is no DeployError (those give their own,
    ``DeployError.to_json``): the same seven keys. ``changed`` has no default: each maker says
    what it knows of the host."""
    return {"code": code, "message": message, "hint": hint, "host": host, "step": step, "changed": changed.value,
            "evidence": evidence or {}}


def internal_error(exc: BaseException) -> dict:
    """An unexpected exception as one line: its type and the first line of its text. ``changed``
    is MAYBE: a bug can strike after a session sent a write, and nothing here knows whether one did."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if len(line) > 300:
        line = line[:297] + "..."
    return error_doc("internal", line, INTERNAL_HINT, changed=Changed.MAYBE)


@dataclass
class Run:
    """What one CLI run will print as its envelope. ``json`` starts as "--json is in argv"
    (all a usage error leaves to go by) and becomes the command's own parsed ``--json``
    value once its body starts (``note_command``)."""

    command: str
    json: bool = True
    doc: dict | None = None
    error: dict | None = None
    host_arg: str | None = None  # the one --host given, for an error that came before any host document

    def record(self, document: Any) -> None:
        # At most one emit per run (CONTRACTS.md); a second one's keys win rather than losing a result.
        if not isinstance(document, dict):
            document = {"result": document}
        self.doc = {**(self.doc or {}), **document}

    def note_command(self, kwargs: dict) -> None:
        """Called when a command body starts: its real --json value and its one --host, if any."""
        if "json_output" in kwargs:
            self.json = bool(kwargs["json_output"])
        host, groups = kwargs.get("host"), kwargs.get("group")
        if isinstance(host, str):
            self.host_arg = host
        elif isinstance(host, (list, tuple)) and len(host) == 1 and not groups:
            self.host_arg = host[0]

    def envelope(self, exit_code: int) -> dict:
        return envelope(self.doc, command=self.command, exit_code=exit_code, error=self.error,
                        host_arg=self.host_arg)


def envelope(doc: dict | None, *, command: str, exit_code: int, error: dict | None = None,
             host_arg: str | None = None) -> dict:
    """Wrap a command's document (or none) into the envelope.

    ``ok`` is ``exit_code == 0`` and ``error`` is null exactly when ok: a run that failed
    without an exception (a failed hunk, a failed smoke level, a host of a fleet) gets a
    ``failed`` error summarising it. ``hosts``: the document's own per-host list; else its one
    ``host``; else, for an error before any document, the one ``--host`` given; else [].
    """
    body = dict(doc or {})
    ok = exit_code == 0
    if ok:
        error = None
    hosts = body.pop("hosts", None)
    if hosts is None:
        hosts = _one_host(body, ok, error, host_arg)
    hosts = [_host_entry(h, ok) for h in hosts]
    if not ok and error is None:
        error = _summary_error(command, exit_code, hosts)
    for key in ENVELOPE_KEYS:  # a command's own "ok"/"command"/"exit_code" meant the same: the envelope's win
        body.pop(key, None)
    head = {"schema": SCHEMA, "command": command, "ok": ok, "exit_code": exit_code, "error": error,
            "hosts": hosts}
    return {**head, **body}


def _one_host(body: dict, ok: bool, error: dict | None, host_arg: str | None) -> list:
    name = body.get("host") if isinstance(body.get("host"), str) else None
    if name is not None:
        host_ok = body["ok"] if isinstance(body.get("ok"), bool) else ok
    elif host_arg is not None:  # an error before any document, or snapshot pull (no "host" key of its own)
        name, host_ok = host_arg, ok
    else:
        return []
    entry = {"host": name, "ok": host_ok}
    if not host_ok and error is not None:
        entry["error"] = error
    return [entry]


def _host_entry(h: Any, ok: bool) -> dict:
    if not isinstance(h, dict):  # never expected: every per-host list holds objects
        return {"host": str(h), "ok": ok}
    if "ok" in h and "host" in h:
        return h
    entry = dict(h)
    entry.setdefault("host", "?")
    entry.setdefault("ok", not entry.get("error"))
    return entry


def _summary_error(command: str, exit_code: int, hosts: list) -> dict:
    if exit_code == EXIT_INTERRUPTED:
        return error_doc("interrupted", "interrupted (Ctrl-C)", changed=Changed.MAYBE)
    bad = [h for h in hosts if not h.get("ok")]
    if bad:
        def why(h: dict) -> str:
            return h.get("outcome") or (h.get("error") or {}).get("message") or "not ok"

        shown = "; ".join(f"{h.get('host')}: {why(h)}" for h in bad[:5]) + ("; ..." if len(bad) > 5 else "")
        return error_doc("failed", f"{command}: {len(bad)} of {len(hosts)} host(s) not ok: {shown}",
                         changed=most_changed(bad))
    # No host failed (a failed check, matrix or port works on no host): no host was changed.
    return error_doc("failed", f"{command or 'ddtree-deploy'} failed (exit {exit_code}); its fields say why",
                     changed=Changed.NO)


_CHANGED_ORDER = (Changed.NO, Changed.MAYBE, Changed.YES)


def most_changed(hosts: list) -> Changed:
    """The failed hosts' ``changed`` together: the most any of them says (yes over maybe over
    no); a host whose entry carries no ``error.changed`` (a failed smoke, a host that needs
    attention) counts as maybe: nothing says it was left untouched."""
    said = []
    for h in hosts:
        value = (h.get("error") or {}).get("changed") if isinstance(h.get("error"), dict) else None
        said.append(Changed(value) if value in {c.value for c in Changed} else Changed.MAYBE)
    return max(said, key=_CHANGED_ORDER.index, default=Changed.NO)


def write(document: dict) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- the run holder

_current: Run | None = None


def current() -> Run | None:
    return _current


def json_requested(argv: Sequence[str]) -> bool:
    """``--json`` among the options (before a ``--``); ``--help`` (``-h``) wins: it prints help, no JSON."""
    from ddtree_deploy.cli.help_text import HELP_NAMES

    args = list(argv)
    if "--" in args:
        args = args[:args.index("--")]
    return "--json" in args and not any(name in args for name in HELP_NAMES)


def command_words(root: Any, argv: Sequence[str]) -> str:
    """The command path the words in ``argv`` name ("snapshot pull"); an unknown word is kept
    (it is what the usage error is about) and ends the walk."""
    words: list[str] = []
    node = root
    for arg in argv:
        if arg == "--":
            break
        if arg.startswith("-"):
            continue  # group-level options take no value (--version, --help)
        words.append(arg)
        sub = _subcommands(node).get(arg)
        if sub is None or not _subcommands(sub):
            break
        node = sub
    return " ".join(words)


def _subcommands(node: Any) -> dict:
    return getattr(node, "commands", None) or {}  # a group's; a leaf command has none


class EnvelopeGroup(TyperGroup):
    """The app's root group: with ``--json``, every run ends in exactly one envelope.

    Built (by typer, with every command below it) once per run; its help screens are made
    plain text, with ``-h`` (cli/help_text.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from typer import core as typer_core

        from ddtree_deploy.cli.help_text import tidy

        super().__init__(*args, **kwargs)
        tidy(self, markup=typer_core.HAS_RICH and self.rich_markup_mode == "rich")

    def get_params(self, ctx: Context) -> list:
        from ddtree_deploy.cli.help_text import blank_flag

        params = super().get_params(ctx)
        for param in params:  # typer adds its completion flags after the group is built
            blank_flag(param)
        return params

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        from ddtree_deploy.remote import inflight

        inflight.reset()
        with inflight.terminate_as_interrupt():  # SIGTERM ends a run as Ctrl-C does (exit 130)
            return self._main(argv, prog_name, complete_var, standalone_mode, extra)

    def _main(self, argv: list[str], prog_name, complete_var, standalone_mode: bool, extra: dict) -> Any:
        if not json_requested(argv) or any(k.endswith("_COMPLETE") for k in os.environ):
            return super().main(args=argv, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=standalone_mode, **extra)
        global _current
        run, previous = Run(command_words(self, argv)), _current
        _current = run
        crash: BaseException | None = None
        try:
            code = self._invoke_json(run, argv, prog_name, complete_var, extra)
        except Exception as exc:  # escaped every handler: DDTREE_DEPLOY_DEBUG, or outside a command body
            run.error = run.error or internal_error(exc)
            code, crash = 1, exc
        finally:
            _current = previous
        if run.json:
            write(run.envelope(code))
        if crash is not None:
            if os.environ.get(DEBUG_ENV):
                raise crash
            _say_internal(run.error)
        if standalone_mode:
            sys.exit(code)
        return code

    def _invoke_json(self, run: Run, argv: list[str], prog_name, complete_var, extra) -> int:
        from typer import core as typer_core

        rich = typer_core.HAS_RICH and self.rich_markup_mode is not None
        try:
            rv = super().main(args=argv, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                              **extra)
            # Non-standalone click returns a raised Exit's code, else the body's return value (None).
            return rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except ClickException as exc:
            # As typer shows it (usage and the error, on stderr), then the envelope.
            if rich:
                from typer import rich_utils

                rich_utils.rich_format_error(exc)
            else:
                exc.show()
            code = Code.USAGE if isinstance(exc, UsageError) else Code.FAILED
            hint = f"see {_help_for(getattr(exc, 'ctx', None))}" if code == Code.USAGE else None
            # Usage errors come from click's parser, before any command body: nothing ran.
            changed = Changed.NO if code == Code.USAGE else Changed.MAYBE
            run.error = error_doc(code, exc.format_message(), hint, changed=changed)
            return exc.exit_code
        except Abort:
            if rich:
                from typer import rich_utils

                rich_utils.rich_abort_error()
            else:
                sys.stderr.write("Aborted!\n")
            run.error = error_doc("aborted", "aborted", changed=Changed.MAYBE)  # click's Abort: a Ctrl-C too
            return 1
        except SystemExit as exc:  # a broken pipe (click exits 1), or code that called sys.exit
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def _help_for(ctx: Context | None) -> str:
    """``ddtree-deploy [the recognised command] --help``."""
    words = []
    while ctx is not None and ctx.parent is not None:
        words.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["ddtree-deploy", *words, "--help"])


def _say_internal(error: dict | None) -> None:
    from ddtree_deploy.cli.app import err, say_error

    say_error(err, (error or {}).get("message", "internal error"), (error or {}).get("hint"), internal=True)


__all__ = ["SCHEMA", "ENVELOPE_KEYS", "EnvelopeGroup", "Run", "current", "envelope", "error_doc",
           "internal_error", "json_requested", "most_changed", "command_words", "write"]
