"""Options several commands share, written once: which hosts (``--host``, ``--group``) and
where their files are (``-i/--inventory DIR``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

HOST_HELP = ("inventory name (NAME.toml in the inventory folder; `hosts list` shows them), a .toml path, "
             "or 'local' (this machine)")
HOSTS_HELP = HOST_HELP + "; repeatable"
GROUP_HELP = "host group from the inventory folder's groups.toml (its members, in order); repeatable"
INVENTORY_HELP = ("the inventory folder to read host files from (default: DDTREE_DEPLOY_HOSTS, a checkout's "
                  "hosts/, else ~/.config/ddtree-deploy/hosts; `hosts list` says which)")


def inventory_option() -> Optional[Path]:
    """``-i/--inventory DIR``: ``cli.app.handles_errors`` reads hosts from it for the command."""
    return typer.Option(None, "--inventory", "-i", help=INVENTORY_HELP, metavar="DIR")


__all__ = ["GROUP_HELP", "HOSTS_HELP", "HOST_HELP", "INVENTORY_HELP", "inventory_option"]
