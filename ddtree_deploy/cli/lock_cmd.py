"""`ddtree-deploy lock status|release`: the host's deploy lock (Kamal's ``lock``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddtree_deploy.cli.app import app, emit_host, err, handles_errors, say
from ddtree_deploy.cli.options import HOST_HELP, inventory_option
from ddtree_deploy.cli.text import safe

lock_app = typer.Typer(
    name="lock",
    help="Show or release a host's deploy lock.",
    no_args_is_help=True,
)
app.add_typer(lock_app, name="lock")

TRUST_HELP = "record an unknown host key in known_hosts"
JSON_HELP = "print one JSON document on stdout"


def _host(name: str, trust_new_host: bool):
    from ddtree_deploy.remote.transport import transport_for
    from ddtree_deploy.settings.inventory import load_host

    h = load_host(name)
    return h, transport_for(h, trust_new_host=trust_new_host)


@lock_app.command("status")
@handles_errors
def status(
    host: str = typer.Option(..., "--host", "-H", help=HOST_HELP),
    inventory: Optional[Path] = inventory_option(),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help=TRUST_HELP),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Who holds the deploy lock, since when, for which run and command, and whether provably stale."""
    from ddtree_deploy.session import hostlog

    h, transport = _host(host, trust_new_host)
    doc = hostlog.lock_status(h, transport)
    if json_output:
        emit_host(h.name, doc)
        return
    say(hostlog.lock_line(h.name, doc["lock"]))
    tune = doc.get("tune_lock")
    if tune:
        say(f"{h.name}: a tune is running (run {tune.get('run_id', '?')}, pid {tune.get('pid', '?')})")


@lock_app.command("release")
@handles_errors
def release(
    host: str = typer.Option(..., "--host", "-H", help=HOST_HELP),
    inventory: Optional[Path] = inventory_option(),
    force: bool = typer.Option(False, "--force",
                               help="release a lock whose process may still run (you know it is gone)"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help=TRUST_HELP),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Release the deploy lock: only a provably stale one unless --force. Written to the history.

    Exit 1 when the lock's process may still run and --force is not given.
    """
    from ddtree_deploy.session import hostlog

    h, transport = _host(host, trust_new_host)
    doc = hostlog.lock_release(h, transport, force)
    if json_output:
        emit_host(h.name, doc)
        return
    if not doc["released"]:
        say(f"{h.name}: lock free; nothing to release")
    else:
        say(f"{h.name}: released the lock of run {doc['lock'].get('run_id', '?')} by {doc['lock'].get('holder', '?')}")
    if doc.get("history_warning"):
        err.print(f"[yellow]warning:[/] {safe(doc['history_warning'])}", highlight=False)


__all__ = ["lock_app"]
