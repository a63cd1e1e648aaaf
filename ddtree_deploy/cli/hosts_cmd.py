"""`ddtree-deploy hosts list | init NAME`: which hosts the toolkit knows, and a new host's file.

Both work on the inventory folder every host command reads (``-i DIR``, else
DDTREE_DEPLOY_HOSTS, a checkout's hosts/, else ~/.config/ddtree-deploy/hosts:
ddtree_deploy/base/locations.py), so an installed toolkit needs no checkout to start from.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ddtree_deploy.base import next_step
from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, say
from ddtree_deploy.cli.options import inventory_option
from ddtree_deploy.cli.text import safe

hosts_app = typer.Typer(help="List the hosts of the inventory folder, or write a new host's file.",
                        no_args_is_help=True)
app.add_typer(hosts_app, name="hosts")

JSON_HELP = "print one JSON document on stdout"


def _target(h) -> str:
    if h.ssh is None:
        return "local"
    s = h.ssh
    return f"ssh {(s.user + '@') if s.user else ''}{s.host}{f':{s.port}' if s.port else ''}" + (
        f" via {s.jump}" if s.jump else "")


def _entry(item) -> dict:
    h = item.host
    if h is None:
        return {"name": item.name, "file": str(item.path), "ok": False, "error": item.error.to_json()["error"]}
    levels = h.smoke.get("levels") if isinstance(h.smoke.get("levels"), list) else None
    from ddtree_deploy.fleets.host_check import unused_analysis

    return {"name": item.name, "file": str(item.path), "ok": True, "error": None, "target": _target(h),
            "python": h.python, "state_dir": h.state_dir, "smoke_levels": levels, "serve": bool(h.serve),
            "warning": unused_analysis(h)}


@hosts_app.command("list")
@handles_errors
def list_hosts(
    inventory: Optional[Path] = inventory_option(),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """The host files of the inventory folder, each read and checked, and its groups.

    Exit 2 when a host file (or groups.toml) is broken: it is listed with its error, the others as usual.
    """
    from ddtree_deploy.base.locations import example_inventory, hosts_origin
    from ddtree_deploy.fleets.host_check import check_tables, group_problem
    from ddtree_deploy.settings.inventory import chosen_folder, hosts_dir, list_inventory, load_groups

    folder = hosts_dir()
    origin = "-i" if chosen_folder() is not None else hosts_origin()
    listed = []
    for item in list_inventory(folder):  # the file, then the tables push checks: one validator for both
        if item.host is not None:
            try:
                check_tables(item.host)
            except BadInput as exc:
                item = replace(item, host=None, error=exc)
        listed.append(item)
    entries = [_entry(item) for item in listed]
    broken = [item.error for item in listed if item.error is not None]
    try:
        groups, groups_error = {k: list(v) for k, v in load_groups(folder).items()}, None
    except BadInput as exc:
        groups, groups_error = {}, exc
    errors = {item.name: item.error for item in listed}
    group_errors = {name: group_problem(name, members, errors) for name, members in groups.items()}
    groups_error = groups_error or next((e for e in group_errors.values() if e is not None), None)
    if json_output:
        emit_json({"folder": str(folder), "origin": origin, "inventory": entries, "groups": groups,
                   "broken_groups": {k: e.message for k, e in group_errors.items() if e is not None},
                   "example": str(example_inventory())})
    else:
        say(f"inventory folder: {folder} ({origin}): {len(entries)} host file(s)")
        width = max((len(e["name"]) for e in entries), default=0)
        for e in entries:
            if e["ok"]:
                levels = ", ".join(e["smoke_levels"] or ["compile", "import", "cli"])
                say(f"  {e['name']:<{width}}  {e['target']}  python {e['python']}  smoke {levels}"
                    + ("  [serve]" if e["serve"] else ""))
                if e["warning"]:
                    say(f"  {'':<{width}}  WARNING: {e['warning']}")
            else:
                say(f"  {e['name']:<{width}}  BROKEN: {e['error']['message']}")
        for name, members in groups.items():
            problem = group_errors[name]
            say(f"  group {name}: {', '.join(members)}" + (f"  BROKEN: {problem.message}" if problem else ""))
        if not entries:
            err.print(f"[dim]no host file here yet: write one with {safe(next_step.hosts_init('NAME', chosen_folder()))}"
                      f" (a commented file; an example: {safe(str(example_inventory()))})[/]", highlight=False)
    problem = groups_error or (broken[0] if broken else None)
    if problem is not None:  # listed first, then the first broken file is the run's error (exit 2)
        raise BadInput(problem.message, hint="fix it: the commands that use it refuse it the same way"
                                             + (f" ({len(broken)} broken host files)" if len(broken) > 1 else ""))


@hosts_app.command("init")
@handles_errors
def init_host(
    name: str = typer.Argument(..., help="the host's name: its file is NAME.toml in the inventory folder"),
    ssh_host: Optional[str] = typer.Option(None, "--ssh-host", help="hostname or ~/.ssh/config alias (default: NAME)"),
    user: Optional[str] = typer.Option(None, "--user", help="SSH user (default: ~/.ssh/config's, else yours)"),
    port: Optional[int] = typer.Option(None, "--port", help="SSH port (default: ~/.ssh/config's, else 22)"),
    python: Optional[str] = typer.Option(None, "--python", help="the host's interpreter that imports sglang"),
    state_dir: Optional[str] = typer.Option(None, "--state-dir", help="the host's state folder "
                                            "(default: ~/.ddtree-deploy)"),
    local: bool = typer.Option(False, "--local", help="this machine itself (transport local, no [ssh])"),
    force: bool = typer.Option(False, "--force", help="replace the host's file if it exists"),
    inventory: Optional[Path] = inventory_option(),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Write a commented host file (every key, the given values filled in) where host commands read it."""
    from ddtree_deploy.base.fsutil import atomic_write, require_writable_folder
    from ddtree_deploy.settings.host_template import render
    from ddtree_deploy.settings.inventory import (
        GROUPS_FILE,
        chosen_folder,
        host_file_name_problem,
        hosts_dir,
        list_inventory,
        parse_host,
        same_machine,
    )

    problem = host_file_name_problem(name)
    if problem or name == GROUPS_FILE[:-5]:
        raise BadInput(f"hosts init {name!r}: " + (problem or f"reserved ({GROUPS_FILE} holds the groups)"))
    if local and (ssh_host or user or port):
        raise BadInput("--local takes no --ssh-host, --user or --port (a local host has no [ssh] table)")
    folder = hosts_dir()
    path = folder / f"{name}.toml"
    if path.exists() and not force:
        raise BadInput(f"{path}: already exists; nothing was written", hint="pass --force to replace it")
    text = render(name, ssh_host=ssh_host, user=user, port=port, python=python, state_dir=state_dir, local=local)
    new = parse_host(text, name=name, source=f"{path} (as hosts init would write it)")  # a bad value: named
    siblings = same_machine(new, list_inventory(folder))
    twin = next((h for h in siblings if h.python == new.python), None)
    if twin is not None:
        # One install under two names: a fleet would push it twice and each name's history
        # would tell half of it. Another interpreter there is another install: fine.
        raise BadInput(f"{path}: {twin.source} already names this machine and this interpreter ({new.python}); "
                       "nothing was written", hint=f"use host {twin.name}, or give the other install's "
                       "interpreter with --python")
    require_writable_folder(folder, "--inventory" if chosen_folder() is not None else "the inventory folder")
    atomic_write(path, text.encode())
    if json_output:
        emit_json({"folder": str(folder), "file": str(path), "name": name})
        return
    say(str(path))
    if siblings:  # several installs on one machine: each keeps its own state (hostprog/roots.py)
        err.print(f"[dim]the same machine as {safe(', '.join(h.name for h in siblings))}, another interpreter: "
                  "each install keeps its own lock, journal and backups in the state folder[/]", highlight=False)
    # Only where the template left an example value to replace (no --python, no --ssh-host).
    todo = "edit the values marked EDIT, then check it" if "# EDIT: " in text else "check it"
    err.print(f"[dim]{todo}: {safe(next_step.status(name, chosen_folder()))}[/]", highlight=False)


__all__ = ["hosts_app"]
