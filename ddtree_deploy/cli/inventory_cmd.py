"""`ddtree-deploy inventory from-ansible PATH`: an Ansible inventory into hosts/*.toml + groups.toml.

An import command rather than a live ``--inventory ansible:PATH`` source: the files it
writes are plain inventory files that every command (push, status, rollback, fleets,
smoke) reads unchanged, they can be reviewed and committed, and ansible-core is needed
only at import time (the optional ``ddtree-deploy[ansible]`` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, say
from ddtree_deploy.cli.options import inventory_option
from ddtree_deploy.cli.text import safe

inventory_app = typer.Typer(help="Import host inventories from other tools.", no_args_is_help=True)
app.add_typer(inventory_app, name="inventory")


@inventory_app.command("from-ansible")
@handles_errors
def from_ansible(
    source: str = typer.Argument(..., help="Ansible inventory: INI or YAML file, or a folder (group_vars/, host_vars/)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="folder to write <host>.toml and groups.toml into "
                                           "(default: the inventory folder, -i DIR if given)"),
    inventory: Optional[Path] = inventory_option(),
    limit: Optional[str] = typer.Option(None, "--limit", help="an Ansible host pattern (e.g. 'gpu:!canary')"),
    force: bool = typer.Option(False, "--force", help="replace host files that already exist"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Read an Ansible inventory with ansible-core's own loader and write the toolkit's host files."""
    from ddtree_deploy.interop.ansible_inventory import read_inventory, write_hosts
    from ddtree_deploy.settings.inventory import hosts_dir, parse_host

    imported = read_inventory(source, limit=limit)
    for name, text in imported.hosts.items():  # every file valid before any is written
        parse_host(text, name=name, source=f"{source}: host {name}")
    target = out_dir or hosts_dir()
    written = write_hosts(imported, target, force=force)
    if json_output:
        # "imported_hosts", not "hosts": the envelope's "hosts" are the hosts a command worked on (none here).
        emit_json({"source": source, "out": str(target), "imported_hosts": list(imported.hosts),
                   "groups": imported.groups, "written": [str(p) for p in written]})
        return
    err.print(f"[dim]{safe(source)}: {len(imported.hosts)} host(s), {len(imported.groups)} group(s)[/]",
              highlight=False)
    for path in written:
        say(str(path))


__all__ = ["from_ansible"]
