"""`ddtree-deploy history`: the host's append-only audit history, newest first."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.cli.app import app, emit_host, handles_errors, say
from ddtree_deploy.cli.options import HOST_HELP, inventory_option


@app.command("history")
@handles_errors
def history(
    host: str = typer.Option(..., "--host", "-H", help=HOST_HELP),
    inventory: Optional[Path] = inventory_option(),
    limit: int = typer.Option(20, "--limit", "-n", help="print the newest N entries (1-10000)"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Who pushed, rolled back, marked or broke the lock on a host, from where, when, with what.

    Read from the history.jsonl of the host file's install in <state_dir> on the host (read-only; takes no lock).
    """
    from ddtree_deploy.remote.transport import transport_for
    from ddtree_deploy.session import hostlog
    from ddtree_deploy.settings.inventory import load_host

    if not 1 <= limit <= 10000:
        raise BadInput(f"--limit {limit}: give a number from 1 to 10000")
    h = load_host(host)
    doc = hostlog.history(h, transport_for(h, trust_new_host=trust_new_host), limit)
    if json_output:
        emit_host(h.name, doc)
        return
    shown = len(doc["entries"])
    say(f"{h.name}: {shown} of {doc['total']} history entries, newest first")
    for e in doc["entries"]:
        say("  " + hostlog.entry_line(e) + _speed_words(e))
    if doc["unreadable"]:
        say(f"  ({doc['unreadable']} unreadable line(s) skipped: torn by a crash or a full disk)")


def _speed_words(e: dict) -> str:
    """A ``speed`` entry's figures (the speed gate's before/after, serve/bake.py), or ""."""
    if not isinstance(e.get("speed"), dict):
        return ""
    from ddtree_deploy.serve.bake import entry_words

    try:
        return "  " + entry_words(e["speed"])
    except (TypeError, ValueError, KeyError, AttributeError):  # another agent's entry: said, not trusted
        return "  (speed figures unreadable)"


__all__ = ["history"]
